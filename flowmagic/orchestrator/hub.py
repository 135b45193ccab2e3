"""Orchestrator mode: one orchestrator agent solves a task by messages to worker agents.

A star topology, as in CORAL: the orchestrator sends `send_message(agent, content)` and
ends with `submit_answer(answer)`; workers (a role prompt each, optionally with tools)
see only what the orchestrator sends them and answer only it. It may ask a planner for a
decomposition, refine an instruction, or hand a task to another agent. Unlike the
reference code, messages sent in one turn run concurrently, nothing polls, and the
endpoint is whatever flowmagic is configured with. Messages are asynchronous, as in
CORAL: the orchestrator's next move comes as soon as the first reply arrives (with the
agents still working named), not after the slowest; it may send more, wait, or submit
while others work; and a worker (or any code) may write to it first with `post()`. Endpoints with function calling get
the two actions as tools; the others a JSON action protocol
(`{"action": "send", "messages": [...]}` or `{"action": "submit", "answer": ...}`).

Budgets: `max_turns` orchestrator turns and `budget_s` seconds (a share is kept for the
end). When either runs out, one last call asks for the best answer; if that fails too,
the last worker reply is submitted with a note. A submission is always made.

Every message is stored (the `orchestrator` table) and announced to subscribers as it
happens (`subscribe`, for the panel's live chat view). Prompts never mention the clock,
so a run replays from the response cache: `replay=orchestration.script()` repeats the
same turns, cut where the original was cut (`Orchestration.to_notebook` writes that cell).

The turn loop and its budgets are here; what is asked of the workers (their replies, their
votes on an answer) is in `workers`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError, FlowError
from .._internal.aio import run_blocking
from .._internal.live import LiveRun
from .._internal.text import cut as text_cut
from ..llm.client import LLM, ToolsUnsupportedError, get_llm
from .consensus import refusal
from .protocol import (DEFAULT_AGENTS, ROLES, Agent, Message, Orchestration, RunSettings, action_schema,
                       as_agents, load_orchestration, new_run_id, read_actions, read_native_calls,
                       system_prompt, tool_specs)
from .workers import MEMORY, WorkerCalls
from ..model.status import AnswerState

__all__ = ["Orchestrator", "orchestrate", "aorchestrate", "start", "Agent", "Message",
           "Orchestration", "as_agents", "load_orchestration", "ROLES", "DEFAULT_AGENTS"]

_RESERVE = 0.2       # share of budget_s kept for the final answer (at most _RESERVE_MAX s)
_RESERVE_MAX = 30.0


@dataclass(frozen=True)
class ToolOptions:
    """How agents call tools: rounds of calls, seconds per call, tools offered per message and
    how they are picked (flowmagic.engine.tools.aselect_tools)."""
    rounds: int = 3
    timeout_s: float = 30.0
    top_n: int | None = 3
    similarity: Any = "auto"


def _where(endpoint) -> str:
    """The endpoint without user:password@ or a query string (either can carry a key)."""
    from urllib.parse import urlsplit, urlunsplit
    if endpoint.local:
        return "embedded"
    parts = urlsplit(endpoint.base_url)
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Orchestrator(WorkerCalls, LiveRun):
    """One orchestrator run: `await orch.run()`, or `start()` on the kernel's loop.

    Events for the live chat view, `callback(event)` with "kind": "turn" (turn), "working"
    (agent, turn: a call started), "message" (message: a Message dict, as it is stored),
    "tool" (agent, call), "submitted" (answer, status, ended_by).
    """

    def __init__(self, task: str, agents: Any = None, *, model: str | None = None,
                 budget_s: float | None = 300.0, max_turns: int | None = 8, tools: Any = None,
                 llm: LLM | None = None, store=None, run_id: str | None = None,
                 name: str = "orchestration", seed: int = 0, temperature: float | None = None,
                 max_tokens: int | None = None, reply_chars: int = 3000, protocol: str = "auto",
                 tool_rounds: int = 3, tool_timeout_s: float = 30.0, tools_top_n: int = 3,
                 tool_similarity: Any = "auto", continuations: int = 2, consensus: bool = True,
                 consensus_rounds: int = 2, replay: dict | None = None,
                 on_event: Callable[[dict], None] | None = None):
        if not isinstance(task, str) or not task.strip():
            raise ConfigError("the task is empty; write what the agents should do")
        if protocol not in ("auto", "native", "action"):
            raise ConfigError(f"protocol {protocol!r} is not auto, native or action")
        said = (max_turns, budget_s)   # the limits the prompts state (a replay states the original's)
        if replay is not None:   # repeat a recorded run: its turns, no clock
            if not isinstance(replay, dict) or not isinstance(replay.get("turns"), list):
                raise ConfigError("replay= takes Orchestration.script() (a dict with 'turns')")
            said = tuple(replay.get("limits") or (len(replay["turns"]), None))
            budget_s, max_turns = None, len(replay["turns"])
        if max_turns is not None and int(max_turns) < 1:
            raise ConfigError("max_turns must be at least 1")
        if budget_s is not None and float(budget_s) <= 0:
            raise ConfigError("budget_s must be positive (or None for no time limit)")
        from ..llm.endpoints import resolve
        endpoint, _ = resolve(model)   # a bad model id is a ConfigError now, not mid-run
        self.llm = llm or get_llm()
        self.store = store or self.llm.store
        self.agents = as_agents(agents, tools)
        self.by_name = {a.name: a for a in self.agents}
        self.task, self.model, self.replay = task.strip(), model, replay
        self.budget_s = None if budget_s is None else float(budget_s)
        self._said_turns, self._said_budget = said
        self.max_turns = None if max_turns is None else int(max_turns)
        self.protocol = protocol if protocol != "auto" else self.llm.tool_mode(model)
        self.opts = dict(seed=seed, temperature=temperature, max_tokens=max_tokens)
        self.reply_chars = reply_chars
        if not isinstance(continuations, int) or isinstance(continuations, bool) or continuations < 0:
            raise ConfigError(f"continuations={continuations!r}: give a count of 0 or more")
        self.continuations = continuations
        # CORAL: an answer is submitted once the agents who worked on it confirm it
        self.consensus, self.consensus_rounds = bool(consensus), int(consensus_rounds)
        self._refusals = 0
        self.tool_options = ToolOptions(tool_rounds, tool_timeout_s, tools_top_n, tool_similarity)
        settings = RunSettings(mode="orchestrate", model=model, endpoint=_where(endpoint),
                               budget_s=self._said_budget, max_turns=self._said_turns,
                               replayed=replay is not None, protocol=protocol,
                               reply_chars=reply_chars, continuations=continuations,
                               consensus=self.consensus, **self.opts)
        self.result = Orchestration(run_id or new_run_id(), self.task, self.agents, settings,
                                    name=name)
        LiveRun.__init__(self, on_event)
        self._memory: dict[str, list[tuple[str, str]]] = {a.name: [] for a in self.agents}
        self._exchanges: list[tuple[str, str, str]] = []   # (agent, message, reply) as fed
        self._inflight: dict[int, tuple[asyncio.Task, str, str, int]] = {}   # send seq -> work
        self._sends = 0                                   # sends so far (their seqs)
        self._inbox: list[tuple[str, str]] = []           # messages agents wrote first
        self._arrived: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._stop_asked = False
        self._deadline = self._hard_deadline = None

    # -- events, store, usage ----------------------------------------------------------------
    def _emit(self, kind: str, **data: Any) -> None:
        self.tell({"kind": kind, "run": self.result.run_id, "time": time.time(), **data})

    def _add(self, turn: int, sender: str, recipient: str, kind: str, content: str,
             reply=None) -> Message:
        o = self.result
        m = Message(len(o.transcript), turn, sender, recipient, kind, content or "", time.time())
        if reply is not None:
            m.tokens_in, m.tokens_out, m.cost_usd = reply.input_tokens, reply.output_tokens, reply.cost_usd
            m.cached, m.call_id = reply.cached, reply.call_id
        o.transcript.append(m)
        self.store.add_message(o.run_id, m.to_dict())
        self._emit("message", message=m.to_dict())
        return m

    def _count(self, reply) -> None:
        o = self.result
        o.calls += 1
        o.cached_calls += int(bool(reply.cached))
        o.tokens_in += reply.input_tokens
        o.tokens_out += reply.output_tokens
        o.cost_usd += reply.cost_usd

    def _save(self) -> None:
        o = self.result
        o.settings.protocol = self.protocol   # the one used, so a replay asks the same way
        outcome = {k: getattr(o, k) for k in ("status", "ended_by", "note", "turns", "final",
                                              "elapsed_s", "calls", "cached_calls", "tokens_in",
                                              "tokens_out", "cost_usd")}
        self.store.save_run(o.run_id, task=o.task, name=o.name, status=o.status,
                            workflow={"task": o.task, "nodes": [], "edges": []}, result=o.answer,
                            settings={**o.settings.to_dict(), "agents": [a.to_dict() for a in o.agents],
                                      "outcome": outcome})

    # -- time ----------------------------------------------------------------------------------
    def _left(self, hard: bool = False) -> float | None:
        deadline = self._hard_deadline if hard else self._deadline
        return None if deadline is None else deadline - time.monotonic()

    async def _bounded(self, tasks: list[asyncio.Task], hard: bool = False) -> bool:
        """Wait for the tasks within the budget (`asyncio.timeout`) or until a stop; cancel the
        rest. True if all finished.

        Not a TaskGroup: a stop or the budget ends the wait without being an error, one task's
        failure is a reply like any other (its siblings go on), and the tasks were started
        before this wait (a worker's reply may be waited for over several turns)."""
        pending = set(tasks)
        stop = asyncio.ensure_future(self._stopped.wait())
        left = self._left(hard)
        try:
            if left is None or left > 0:
                async with asyncio.timeout(left):
                    while pending and not stop.done():
                        done, _ = await asyncio.wait(pending | {stop},
                                                     return_when=asyncio.FIRST_COMPLETED)
                        pending -= done
        except TimeoutError:
            pass   # the budget is spent: what is still running is cancelled below
        finally:
            stop.cancel()
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return not pending

    def post(self, agent: str, content: str) -> None:
        """A message to the orchestrator that it did not ask for (a worker writing first);
        it sees it with the next replies, or in its first turn when posted before."""
        if agent not in self.by_name:
            raise ConfigError(f"there is no agent {agent!r}; agents: {', '.join(self.by_name)}")
        if not isinstance(content, str) or not content.strip():
            raise ConfigError("a posted message needs some text")
        self._inbox.append((agent, content.strip()))
        if self._arrived is not None:
            self._arrived.set()

    def stop(self) -> None:
        """End now: running calls are cancelled and the best answer so far is submitted."""
        self._stop_asked = True
        if self._stopped is not None:
            self._stopped.set()

    # -- the run ---------------------------------------------------------------------------------
    async def run(self) -> Orchestration:
        o = self.result
        self._stopped = asyncio.Event()
        self._arrived = asyncio.Event()
        if self._stop_asked:
            self._stopped.set()
        started = time.monotonic()
        if self.budget_s is not None:
            self._hard_deadline = started + self.budget_s
            self._deadline = self._hard_deadline - min(_RESERVE_MAX, _RESERVE * self.budget_s)
        self._save()
        self._add(0, "user", "orchestrator", "task", self.task)
        conv = [{"role": "system", "content": self._system(self.protocol)},
                {"role": "user", "content": f"The task:\n{self.task}" + self._unprompted(0)}]
        o.ended_by = "turns"
        turn = 0
        while self.max_turns is None or turn < self.max_turns:
            turn += 1
            if self._stopped.is_set() or (self._left() is not None and self._left() <= 0):
                o.ended_by = "stopped" if self._stopped.is_set() else "time"
                break
            self._emit("turn", turn=turn)
            step = await self._turn(conv, turn)
            if step != "continue":
                o.ended_by = step
                break
        if self.replay is not None and o.ended_by == "turns":
            o.ended_by = self.replay.get("ended_by") or "turns"   # cut between turns, as recorded
        await self._cut_inflight(len(o.turns), o.ended_by == "submit")
        if o.ended_by != "submit":
            await self._force(o.ended_by)
        o.elapsed_s = time.monotonic() - started
        self._save()
        self._emit("submitted", answer=o.answer, status=o.status, ended_by=o.ended_by, note=o.note)
        return o

    def _scripted(self, turn: int) -> dict | None:
        turns = (self.replay or {}).get("turns") or []
        return turns[turn - 1] if self.replay is not None and turn <= len(turns) else None

    async def _ask(self, conv: list[dict], turn: int):
        """The orchestrator's call for this turn; None when the budget or a failure cut it."""
        kwargs = dict(model=self.model, run_id=self.result.run_id, node_id="orchestrator",
                      purpose="orchestrator", **self.opts)
        self._emit("working", agent="orchestrator", turn=turn)
        names = [a.name for a in self.agents]
        # A reply cut at the token limit is continued; one still cut fails the turn in words.
        if self.protocol == "native":
            call = self.llm.complete_whole(conv, continuations=self.continuations,
                                           tools=tool_specs(names), **kwargs)
        else:
            call = self.llm.complete_whole(conv, continuations=self.continuations,
                                           schema=action_schema(names), **kwargs)
        task = asyncio.ensure_future(call)
        if not await self._bounded([task]):
            return None, "stopped" if self._stopped.is_set() else "time"
        try:
            return task.result(), None
        except ToolsUnsupportedError as exc:
            if len(conv) == 2:   # nothing was said yet: start over in the JSON protocol
                self.protocol = "action"
                conv[0]["content"] = self._system("action")
                return await self._ask(conv, turn)
            self._add(turn, "flowmagic", "user", "error", f"the orchestrator's call failed: {exc}")
            return None, "error"
        except FlowError as exc:
            self._add(turn, "flowmagic", "user", "error", f"the orchestrator's call failed: {exc}")
            return None, "error"

    def _system(self, protocol: str) -> str:
        return system_prompt(self.agents, self._said_turns, self._said_budget, protocol,
                             self.consensus)

    async def _turn(self, conv: list[dict], turn: int) -> str:
        o, script = self.result, self._scripted(turn)
        record = {"turn": turn}
        o.turns.append(record)
        if script is not None and script.get("action") in ("time", "stopped", "error"):
            record["action"] = script["action"]   # the recorded run was cut here
            return script["action"]
        reply, cut = await self._ask(conv, turn)
        if reply is None:
            record["action"] = cut
            return cut
        self._count(reply)
        names = set(self.by_name)
        actions = (read_native_calls(reply, names) if self.protocol == "native"
                   else read_actions(reply.data, names))
        if self.protocol == "native" and not actions and reply.text.strip():
            actions = ([("wait", None, None, None)] if self._inflight else
                       [("invalid", "you answered in text; call send_message or submit_answer",
                         None, None)])
        submit = next((a for a in actions if a[0] == "submit"), None)
        if submit is not None and self.consensus:
            against = await self._confirm(turn, submit[1], reply)
            if against is None:
                record["action"] = "stopped" if self._stopped.is_set() else "time"
                return record["action"]
            if against:
                record["action"] = "refused"
                self._feed(conv, reply, actions, [], [], turn, refused=refusal(against))
                return "continue"
        if submit is not None:
            record["action"] = "submit"
            o.answer, o.status = submit[1], AnswerState.SUBMITTED
            self._add(turn, "orchestrator", "user", "submit", submit[1], reply)
            return "submit"
        sends = [a for a in actions if a[0] == "send"]
        record["action"] = ("send" if sends else "wait" if any(a[0] == "wait" for a in actions)
                            else "invalid")
        record["sent"] = self._dispatch(sends, turn, reply)
        fed = await self._collect(turn, script)
        if fed is None:
            record["cut"] = "stopped" if self._stopped.is_set() else "time"
            return record["cut"]
        record["fed"] = [seq for seq, *_ in fed]
        self._feed(conv, reply, actions, record["sent"], fed, turn)
        return "continue"

    def _dispatch(self, sends: list[tuple], turn: int, reply) -> list[int]:
        """Start every send at once; their seqs. In a replay, a send the recorded run never
        got an answer to is not started (it would call the model)."""
        answered = None
        if self.replay is not None:
            answered = {q for t in self.replay.get("turns") or [] for q in t.get("fed") or []}
        seqs = []
        for i, (_, agent, content, _) in enumerate(sends):
            self._add(turn, "orchestrator", agent, "send", content, reply if i == 0 else None)
            seq, self._sends = self._sends, self._sends + 1
            task = (asyncio.ensure_future(self._work(agent, content, turn))
                    if answered is None or seq in answered else None)
            if task is not None:
                task.add_done_callback(lambda _t: self._arrived.set())
            self._inflight[seq] = (task, agent, content, turn)
            seqs.append(seq)
        return seqs

    def _ready(self, script: dict | None) -> list[int] | None:
        """The seqs to feed now, or None to wait on: the recorded ones in a replay, else
        every reply that has arrived."""
        if script is not None and "fed" in script:
            want = script["fed"]
            done = all(self._inflight.get(q, (None,))[0] is not None
                       and self._inflight[q][0].done() for q in want)
            return list(want) if done else None
        arrived = [q for q, (t, *_) in sorted(self._inflight.items()) if t is not None and t.done()]
        return arrived if arrived or self._inbox else None

    async def _collect(self, turn: int, script: dict | None) -> list[tuple] | None:
        """Wait for the next reply (or a message written first) and take every one that
        has arrived: [(seq, agent, message, reply)] in send order. [] when no agent is
        working and nobody wrote; None when the budget or a stop cut the wait."""
        if script is not None and script.get("cut"):
            return None
        while True:
            ready = self._ready(script)
            if ready is not None:
                break
            if not any(t is not None for t, *_ in self._inflight.values()) and not (
                    script is not None and script.get("fed")):
                return []
            self._arrived.clear()
            waiter = asyncio.ensure_future(self._arrived.wait())
            await self._bounded([waiter])
            if not waiter.done() or waiter.cancelled():
                return None
        fed = []
        for seq in ready:
            task, agent, content, sent_turn = self._inflight.pop(seq)
            answer = self._said(task, agent, sent_turn)
            fed.append((seq, agent, content, answer))
            self._exchanges.append((agent, content, answer))
            memory = self._memory[agent]
            memory.append((content, answer))
            del memory[:-MEMORY]
        return fed

    async def _cut_inflight(self, turn: int, submitted: bool = False) -> None:
        """The run ends: replies still awaited are cancelled, each with a note."""
        waiting, self._inflight = self._inflight, {}
        for seq, (task, agent, _, sent_turn) in sorted(waiting.items()):
            if task is not None and task.done() and not task.cancelled():
                self._said(task, agent, sent_turn)   # arrived, never fed: still in the transcript
        tasks = [t for t, *_ in waiting.values() if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for seq, (_, agent, _, _) in sorted(waiting.items()):
            self._add(turn, "flowmagic", "orchestrator", "note",
                      f"the answer was submitted before {agent} replied" if submitted
                      else f"no reply from {agent} within the budget")

    def _unprompted(self, turn: int) -> str:
        """Messages agents wrote first, stored and taken out of the inbox."""
        notes, self._inbox = self._inbox, []
        for agent, content in notes:
            self._add(turn, agent, "orchestrator", "message", content)
        return "".join(f"\n\n[{agent}, unprompted]: {content}" for agent, content in notes)

    def _feed(self, conv: list[dict], reply, actions, sent: list[int], fed: list[tuple],
              turn: int, refused: str | None = None) -> None:
        """Give the orchestrator the replies that arrived (in send order, so a replay asks
        the same), the messages written first, and who is still working."""
        def cut(text: str) -> str:
            return text_cut(text, self.reply_chars, " [cut]")
        left = f"Turn {turn} of {self._said_turns} used." if self._said_turns else f"Turn {turn} used."
        parts = [f"[{agent}]: {cut(answer)}" for _, agent, _, answer in fed]
        busy = sorted({agent for _, agent, _, _ in self._inflight.values()})
        news = refused or (("Replies:\n\n" + "\n\n".join(parts)) if parts else "No new reply.")
        news += self._unprompted(turn)
        news += f"\n\nStill working: {', '.join(busy)}." if busy else "\n\nNo agent is working."
        if self.protocol == "native":
            said = {"role": "assistant", "content": reply.text or ""}
            conv.append({**said, "tool_calls": reply.tool_calls} if reply.tool_calls else said)
            seqs = iter(sent)
            for kind, what, _, cid in actions:
                text = (f"sent (message {next(seqs)}); the reply comes when it arrives"
                        if kind == "send" and not refused else "waited" if kind == "wait"
                        else "not submitted: see below" if kind == "submit"
                        else "not sent: the turn ended with a submission" if kind == "send"
                        else f"Error: {what}")
                conv.append({"role": "tool", "tool_call_id": cid, "content": text})
            if not actions:
                news += "\nCall send_message, wait_for_replies or submit_answer."
            conv.append({"role": "user", "content": f"{news}\n\n{left} Send more messages, "
                                                    "wait, or submit."})
            return
        news += "".join(f"\n(not sent: {what})" for kind, what, _, _ in actions if kind == "invalid")
        conv += [{"role": "assistant", "content": reply.text},
                 {"role": "user", "content": f"{news}\n\n{left} Send more messages, wait, or "
                                             "submit your answer."}]

    async def _force(self, reason: str) -> None:
        """The budget is used up: one last call for the best answer, else the last reply."""
        o = self.result
        why = {"turns": "turn", "time": "time", "stopped": "user's stop",
               "error": "error"}.get(reason, reason)
        self._add(len(o.turns), "flowmagic", "orchestrator", "note",
                  f"The {why} budget is used up: submit the best answer now.")
        self._stopped.clear()   # a stop() from now on cancels this last call too
        if (self.replay or {}).get("final") != "failed" and (
                self._left(hard=True) is None or self._left(hard=True) > 0):
            log = "\n\n".join(f"[orchestrator -> {agent}] {asked[: self.reply_chars]}\n"
                              f"[{agent} -> orchestrator] {answer[: self.reply_chars]}"
                              for agent, asked, answer in self._exchanges)
            messages = [{"role": "system", "content": "You are the orchestrator of a team of agents. "
                         "Write only the final answer to the task, nothing else."},
                        {"role": "user", "content": f"The task:\n{self.task}\n\nThe messages so far:\n"
                         f"{log or '(none)'}\n\nWrite the best final answer to the task now."}]
            task = asyncio.ensure_future(self.llm.complete_whole(
                messages, continuations=self.continuations, model=self.model, run_id=o.run_id,
                node_id="orchestrator", purpose="orchestrator-final", **self.opts))
            if await self._bounded([task], hard=True) and not task.exception() and task.result().text.strip():
                reply = task.result()
                self._count(reply)
                o.answer, o.status, o.final = (self._marked(reply).strip(), AnswerState.FORCED,
                                               "answered")
                if reply.cut:
                    o.note = ("the final answer stopped at the token limit and is incomplete; "
                              "raise max_tokens")
                self._add(len(o.turns), "orchestrator", "user", "submit", o.answer, reply)
                return
        o.final = "failed"
        last = next((m for m in reversed(o.transcript) if m.kind == "reply"), None)
        o.answer, o.status = (last.content if last else ""), AnswerState.FALLBACK
        o.note = (f"the orchestrator gave no answer within the budget; this is the last reply, "
                  f"from {last.sender}" if last else "no agent answered within the budget")
        self._add(len(o.turns), "flowmagic", "user", "submit", o.answer)

    # -- in a notebook ---------------------------------------------------------------------------
    def start(self) -> "Orchestrator":
        """Run as a task on the running loop (a notebook) and return at once; see wait()."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigError("start() needs a running event loop (a notebook); in a script "
                              "use flowmagic.orchestrate(...)") from None
        self.in_task(self.run())
        return self

    async def wait(self) -> Orchestration:
        if self._task is None:
            return await self.run()
        return await asyncio.shield(self._task)

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()


async def aorchestrate(task: str, agents: Any = None, *, budget_s: float | None = 300.0,
                       max_turns: int | None = 8, model: str | None = None,
                       **options: Any) -> Orchestration:
    """Solve `task` by messages between an orchestrator and `agents` (see Orchestrator)."""
    return await Orchestrator(task, agents, budget_s=budget_s, max_turns=max_turns, model=model,
                              **options).run()


def orchestrate(task: str, agents: Any = None, *, budget_s: float | None = 300.0,
                max_turns: int | None = 8, model: str | None = None, **options: Any) -> Orchestration:
    """`aorchestrate` to its end, in a script or a notebook cell (which waits for it; for a
    live chat in a notebook, `start(...)` returns at once)."""
    orch = Orchestrator(task, agents, budget_s=budget_s, max_turns=max_turns, model=model, **options)
    return run_blocking(orch.run, close=orch.llm.aclose, name="flowmagic-orchestrate")


def start(task: str, agents: Any = None, **options: Any) -> Orchestrator:
    """Start an orchestration on the running loop (a notebook cell returns at once).

    `options` are Orchestrator's (budget_s, max_turns, model, tools, on_event, ...);
    `orch.subscribe(view.update)` feeds a live chat view, `await orch.wait()` the outcome.
    """
    return Orchestrator(task, agents, **options).start()
