"""What a call is keyed and logged as: its cache key, and the JSON of its messages and
parameters (dumped once per call for the key, the check and the log row), with lone
surrogates replaced so that SQLite, nbformat and file writers accept every text."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from .._internal.jsontext import encoder

__all__ = ["cache_key", "dump_messages", "dump_params", "valid_unicode"]

_SURROGATE = re.compile("[\ud800-\udfff]")


def cache_key(identity: str, model: str, messages: list, params: dict, *,
              messages_json: str | None = None, params_json: str | None = None) -> str:
    """SHA-256 of the JSON of [identity, model, messages, params] (sorted keys).

    `messages_json` is `dump_messages(messages)[1]` and `params_json` is `dump_params(params)`
    when the caller has them: the blob is then joined from the parts, byte for byte the dump
    of the whole list (a list's items are encoded one by one and joined with ", "), so stored
    keys still match."""
    if messages_json is None:
        blob = json.dumps([identity, model, messages, params], sort_keys=True, ensure_ascii=False)
    else:
        blob = (f"{_key_head(identity, model)}{messages_json}, "
                f"{params_json if params_json is not None else dump_params(params)}]")
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()   # lone ones too


@functools.lru_cache(maxsize=64)
def _key_head(identity: str, model: str) -> str:
    return f"[{json.dumps(identity, ensure_ascii=False)}, {json.dumps(model, ensure_ascii=False)}, "


# json.dumps(value, sort_keys=True, ensure_ascii=False), byte for byte, with the encoder
# built once instead of per call.
_sorted_json = encoder(sort_keys=True, ensure_ascii=False)


def dump_params(params: dict) -> str:
    """A call's parameters as they enter its cache key and its log row."""
    return _sorted_json(params)


def dump_messages(messages: list) -> tuple[list, str]:
    """(messages, their JSON with sorted keys), lone surrogates as U+FFFD in both (see
    `valid_unicode`). One dump per call serves the check, the cache key and the log row."""
    text = _sorted_json(messages)
    if text.isascii():
        return messages, text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:   # in JSON text they can only be inside strings
        text = _SURROGATE.sub("\ufffd", text)
        messages = json.loads(text)
    return messages, text


def valid_unicode(value: Any) -> Any:
    """Lone surrogates (a "\\ud800" escape in a reply or in its JSON) as U+FFFD: SQLite,
    nbformat and file writers refuse them, so one bad character would crash the run."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if text.isascii():   # (most answers: no encoding to check)
        return value
    try:
        text.encode("utf-8")
        return value
    except UnicodeEncodeError:   # in JSON text they can only be inside strings
        text = _SURROGATE.sub("\ufffd", text)
        return text if isinstance(value, str) else json.loads(text)

