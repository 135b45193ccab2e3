"""The tool loop: a model calls the user's tools until it answers, within a bound on rounds.

Endpoints with function calling get OpenAI `tools` / `tool_calls`. The others get a JSON
action protocol, asked for with a schema (on llama.cpp a grammar, so the embedded model
can only emit well-formed actions): `{"action": "call", "tool": NAME, "arguments": {...}}`
or `{"action": "answer", "content": TEXT}`. Which one an endpoint gets is remembered by
`LLM.tool_mode`; an endpoint that refuses `tools` falls back to the protocol on the spot.
When the rounds are used up the model is asked once more, without tools, for its answer.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError, ModelOutputError
from .tools import Tool, ToolCall, as_tools, call_tool

__all__ = ["ToolLoopResult", "run_with_tools", "action_schema", "PROTOCOLS"]

PROTOCOLS = ("auto", "native", "action")


@dataclass
class ToolLoopResult:
    reply: Any                      # the final Reply; tokens, latency and cost summed over rounds
    calls: list[ToolCall] = field(default_factory=list)
    rounds: int = 0
    protocol: str = "native"
    messages: list[dict] = field(default_factory=list)


def action_schema(tools: list[Tool]) -> dict:
    """The JSON action protocol: answer, or call one of the tools with its own arguments."""
    answer = {"type": "object", "properties": {"action": {"const": "answer"},
                                               "content": {"type": "string"}},
              "required": ["action", "content"]}
    calls = [{"type": "object", "properties": {"action": {"const": "call"}, "tool": {"const": t.name},
                                               "arguments": t.parameters},
              "required": ["action", "tool", "arguments"]} for t in tools]
    return {"anyOf": [answer, *calls]}


def _action_note(tools: list[Tool]) -> str:
    lines = [f"- {t.name}: {t.description} Arguments (JSON schema): "
             f"{json.dumps(t.parameters.get('properties', {}), separators=(',', ':'))}" for t in tools]
    return ("You can call these tools (Python functions) to get facts or do work:\n"
            + "\n".join(lines) + '\nTo call one, answer {"action": "call", "tool": NAME, '
            '"arguments": {...}}. When you have what you need, answer '
            '{"action": "answer", "content": YOUR RESULT}.')


def _read_action(data: Any, names: set[str]) -> tuple[str, Any, Any]:
    """("call", tool, arguments) or ("answer", content, None), tolerant of small models."""
    if isinstance(data, dict):
        act = str(data.get("action", "")).lower()
        name = data.get("tool") or data.get("name") or data.get("function")
        if act != "answer" and isinstance(name, str) and (act == "call" or name in names):
            return "call", name, data.get("arguments", data.get("args", {}))
        for key in ("content", "answer", "result", "text"):
            if key in data:
                value = data[key]
                return "answer", value if isinstance(value, str) else json.dumps(value), None
    return "answer", data if isinstance(data, str) else json.dumps(data), None


_LAST_ROUND = ("You have used every tool call you may make. Do not call tools any more: "
               "answer now, in plain text, with the best result you can give from what you have.")


async def run_with_tools(llm, messages: list[dict] | str, tools: list[Tool], *, model: str | None = None,
                         max_rounds: int = 4, timeout_s: float | None = 30.0,
                         protocol: str = "auto", on_call: Callable[[ToolCall], None] | None = None,
                         max_result_chars: int = 4000, **complete_kwargs: Any) -> ToolLoopResult:
    """Let the model call `tools` until it answers (at most `max_rounds` rounds of calls).

    `complete_kwargs` go to `llm.complete` (seed, temperature, max_tokens, run_id, node_id,
    purpose, on_text, cache). `on_call(call)` is told about every call as it finishes.
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"tool protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    tools = as_tools(tools)
    state = _Loop(llm, list(messages), tools, model, max_rounds, timeout_s, on_call,
                  max_result_chars, complete_kwargs)
    if protocol == "auto":
        protocol = llm.tool_mode(model)
    if protocol == "native":
        from ..llm.client import ToolsUnsupportedError
        try:
            return await state.native()
        except ToolsUnsupportedError:
            state.messages = list(messages)   # start over: the endpoint never saw a tool call
    return await state.action()


class _Loop:
    """The state of one tool loop: messages so far, calls made, usage summed."""

    def __init__(self, llm, messages, tools, model, max_rounds, timeout_s, on_call, limit, kwargs):
        self.llm, self.messages, self.tools, self.model = llm, messages, tools, model
        self.by_name = {t.name: t for t in tools}
        self.max_rounds, self.timeout_s, self.on_call, self.limit = max_rounds, timeout_s, on_call, limit
        self.kwargs, self.calls, self.replies = kwargs, [], []

    async def _complete(self, messages, **extra):
        reply = await self.llm.complete(messages, model=self.model, **{**self.kwargs, **extra})
        self.replies.append(reply)
        return reply

    async def _call(self, name: str, arguments: Any, rnd: int, protocol: str, call_id=None) -> ToolCall:
        t = self.by_name.get(name) if isinstance(name, str) else None
        if t is None:
            call = ToolCall(str(name), arguments, "", error=f"no tool named {name!r}; tools: "
                            f"{', '.join(self.by_name) or 'none'}")
            call.result = f"Error: {call.error}"
        else:
            call = await call_tool(t, arguments, timeout_s=self.timeout_s,
                                   max_result_chars=self.limit)
        call.round, call.protocol, call.id = rnd, protocol, call_id
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        return call

    def _result(self, reply, rounds: int, protocol: str, text: str | None = None) -> ToolLoopResult:
        total = dataclasses.replace(
            reply, text=reply.text if text is None else text,
            input_tokens=sum(r.input_tokens for r in self.replies),
            output_tokens=sum(r.output_tokens for r in self.replies),
            cost_usd=sum(r.cost_usd for r in self.replies),
            latency_s=sum(r.latency_s for r in self.replies),
            cached=all(r.cached for r in self.replies))
        if text is not None:
            total.data = None
        return ToolLoopResult(total, self.calls, rounds, protocol, self.messages)

    async def native(self) -> ToolLoopResult:
        specs = [t.spec() for t in self.tools]
        for rnd in range(self.max_rounds + 1):
            last = rnd == self.max_rounds
            if last:
                self.messages.append({"role": "user", "content": _LAST_ROUND})
            reply = await self._complete(self.messages, tools=None if last else specs)
            if not reply.tool_calls or last:
                return self._result(reply, rnd, "native")
            self.messages.append({"role": "assistant", "content": reply.text or "",
                                  "tool_calls": reply.tool_calls})
            for tc in reply.tool_calls:
                fn = tc.get("function") or {}
                call = await self._call(fn.get("name"), fn.get("arguments"), rnd + 1, "native",
                                        tc.get("id"))
                self.messages.append({"role": "tool", "tool_call_id": tc.get("id"),
                                      "content": call.result})
        raise AssertionError("unreachable")   # the last round always returns

    async def action(self) -> ToolLoopResult:
        schema = action_schema(self.tools)
        note = _action_note(self.tools)
        first = self.messages[0] if self.messages else {}
        if first.get("role") == "system":
            self.messages[0] = {**first, "content": f"{first['content']}\n\n{note}"}
        else:
            self.messages.insert(0, {"role": "system", "content": note})
        self.kwargs.pop("on_text", None)   # the text is JSON; streaming it would show JSON
        for rnd in range(self.max_rounds + 1):
            if rnd == self.max_rounds:
                break
            try:
                reply = await self._complete(self.messages, schema=schema)
            except ModelOutputError:
                break   # an unreadable action: ask for the answer in plain text
            kind, what, arguments = _read_action(reply.data, set(self.by_name))
            if kind == "answer":
                return self._result(reply, rnd, "action", text=what)
            call = await self._call(what, arguments, rnd + 1, "action")
            self.messages += [{"role": "assistant", "content": reply.text},
                              {"role": "user", "content": f"Result of {call.tool}: {call.result}\n"
                               "Call another tool, or answer."}]
        self.messages.append({"role": "user", "content": _LAST_ROUND})
        reply = await self._complete(self.messages)
        return self._result(reply, self.max_rounds, "action")
