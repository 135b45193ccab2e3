"""JSON text of a value, byte for byte `json.dumps`'s, without its cost per call.

`json.JSONEncoder.encode` builds a new C encoder (and a float formatter and a dict of
seen containers) on every call: ~1.3 µs, more than encoding a small dict takes. The store
and the LLM door encode several values per model call (the messages, the parameters, the
reply, the node's row, its events), so `encoder()` builds the C encoder once and reuses it.
Without the dict of seen containers a value that contains itself recurses instead of
raising; that rare case goes to `json`'s own encoder, which says "Circular reference".
"""

from __future__ import annotations

import json
from json import encoder as _json_encoder
from typing import Any, Callable

__all__ = ["encoder"]


def encoder(*, sort_keys: bool = False, ensure_ascii: bool = True,
            default: Callable[[Any], Any] | None = None) -> Callable[[Any], str]:
    """A function returning `json.dumps(value, sort_keys=..., ensure_ascii=..., default=...)`."""
    slow = json.JSONEncoder(sort_keys=sort_keys, ensure_ascii=ensure_ascii, default=default).encode
    make = _json_encoder.c_make_encoder
    if make is None:   # an interpreter without the C accelerator
        return slow
    strings = (_json_encoder.encode_basestring_ascii if ensure_ascii
               else _json_encoder.encode_basestring)
    fast = make(None, default or json.JSONEncoder().default, strings, None, ": ", ", ",
                sort_keys, False, True)
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):   # what JSONEncoder.encode does for a bare string
            return slow(value)
        try:
            return join(fast(value, 0))
        except RecursionError:   # a container inside itself: json's own error says so
            return slow(value)

    return encode
