"""One node's work: its prompt (context passing), attempts with validation, injected faults.

The prompt carries the overall task, the node's requirement, its agent role as the
system role, the outputs of its parents (or of all its ancestors), and the requirements
of its children so it knows what is expected of it. A failed validation re-runs the node
with its earlier attempts and the feedback, up to `max_attempts`.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from ..errors import EndpointError
from .executor import Outcome
from .validation import retry_prompt

if TYPE_CHECKING:
    from ..flow import Flow

__all__ = ["NodeRunner", "node_messages", "cut"]

MASKED = "none"


def cut(text: str, limit: int) -> str:
    """At most `limit` characters, saying so when something was cut."""
    text = text or ""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 6)] + " [cut]"


def node_messages(flow: "Flow", node_id: str, retry_note: str = "") -> list[dict]:
    wf = flow.workflow
    node = wf.nodes[node_id]
    budget = int(flow.settings["context_chars"])
    sources = (wf.ancestors(node_id) if flow.settings["context"] == "ancestors"
               else wf.parents(node_id))
    done = [p for p in sources if wf.nodes[p].status == "done"]
    share = budget // max(1, len(done))
    inputs = "\n\n".join(
        f"[{p}] ({wf.nodes[p].agent}): {cut(wf.nodes[p].output or '', share)}" for p in done)
    later = "\n".join(f"- {wf.nodes[c].requirement}" for c in wf.children(node_id))
    system = (f"You are the {node.agent} in a team of agents working on one task. "
              "Do only your own subtask, using the results you are given. Give the result "
              "itself (text, code or data), complete and concrete, not a description of it.")
    parts = [f"Overall task:\n{cut(wf.task, budget // 2)}",
             f"Your subtask ({node_id}):\n{node.requirement}"]
    if inputs:
        parts.append(f"Results of earlier subtasks:\n{inputs}")
    if later:
        parts.append(f"Later subtasks will build on your result:\n{later}")
    if retry_note:
        parts.append(retry_note)
    parts.append("Write the result of your subtask now.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


class NodeRunner:
    """`await runner.run(node_id) -> Outcome`, the executor's work for a Flow."""

    def __init__(self, flow: "Flow"):
        self.flow = flow

    def _chance(self, node_id: str, what: str, attempt: int = 0) -> float:
        return random.Random(f"{self.flow.settings['seed']}:{node_id}:{what}:{attempt}").random()

    async def _verdict(self, node, text: str):
        mode = self.flow.settings["validate"]
        if mode == "none":
            return True, ""
        from .validation import validate
        verdict = await validate(node, text, task=self.flow.workflow.task, mode=mode,
                                 llm=self.flow.llm, model=self.flow.settings["validator_model"]
                                 or self.flow.settings["model"], run_id=self.flow.run_id,
                                 max_tokens=self.flow.settings["max_tokens"])
        return verdict.passed, verdict.feedback

    async def _reply(self, node, messages: list[dict], seed: int):
        """(reply, tool calls): the node's answer, through the tool loop when tools are offered."""
        flow, settings = self.flow, self.flow.settings
        kwargs = dict(model=node.model or settings["model"], seed=seed,
                      temperature=settings["temperature"], max_tokens=settings["max_tokens"],
                      run_id=flow.run_id, node_id=node.id, purpose="node",
                      on_text=flow._text_sink(node.id))
        offered = flow.tools_for(node.id) if flow.tools else []
        if not offered:
            return await flow.llm.complete(messages, **kwargs), []
        from .toolloop import run_with_tools

        def called(call) -> None:
            flow.store.add_tool_call(flow.run_id, node.id, tool=call.tool, arguments=call.arguments,
                                     result=call.summary(), duration_s=call.duration_s,
                                     error=call.error, round=call.round, protocol=call.protocol)
            flow._emit("tool", node.id, {"call": call.to_dict()})

        result = await run_with_tools(
            flow.llm, messages, offered, max_rounds=int(settings["tool_rounds"]),
            timeout_s=settings["tool_timeout_s"], protocol=settings["tool_protocol"],
            on_call=called, **kwargs)
        return result.reply, result.calls

    async def run(self, node_id: str) -> Outcome:
        flow = self.flow
        settings = flow.settings
        node = flow.workflow.nodes[node_id]
        history = len(node.attempts)   # earlier runs of this node (reruns vary the seed)
        attempts: list[dict] = []
        outcome = Outcome(ok=False)
        for attempt in range(int(settings["max_attempts"])):
            started = time.time()
            record = {"start": started, "attempt": history + attempt + 1}
            if settings["fail_rate"] and self._chance(node_id, "fail", history + attempt) < settings["fail_rate"]:
                record.update(end=time.time(), passed=False, output=None,
                              error="injected failure (fail_rate)")
                attempts.append(record)
                continue
            messages = node_messages(flow, node_id, retry_prompt(attempts))
            try:
                reply, tool_calls = await self._reply(node, messages,
                                                      settings["seed"] + history + attempt)
            except EndpointError as exc:
                record.update(end=time.time(), passed=False, output=None, error=str(exc))
                attempts.append(record)
                outcome.error = str(exc)
                break   # the LLM door already retried; more attempts would only wait longer
            flow._spend(reply.cost_usd)
            outcome.tokens_in += reply.input_tokens
            outcome.tokens_out += reply.output_tokens
            outcome.cost_usd += reply.cost_usd
            record.update(output=reply.text, call_id=reply.call_id, cache_key=reply.cache_key,
                          model=reply.model, cached=reply.cached,
                          tokens_in=reply.input_tokens, tokens_out=reply.output_tokens,
                          cost_usd=reply.cost_usd, seed=settings["seed"] + history + attempt)
            if tool_calls:
                record["tool_calls"] = [c.to_dict() for c in tool_calls]
            try:
                passed, feedback = await self._verdict(node, reply.text)
            except EndpointError as exc:   # the judge's endpoint is down: keep the output
                record.update(end=time.time(), passed=True,
                              feedback=f"validator unavailable: {exc}")
                attempts.append(record)
                outcome.ok, outcome.output = True, reply.text
                break
            record.update(end=time.time(), passed=passed, feedback=feedback)
            attempts.append(record)
            if passed:
                outcome.ok, outcome.output = True, reply.text
                break
        outcome.attempts = attempts
        if not outcome.ok and outcome.error is None:
            last = attempts[-1] if attempts else {}
            why = " ".join(str(last.get("feedback") or last.get("error") or "no output").split())
            outcome.error = f"failed {len(attempts)} attempt(s); last: {cut(why, 300)}"  # one line
        if (outcome.ok and not history and settings["mask_rate"]
                and self._chance(node_id, "mask") < settings["mask_rate"]):
            attempts[-1]["masked"] = True
            outcome.output, outcome.masked = MASKED, True
        return outcome
