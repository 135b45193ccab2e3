"""The JSON the store writes: `dumps` for any value, `dumps_state` (orjson's, faster) for the
node states and events written for every node of every run."""

from __future__ import annotations

from typing import Any

import orjson

from .._internal.jsontext import encoder

__all__ = ["dumps", "dumps_state"]

# Built once: json.dumps with arguments builds an encoder on every call.
_encode = encoder(ensure_ascii=False, default=str)
_encode_ascii = encoder(ensure_ascii=True, default=str)


def dumps(value: Any) -> str:
    text = _encode(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:   # lone surrogates: SQLite refuses them, \u escapes keep them
            text = _encode_ascii(value)
    return text


def _not_native(value: Any) -> Any:
    raise TypeError(type(value).__name__)


# What orjson writes other than json would (datetimes, dataclasses) goes to dumps instead.
_STATE_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def dumps_state(value: Any) -> str:
    """JSON of a node's state or of a commit's events, written for every node of every
    run: orjson's, a tenth of `dumps`'s time (json's float formatting alone is ~0.5 µs a
    number, six a node). The same values once parsed, with compact separators; what orjson
    refuses (a lone surrogate, a key that is not a string, an integer over 64 bits, a type
    json writes with str()) is `dumps`'s. Only NaN and infinities differ: orjson writes
    null (a node's own numbers are never either: prices, token counts and estimates are
    checked finite; one anywhere else in a row would read back as None)."""
    try:
        return orjson.dumps(value, default=_not_native, option=_STATE_OPTIONS).decode()
    except TypeError:   # orjson.JSONEncodeError is one
        return dumps(value)
