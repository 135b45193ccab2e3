"""A chat call on the wire: the request's JSON body, and its answer read from the JSON as it
came (no pydantic models), whole or streamed chunk by chunk."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["request_body", "WITH_USAGE", "StreamReader", "read_completion"]


def _with_schema_note(messages: list[dict], schema: dict) -> list[dict]:
    """The messages with the schema said in words, after the last user message: the system
    message and the start of a flow's prompts stay byte for byte what its other calls send,
    so a server's prompt cache reuses them (prompt_start)."""
    note = ("Answer with one JSON value and nothing else. It must match this JSON schema:\n"
            + json.dumps(schema, separators=(",", ":")))
    out = [dict(m) for m in messages]
    if out and out[-1].get("role") == "user" and isinstance(out[-1].get("content"), str):
        out[-1]["content"] = f"{out[-1]['content']}\n\n{note}"
    else:
        out.append({"role": "user", "content": note})
    return out


def request_body(model, messages, schema, mode, temperature, seed, max_tokens) -> dict:
    """The JSON body of a chat request; `mode` is how a `schema` is asked for."""
    kwargs: dict[str, Any] = {"model": model, "messages": messages}
    if temperature is not None:
        kwargs["temperature"] = temperature
    if seed is not None:
        kwargs["seed"] = seed
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if schema is not None:
        kwargs["messages"] = _with_schema_note(messages, schema)
        if mode == "json_schema":
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "schema": schema}}
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
    return kwargs


# asked of a stream, so that its last chunk reports the call's usage
WITH_USAGE = {"stream_options": {"include_usage": True}}


class StreamReader:
    """A streamed chat completion, joined from its chunks: the text by hand, passed on to
    `on_text` as it comes, the tool calls by `_ToolCallPieces`."""

    __slots__ = ("on_text", "parts", "finish", "tokens_in", "tokens_out", "cached", "calls")

    def __init__(self, on_text):
        self.on_text = on_text
        self.parts: list[str] = []
        # the usage as reported, None when the stream has none (usage.checked_usage checks it)
        self.finish, self.tokens_in, self.tokens_out, self.cached = None, None, None, None
        self.calls: _ToolCallPieces | None = None

    def take(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise ValueError("a streamed event is not a chat completion chunk")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.tokens_in, self.tokens_out, self.cached = _tokens(usage, chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise ValueError("a streamed event is not a chat completion chunk")
        for choice in choices[:1]:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.parts.append(delta["content"])
                if self.on_text is not None:
                    self.on_text(delta["content"])
            if delta.get("tool_calls"):
                self.calls = self.calls or _ToolCallPieces()
                self.calls.add(chunk, choice, delta["tool_calls"])
            self.finish = choice.get("finish_reason") or self.finish

    def answer(self) -> tuple[str, str | None, Any, Any, list, Any]:
        """(text, finish reason, input tokens, output tokens, tool calls, cached input
        tokens)."""
        return ("".join(self.parts), self.finish, self.tokens_in, self.tokens_out,
                self.calls.calls() if self.calls else [], self.cached)


class _ToolCallPieces:
    """The tool calls of a streamed reply, joined by the SDK's `ChatCompletionStreamState`
    from the chunks that carry their pieces (the text of the reply is joined by hand)."""

    def __init__(self):
        from openai.lib.streaming.chat import ChatCompletionStreamState
        from openai.types.chat import ChatCompletionChunk

        self._state, self._kind = ChatCompletionStreamState(), ChatCompletionChunk

    def add(self, chunk: dict, choice: dict, pieces: Any) -> None:
        only = {**chunk, "choices": [{**choice, "delta": {"tool_calls": pieces}}]}
        try:
            self._state.handle_chunk(_sdk_chunk(self._kind, only))
        except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
            raise ValueError(f"a streamed event is not a chat completion chunk ({exc})") from None

    def calls(self) -> list[dict]:
        choices = self._state.current_completion_snapshot.choices
        return [{"id": call.id or f"call_{i}", "type": "function",
                 "function": {"name": call.function.name or "",
                              "arguments": call.function.arguments or ""}}
                for i, call in enumerate((choices[0].message.tool_calls or []) if choices else [])]


def _sdk_chunk(kind, chunk: dict):
    """The SDK's object of a streamed chunk: validated (pydantic's core, the fast way), or
    built as it is when a server leaves out a field the SDK requires (`created`, `id`)."""
    from pydantic import ValidationError

    try:
        return kind.model_validate(chunk)
    except ValidationError:
        return kind.construct(**chunk)


def _tokens(usage: Any, body: dict) -> tuple[Any, Any, Any]:
    """The usage counts as reported (None when missing): prompt, completion and cached
    prompt tokens; `usage.checked_usage` checks them. Cached ones as OpenAI (and vLLM)
    report them, `prompt_tokens_details.cached_tokens`, or as DeepSeek (`prompt_cache_hit_tokens`) and
    llama.cpp's own server (`timings.cache_n`, beside the usage) do."""
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens")
    if cached is None and isinstance(body.get("timings"), dict):
        cached = body["timings"].get("cache_n")
    return usage.get("prompt_tokens"), usage.get("completion_tokens"), cached


def read_completion(body: Any) -> tuple[str, str | None, Any, Any, list, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise ValueError("the body is not a chat completion")
    choice = body["choices"][0]
    message = choice.get("message") or {}
    calls = [{"id": c.get("id"), "type": "function",
              "function": {"name": c["function"].get("name"),
                           "arguments": c["function"].get("arguments") or ""}}
             for c in message.get("tool_calls") or [] if isinstance(c.get("function"), dict)]
    tokens_in, tokens_out, cached = _tokens(body.get("usage"), body)
    return (message.get("content") or "", choice.get("finish_reason"), tokens_in, tokens_out,
            calls, cached)
