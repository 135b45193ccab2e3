"""What the orchestrator asks of its workers: a reply to a message (with the worker's memory
of its earlier exchanges, and its tools), written into the transcript when the orchestrator
takes it, and, before an answer is submitted, each one's vote on it (CORAL's consensus)."""

from __future__ import annotations

import asyncio

from ..errors import FlowError
from .consensus import VOTE_SCHEMA, read_vote, vote_prompt
from .protocol import Agent

__all__ = ["WorkerCalls", "WORKER_RULES", "CUT_MARK", "MEMORY"]

WORKER_RULES = ("You work for an orchestrator who sends you messages; you answer only the "
                "orchestrator. Do what its message asks and reply with the result itself, "
                "complete and concrete.")
CUT_MARK = "[cut: this reply stopped at the token limit]"
MEMORY = 4          # earlier exchanges a worker remembers


class WorkerCalls:
    """The worker half of `hub.Orchestrator` (its __init__ sets what these methods read)."""

    async def _work(self, name: str, content: str, turn: int) -> tuple:
        """One worker's reply to one message (a failure becomes the reply, never a crash)."""
        agent = self.by_name[name]
        messages = [{"role": "system", "content": f"{agent.role}\n\n{WORKER_RULES}"}]
        for asked, answered in self._memory[name]:
            messages += [{"role": "user", "content": asked},
                         {"role": "assistant", "content": answered[: self.reply_chars]}]
        messages.append({"role": "user", "content": content})
        kwargs = dict(model=agent.model or self.model, run_id=self.result.run_id, node_id=name,
                      purpose="worker", **self.opts)
        self._emit("working", agent=name, turn=turn)
        try:
            if agent.tools:
                reply = await self._with_tools(agent, content, messages, kwargs)
            else:
                reply = await self.llm.complete_whole(messages, continuations=self.continuations,
                                                      **kwargs)
        except FlowError as exc:
            return "error", f"(the {name} agent failed: {exc})", None
        self._count(reply)
        return "reply", self._marked(reply), reply

    def _marked(self, reply) -> str:
        """The reply's text; one still cut at the token limit says so at its end, where the
        orchestrator, the transcript, the chat view and the export all see it."""
        if not getattr(reply, "cut", False):
            return reply.text
        return (f"{reply.text}\n\n{CUT_MARK} (after {reply.continuations} "
                f"continuation{'s' * (reply.continuations != 1)})")

    def _said(self, task: asyncio.Task, agent: str, turn: int) -> str:
        """Write a finished worker's reply (or failure) into the transcript; its text.

        Replies enter the transcript when the orchestrator takes them, in send order, not
        the moment they arrive: arrival order is a race between concurrent calls (a
        replay from the cache would reorder them), what the orchestrator is fed is not."""
        kind, text, reply = task.result()
        self._add(turn, agent, "orchestrator", kind, text, reply)
        return text

    async def _with_tools(self, agent: Agent, content: str, messages: list[dict], kwargs: dict):
        from ..engine.toolloop import run_with_tools
        from ..engine.tools import aselect_tools

        def called(call) -> None:
            self.store.add_tool_call(self.result.run_id, agent.name, tool=call.tool,
                                     arguments=call.arguments, result=call.summary(),
                                     duration_s=call.duration_s, error=call.error,
                                     round=call.round, protocol=call.protocol)
            self._emit("tool", agent=agent.name, call=call.to_dict())

        offered = await aselect_tools(content, agent.tools, top_n=self.tool_options.top_n,
                                      similarity=self.tool_options.similarity, llm=self.llm,
                                      model=agent.model or self.model)
        result = await run_with_tools(self.llm, messages, offered, on_call=called,
                                      max_rounds=self.tool_options.rounds,
                                      timeout_s=self.tool_options.timeout_s, **kwargs)
        return result.reply

    async def _confirm(self, turn: int, answer: str, reply) -> list[tuple[str, str]] | None:
        """Ask the agents who worked (all, when none did) whether they agree with `answer`:
        [(agent, reason)] of those who did not confirm ([] when all did, or when the rounds
        of refusal are used up); None when the budget or a stop cut the votes."""
        voters = list(dict.fromkeys(agent for agent, _, _ in self._exchanges)) or list(self.by_name)
        for i, name in enumerate(voters):
            self._add(turn, "orchestrator", name, "confirm", answer, reply if i == 0 else None)
        tasks = [asyncio.ensure_future(self._vote(name, answer, turn)) for name in voters]
        if not await self._bounded(tasks):
            return None
        against = []
        for name, task in zip(voters, tasks):
            agrees, reason, text, got = task.result()
            self._add(turn, name, "orchestrator", "verdict", text, got)
            if not agrees:
                against.append((name, reason))
        if against and self._refusals >= self.consensus_rounds:
            self.result.note = (f"submitted without consensus after {self._refusals} refused "
                                f"submission(s): {', '.join(a for a, _ in against)} did not agree")
            return []
        self._refusals += bool(against)
        return against

    async def _vote(self, name: str, answer: str, turn: int) -> tuple:
        agent = self.by_name[name]
        messages = [{"role": "system", "content": f"{agent.role}\n\n{WORKER_RULES}"},
                    {"role": "user", "content": vote_prompt(self.task, answer)}]
        self._emit("working", agent=name, turn=turn)
        try:
            got = await self.llm.complete_whole(
                messages, continuations=self.continuations, schema=VOTE_SCHEMA,
                model=agent.model or self.model, run_id=self.result.run_id, node_id=name,
                purpose="consensus", **self.opts)
        except FlowError as exc:
            return False, f"no verdict ({exc})", f"(no verdict: {exc})", None
        self._count(got)
        agrees, reason = read_vote(got.data)
        return agrees, reason, ("agree" if agrees else "disagree") + (f": {reason}" if reason else ""), got
