"""What the loopback server answers: replies, usage counts, stream chunks and embeddings.

All pure functions of the request body, so the server stays reproducible: `default_responder`
echoes the last user line or, when JSON is asked for, a minimal document valid for the
request's schema (`schema_example`); `embed_text` is a hashed bag of words, so texts that
share words get a high cosine. The server in `loopback` re-exports the public names.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
from typing import Any, Callable

__all__ = ["default_responder", "embed_text", "schema_example", "embeddings_reply", "normalise_reply",
           "usage_counts", "stream_chunks"]


def _count_tokens(text: str) -> int:
    return round(len(text.split()) * 1.3)


def _text_of(content: Any) -> str:
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _resolve(root: dict, ref: str) -> Any:
    node: Any = root
    for part in ref.lstrip("#/").split("/") if ref.startswith("#") else []:
        node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
    return node


_FORMATS = {"date": "2000-01-01", "date-time": "2000-01-01T00:00:00Z", "time": "00:00:00",
            "email": "x@example.com", "uri": "http://example.com",
            "uuid": "00000000-0000-0000-0000-000000000000"}


def schema_example(schema: Any, _root: Any = None, _depth: int = 0) -> Any:
    """A minimal JSON value valid for a JSON schema: required properties only, "x", 0, [] ..."""
    root = schema if _root is None else _root
    if not isinstance(schema, dict) or _depth > 40:  # depth bound: recursive $refs
        return None

    def sub(s: Any) -> Any:
        return schema_example(s, root, _depth + 1)

    if "$ref" in schema:
        return sub(_resolve(root, schema["$ref"]))
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return sub(schema[key][0])
    if schema.get("allOf"):
        merged: dict = {}
        for part in schema["allOf"]:
            value = sub(part)
            if not isinstance(value, dict):
                return value
            merged.update(value)
        return merged
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _typed_example(kind, schema, sub)


def _typed_example(kind: str, schema: dict, sub: Callable[[Any], Any]) -> Any:
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: sub(props.get(name, {"type": "string"})) for name in schema.get("required", [])}
    if kind == "array":
        return [sub(schema.get("items", {})) for _ in range(int(schema.get("minItems", 0)))]
    if kind in ("integer", "number"):
        value = schema.get("minimum", 0)
        if "exclusiveMinimum" in schema:
            value = schema["exclusiveMinimum"] + 1
        elif "minimum" not in schema and schema.get("maximum", 0) < 0:
            value = schema["maximum"]
        return int(math.ceil(value)) if kind == "integer" else value
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    text = _FORMATS.get(schema.get("format"), "x")
    return text.ljust(int(schema.get("minLength", 0)), "x")[: schema.get("maxLength", len(text) + 999)]


def default_responder(body: dict) -> str:
    """Echo the last user message's first line, or a minimal JSON document when JSON is asked for."""
    fmt = body.get("response_format") or {}
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        # llama-cpp-python puts the schema beside the type, OpenAI under json_schema.
        schema = fmt.get("schema") or (fmt.get("json_schema") or {}).get("schema")
        return json.dumps(schema_example(schema) if schema else {})
    users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    lines = _text_of(users[-1].get("content")).strip().splitlines() if users else []
    return f"Loopback reply to: {lines[0][:200] if lines else '(nothing)'}"


def embed_text(text: str, dims: int = 64) -> list[float]:
    """A unit vector from a hashed bag of words, so texts sharing words have a high cosine."""
    vec = [0.0] * dims
    for word in re.findall(r"\w+", text.lower()):
        n = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
        vec[n % dims] += 1.0 if (n >> 40) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0:
        vec[0], norm = 1.0, 1.0
    return [v / norm for v in vec]


def embeddings_reply(body: dict, dims: int, model: str, embedder=None) -> dict:
    """The /embeddings answer: one `embed_text` vector per input, as floats or base64."""
    inputs = body.get("input", "")
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    texts = [" ".join(map(str, t)) if isinstance(t, list) else str(t) for t in inputs]
    dims = int(body.get("dimensions") or dims)
    data = []
    for i, text in enumerate(texts):
        vec: Any = embed_text(text, dims) if embedder is None else [float(v) for v in embedder(text)]
        if body.get("encoding_format") == "base64":  # what the openai SDK asks for by default
            vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vec})
    tokens = sum(_count_tokens(t) for t in texts)
    return {"object": "list", "data": data, "model": body.get("model") or model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def normalise_reply(reply: Any, body: dict) -> tuple[dict, str, dict]:
    """(message, finish_reason, usage) from a responder's str or dict."""
    if isinstance(reply, str):
        reply = {"content": reply}
    if not isinstance(reply, dict):
        raise TypeError(f"a responder must return str or dict, not {type(reply).__name__}")
    fields = ("content", "tool_calls", "refusal")
    msg = dict(reply.get("message") or {k: reply[k] for k in fields if k in reply})
    msg.setdefault("role", "assistant")
    msg.setdefault("content", None)
    calls = [dict(tc, id=tc.get("id", f"call_{i}"), type=tc.get("type", "function"))
             for i, tc in enumerate(msg.get("tool_calls") or [])]
    if calls:
        msg["tool_calls"] = calls
    finish = reply.get("finish_reason") or ("tool_calls" if calls else "stop")
    if "usage" in reply and reply["usage"] is None:   # a server that reports no usage
        return msg, finish, None
    usage = dict(reply.get("usage") or {})
    return msg, finish, usage_counts(body, msg, usage)


def usage_counts(body: dict, msg: dict, given: dict) -> dict:
    """Counts of the words (x 1.3), overridden by what a responder gave (any value)."""
    out = (msg.get("content") or "") + " ".join(tc.get("function", {}).get("arguments", "")
                                                for tc in msg.get("tool_calls") or [])
    usage = {"prompt_tokens": sum(_count_tokens(_text_of(m.get("content")))
                                  for m in body.get("messages") or [] if isinstance(m, dict)),
             "completion_tokens": _count_tokens(out)}
    usage.update(given)
    if "total_tokens" not in usage:
        try:
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        except TypeError:   # counts of two kinds, given by a responder: no total
            pass
    return usage


def stream_chunks(base: dict, msg: dict, finish: str, usage: dict | None,
                  with_usage: bool) -> list[dict]:
    def chunk(delta: dict, reason: str | None = None) -> dict:
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    pieces = re.findall(r"\S*\s*", msg.get("content") or "")  # word by word, joining back exactly
    chunks += [chunk({"content": piece}) for piece in pieces if piece]
    for i, tc in enumerate(msg.get("tool_calls") or []):
        # as OpenAI streams them: the id, type and name once, then the arguments in pieces
        function = tc.get("function") or {}
        arguments = function.get("arguments") or ""
        head = {**tc, "index": i, "function": {**function, "arguments": arguments[:8]}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[at:at + 8]}}]})
                   for at in range(8, len(arguments), 8)]
    chunks.append(chunk({}, finish))
    if with_usage and usage is not None:
        chunks.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return chunks
