"""One node's work: its prompt (context passing), attempts with validation, injected faults.

The prompt carries the overall task, the node's requirement, its agent role, the outputs
of its parents (or of all its ancestors), and the requirements of its children so it knows
what is expected of it; what every node shares comes first (see `node_messages`). A failed
validation re-runs the node as the conversation continued: its prompt, each rejected answer
and what was wrong with it (validation.retry_turns), up to `max_attempts`.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
import time
from dataclasses import dataclass, field
from functools import partial

from ..errors import EndpointError, FlowError, SandboxError, WorkspaceError
from ..llm.endpoints import scrub
from .answerform import prescribed, without_pairs
from .answer_code import (WORKING_START, Execution, about_files_or_code, aexecute, files_line,
                        has_fence, instructions, made_files, report, run_python)
from .context import RunContext
from .session import names_for, session_text
from .._internal.text import cut as text_cut
from .scheduler import Outcome
from .validation import retry_turns
from .working_start import (earlier_start, fall_back_on_start, ran_start, said_once,
                            shared_report, shown_above, start_run)
from .prompt_start import HOUSE_RULES, task_part
from .calls import attempt_why
from .diagnosis import code_feedback, hollow_result
from .numbers import (numbers_feedback, output_lines, printed_lines, stated_numbers,
                      strip_claims, trace, untraced, untraced_mark, without_code)
from ..model.plan_checks import computes
from ..model.status import Status

__all__ = ["NodeRunner", "node_messages", "cut", "shares", "CUT_FEEDBACK", "HOUSE_RULES"]

MASKED = "none"
CUT_FEEDBACK = ("cut: the answer reached the token limit ({tokens} tokens) and was still "
                "unfinished after {n} continuation(s); it is not accepted. Write a shorter "
                "answer that is complete.")


_RESTART = " Fix it, or begin again from the working start given above."
# Attempts and continuations when the settings leave them to the endpoint (None).
ATTEMPTS, CONTINUATIONS = 3, 2
# On the embedded model in a flow on data, where a node's answer is code that runs: in twelve
# csv_eda runs on SmolLM2 (issue 31; some repeat one path) no answer continued past the
# 512-token cap ran (0 of 8, 636-1,536 tokens each) and 1 of 19 third attempts passed (with
# text, no code), while each such call costs 10-30 s there at load 1. Text flows keep the
# continuations (a joined text is still a text); a node that ran the working start still
# falls back on it.
EMBEDDED_DATA_ATTEMPTS, EMBEDDED_DATA_CONTINUATIONS = 2, 0
# A node that explores or plots the data is where the working start belongs.
_EXPLORES = re.compile(r"plot|chart|figure|graph|visuali|draw|histogram|scatter|distribut|"
                       r"explor|describ|summar|load|statistic|analy", re.IGNORECASE)


@functools.lru_cache(maxsize=64)   # asked about a run's one task text for every node
def _task_explores(task: str) -> bool:
    return _EXPLORES.search(task) is not None


@functools.lru_cache(maxsize=16)
def _task_texts(task: str, budget: int) -> tuple[str, str]:
    """(the task without its answer form's words, which the summary writes; the task as the
    prompt shows it): the same for every node of a run, so computed once, not per node (the
    answer form's regexes, run twice a node, were a sixth of a node's CPU without a model)."""
    return without_pairs(task), task_part(task, budget)


def cut(text: str, limit: int) -> str:
    """At most `limit` characters (plus a marker), saying how much was left out."""
    return text_cut(text, limit, "\n[cut here: {n} more characters not shown]")


def shares(lengths: list[int], budget: int) -> list[int]:
    """Characters each text may use so they fit `budget` together: short texts are kept
    whole and what they leave is shared by the long ones (water filling)."""
    out, left, todo = [0] * len(lengths), max(0, budget), sorted(range(len(lengths)),
                                                                key=lambda i: lengths[i])
    for rank, i in enumerate(todo):
        fair = left // max(1, len(todo) - rank)
        out[i] = min(lengths[i], fair)
        left -= out[i]
    return out


END = "Write the result of your subtask now."
# A subtask that computes, in a flow on tables, is told to answer with code. Told only to
# "write the result", the bench model answered 20 of 39 such first calls (dabench-dev flows)
# with prose and made-up numbers and no code; the same prompts ending with this, 10 of the
# first 10 of those 20 answered with code. Nothing after the block: a sentence there states
# what the code will print before it ran, a guess.
CODE_END = ("Answer with one ```python block that computes and prints what your subtask asks "
            "for. It runs as the next cell of the session and what it prints is your result, "
            "so write nothing after the block.")


def node_messages(ctx: RunContext, node_id: str, retry_note: str = "", *,
                  workspace: bool = True, started: str = "", facts: bool = False,
                  ran: str = "") -> list[dict]:
    """The node's prompt: what every call of the flow shares first (the house rules, the
    task, how code runs and what the inputs are, the working start), then what is the
    node's own (its role, subtask, parents' results, what comes after), so that
    consecutive prompts share their longest possible start (a retry continues
    this prompt as a conversation: validation.retry_turns). `workspace=False`
    leaves out what the workspace holds (the replay fingerprint must not depend on a
    folder another machine does not have). `facts=True` gives the same parts in the order
    of flowmagic before this layout (the role in the system message): the replay
    fingerprint hashes that, so an older export's record still answers its nodes. `ran`:
    the report of the working start's run in the flow's session, which the shared start
    holds instead of its code (and a parent's result that it leads does not repeat)."""
    p = _prompt_parts(ctx, node_id, retry_note, workspace, started, ran if workspace else "")
    if facts:
        user = [p["task"], p["subtask"], p["inputs"], p["note"], p["later"],
                "\n\n".join(x for x in (p["how"], p["files"], p["session"]) if x), p["started"],
                p["retry"], END]   # the fingerprint's facts: the end follows from them
        return [{"role": "system", "content": f"You are the {p['agent']} in a team of agents "
                 "working on one task. Do only your own subtask, using the results you are "
                 "given. Give the result itself (text, code or data), complete and concrete, "
                 "not a description of it."},
                {"role": "user", "content": "\n\n".join(filter(None, user))}]
    user = [p["task"], p["how"], f"Your role: the {p['agent']}.", p["subtask"], p["inputs"],
            p["note"], p["later"], p["files"], p["session"], p["started"], p["retry"], p["end"]]
    return [{"role": "system", "content": HOUSE_RULES},
            {"role": "user", "content": "\n\n".join(filter(None, user))}]


def _prompt_parts(ctx: RunContext, node_id: str, retry_note: str, workspace: bool,
                  started: str, ran: str = "") -> dict[str, str]:
    """The texts of a node's prompt by name ("" where one has none)."""
    wf, settings = ctx.workflow, ctx.settings
    nodes = wf.nodes
    node = nodes[node_id]
    budget = int(settings.context_chars)
    sources = wf.ancestors(node_id) if settings.context == "ancestors" else wf.parents(node_id)
    done = [(p, nodes[p]) for p in sources if nodes[p].status == Status.DONE]
    texts = [shown_above(n.output or "", ran) for _, n in done]
    lengths = [len(t) for t in texts]
    # Results that fit together are given whole (what `shares` would allow them anyway).
    allowed = lengths if sum(lengths) <= budget else shares(lengths, budget)
    inputs = "\n\n".join(f"[{p}] ({n.agent}): {t if len(t) <= k else cut(t, k)}"
                         for (p, n), t, k in zip(done, texts, allowed))
    later = "\n".join(f"- {nodes[c].requirement}" for c in wf.children(node_id))
    task, shared = _task_texts(wf.task or "", budget)
    parts = {"agent": node.agent, "task": shared,
             "subtask": f"Your subtask ({node_id}):\n{node.requirement}",
             "inputs": f"Results of earlier subtasks:\n{inputs}" if inputs else "",
             "note": "", "later": f"Later subtasks will build on your result:\n{later}" if later else "",
             "how": "", "files": "", "session": "", "retry": retry_note,
             "started": f"{started}\n\nThose are real results on the input. Use them; write "
                        "more code only for what your subtask still needs." if started else "",
             "end": END}
    if allowed is not lengths:
        shortened = [p for (p, _), t, k in zip(done, texts, allowed) if len(t) > k]
        if shortened:
            parts["note"] = (f"Note: the results of {', '.join(shortened)} were too long for "
                             "your context and were cut where marked [cut here]; do not guess "
                             "what is missing.")
    if settings.execute != "off" and (
            about_files_or_code(task, node.requirement) or (workspace and ctx.inputs)):
        made = [f for a in wf.ancestors(node_id) if nodes[a].status == Status.DONE
                for f in made_files(nodes[a].execution)]
        parts["how"] = instructions(ctx.workspace.describe() if workspace else "", [],
                                    ctx.workspace.example() if workspace and not started else "",
                                    ran)
        parts["files"] = files_line(made) if made else ""
        # what this node's code finds in the session (its ancestors' names): the node's own
        parts["session"] = (session_text(names_for(wf, node_id, ctx.workspace)) if workspace
                            else "")
        tables = workspace and any(t.kind == "table" for t in ctx.workspace.inputs)
        if tables and computes(node.requirement):
            parts["end"] = CODE_END
    return parts


class NodeRunner:
    """`await runner.run(node_id) -> Outcome`, the executor's work for a flow's run."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self._opening: asyncio.Future | None = None   # the run's first look (`_open`)
        self._starts: dict = {}   # node -> its working start, run before the first calls
        self._ran = ""            # the report of the working start's run, once it ran well
        self._started = False     # this runner ran the working start (once per run)

    async def _opened(self) -> None:
        """Wait for `_open`, which the first node to run in this runner starts (a node
        cancelled while it waits does not cancel it for the others)."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        if self._opening.done():   # (then a node does not wait a loop turn for it)
            self._opening.result()
        else:
            await asyncio.shield(self._opening)

    async def _open(self) -> None:
        """Before the first model call of the nodes this run starts together: the working
        start (when one of them wants it), so that every call shows its real output in the
        start they share (`instructions(ran=...)`), or the run of it that a done node holds."""
        wf = self.ctx.workflow
        held = start_run(wf)
        if held is not None:
            self._ran = report(held)
            return
        running = [i for i in wf.order() if wf.nodes[i].status == Status.RUNNING]
        for node_id in running:   # a node that led it runs again: that run, not a new one
            again = self._start_again(wf.nodes[node_id])
            if again is not None:
                self._starts[node_id] = again
                return
        for node_id in running:
            node = wf.nodes[node_id]
            if self._wants_starter(node):
                try:
                    ex = await self._starter(node)
                except (SandboxError, WorkspaceError) as exc:   # that node fails with it
                    self._starts[node_id] = exc
                    return
                self._starts[node_id] = ex
                self._ran = shared_report(ex)
                return

    def _chance(self, node_id: str, what: str, attempt: int = 0) -> float:
        return random.Random(f"{self.ctx.settings.seed}:{node_id}:{what}:{attempt}").random()

    def _verdict_now(self, text: str, finish_reason: str | None) -> tuple[bool, str] | None:
        """The verdict when no validator is needed to give it (None: ask `_verdict`)."""
        if finish_reason == "content_filter":   # what there is was cut by the endpoint's filter
            return False, "the endpoint's content filter stopped the answer; rephrase the subtask"
        if not (text or "").strip():   # under every mode: an empty answer did not do the work
            return False, "empty answer"
        if self.ctx.settings.validate_ == "none":
            return True, ""
        return None

    async def _verdict(self, node, text: str, code_ran: bool = False, record: dict | None = None):
        """The validator's verdict (after `_verdict_now` said one is needed); `record` is
        told when the judge (a model call) gives it."""
        mode = self.ctx.settings.validate_
        if mode == "llm" and record is not None:
            record["judged"] = True
        from .validation import validate
        verdict = await validate(node, text, task=self.ctx.workflow.task, mode=mode,
                                 llm=self.ctx.llm, model=self.ctx.settings.validator_model
                                 or self.ctx.settings.model, run_id=self.ctx.run_id,
                                 max_tokens=self.ctx.settings.max_tokens,
                                 run_output_code=not code_ran,
                                 sandbox=self.ctx.settings.sandbox,
                                 code_timeout=float(self.ctx.settings.code_timeout))
        return verdict.passed, scrub(verdict.feedback)

    def _may_execute(self, answer: str) -> bool:
        """Whether `_execute` can have anything to do: execution is on and the answer holds
        a fence (most answers of a text workflow hold none: no coroutine for them)."""
        return self.ctx.settings.execute != "off" and has_fence(answer)

    async def _execute(self, node_id: str, answer: str):
        """Save the answer's named files and run its Python in the sandbox, when
        `_may_execute` said so (None when the answer held nothing to save or run: a text
        node carries no record of code that never was)."""
        settings = self.ctx.settings
        # a validator still has to judge the answer: its code's names wait for the verdict
        ex = await aexecute(self.ctx.workspace, node_id, answer, mode=settings.execute,
                            timeout=float(settings.code_timeout), sandbox=settings.sandbox,
                            session=self.ctx.session, hold=settings.validate_ != "none")
        return ex if ex.ran or ex.saved or not ex.ok else None

    def _code_feedback(self, node_id: str, record: dict, attempts: list[dict]) -> str:
        """The retry's feedback on a failed code run (engine/diagnosis.py)."""
        workspace = self.ctx.workspace
        feedback = code_feedback(record["execution"], node_id=node_id,
                                 columns=workspace.columns(), files=workspace.files(),
                                 earlier=attempts)
        return feedback + ("\n" + _RESTART.strip() if workspace.example() else "")

    def _loose_numbers(self, node_id: str, text: str, record: dict) -> list[str]:
        """The numbers the answer's text states that no executed output of the node or of
        its ancestors holds (engine/numbers.py); [] when neither code ran there nor the run
        has inputs (a text-only flow has nothing to trace to)."""
        ctx = self.ctx
        if ctx.settings.execute == "off":
            return []
        wf = ctx.workflow
        # What the answer states first: most answers state no number that needs tracing, and
        # then no ancestor need be looked at (a walk of the graph per node, O(|V||E|) a run).
        stated = stated_numbers(strip_claims(text), (wf.task or "", wf.nodes[node_id].requirement))
        if not stated:
            return []
        own = record.get("execution") or {}
        runs = [own] + [wf.nodes[a].execution or {} for a in wf.ancestors(node_id)
                        if wf.nodes[a].status == Status.DONE]
        if not any(r.get("ran") for r in runs) and not ctx.inputs:
            return []
        lines = [(node_id, line) for line in printed_lines(own)] + [
            pair for pair in output_lines(wf, node_id) if pair[0] != node_id]
        return untraced(trace(stated, lines))
    async def _settle(self, ex, record: dict, keep: bool) -> None:
        """Keep (or discard) the names of an answer's code that ran well and waited for the
        validator's verdict in the session."""
        if ex is None or not ex.ok or ex.kept or ex.seq is None:
            return
        session = self.ctx.session
        if session is None:
            return
        said = await asyncio.to_thread(session.settle, keep)
        ex.kept = bool(said.get("kept"))
        if isinstance(said.get("names"), list):   # discarded: the names held before it
            ex.names = said["names"]
        if isinstance(record.get("execution"), dict):
            record["execution"].update(kept=ex.kept, names=ex.names)

    def _start_again(self, node) -> Execution | None:
        """The working start's run that `node` led in an earlier attempt (it runs again),
        taken as it ran and shared by the calls from now on; None when it led none."""
        again = earlier_start(node)
        if again is None:
            return None
        ex = Execution.from_dict(again)
        self._ran = shared_report(ex)
        return ex

    def _wants_starter(self, node) -> bool:
        """Whether this node runs the working start first (see the `starter` setting)."""
        ctx, settings = self.ctx, self.ctx.settings
        if settings.execute == "off" or settings.starter == "off" or node.attempts:
            return False
        if not ctx.inputs:   # no input, no example (the usual text workflow stops here)
            return False
        wf = ctx.workflow   # a node that explores the data, or a first node of a task that does
        explores = _EXPLORES.search(node.requirement or "") or (
            _task_explores(wf.task or "") and not wf.parents(node.id))
        if not explores:   # (checked before the endpoint: most nodes stop here)
            return False
        if settings.starter == "auto":
            from ..llm.endpoints import resolve
            try:
                endpoint, _ = resolve(node.model or settings.model)
            except FlowError:
                return False
            if not endpoint.local:
                return False
        # Last, as it reads every node (a check per node over all nodes was O(|V|^2) a run).
        if self._started or self._ran or any(ran_start(n.execution) for n in wf.nodes.values()):
            return False   # once per run: one real look at the data, not one per node
        return bool(ctx.workspace.example())

    async def _starter(self, node) -> Execution:
        """Run the working start in the sandbox for a node (when `_wants_starter`).
        Its code is flowmagic's, from the input's own columns; what it prints and draws is
        computed from the data, and the record says whose code it was."""
        settings = self.ctx.settings
        node.execution = {"starter": True}   # claimed now: a sibling starting meanwhile skips it
        self._started = True
        try:
            ex = await asyncio.to_thread(run_python, self.ctx.workspace, node.id,
                                         self.ctx.workspace.example(),
                                         timeout=float(settings.code_timeout),
                                         sandbox=settings.sandbox, session=self.ctx.session)
        finally:
            node.execution = None
        ex.starter = True
        return ex

    def _on_embedded_data(self, node) -> bool:
        """The node runs on the embedded model in a flow on data."""
        return embedded_on_data(node.model or self.ctx.settings.model, self.ctx.inputs)

    def _limits_of(self, node) -> _Limits:
        """The node's attempts and continuations: the settings', or where they leave them to
        the endpoint (None), ATTEMPTS and CONTINUATIONS, fewer on the embedded model in a
        flow on data (EMBEDDED_DATA_*)."""
        attempts, continuations = self.ctx.settings.max_attempts, self.ctx.settings.continuations
        if attempts is None or continuations is None:
            embedded = self._on_embedded_data(node)
            if attempts is None:
                attempts = EMBEDDED_DATA_ATTEMPTS if embedded else ATTEMPTS
            if continuations is None:
                continuations = EMBEDDED_DATA_CONTINUATIONS if embedded else CONTINUATIONS
        return _Limits(int(attempts), int(continuations))

    def _options(self, node, seed: int) -> dict:
        """The door's options of the node's call."""
        ctx, settings = self.ctx, self.ctx.settings
        return dict(model=node.model or settings.model, seed=seed,
                    temperature=settings.temperature, max_tokens=settings.max_tokens,
                    run_id=ctx.run_id, node_id=node.id, purpose="node",
                    on_text=ctx.recorder.text_sink(node.id),
                    on_wait=ctx.recorder.wait_sink(node.id))

    def _answer(self, node, messages: list[dict], seed: int, limits: _Limits,
                record: dict | None = None):
        """The door's coroutine of the node's answer, without tools. Given the attempt's
        `record`, the calls' log rows go to the flow (`ctx.defer_log`), which writes them in
        the commit of the node's next state and puts the last one's id in the record."""
        defer = self.ctx.defer_log
        return self.ctx.llm.complete_whole(
            messages, continuations=limits.continuations,
            defer_log=None if defer is None or record is None else partial(defer, record=record),
            **self._options(node, seed))

    async def _reply(self, node, messages: list[dict], seed: int, limits: _Limits):
        """(reply, tool calls): the node's answer, through the tool loop when tools are offered
        (`run` asks the door directly when the flow offers none: no coroutine of this one;
        the tool loop continues no answer)."""
        ctx, settings = self.ctx, self.ctx.settings
        offered = await ctx.tools.offer(node, settings, ctx.llm)
        if not offered:
            return await self._answer(node, messages, seed, limits), []
        kwargs = self._options(node, seed)
        from .toolloop import run_with_tools

        def called(call) -> None:
            ctx.recorder.tool_call(node.id, call)

        result = await run_with_tools(
            ctx.llm, messages, offered, max_rounds=int(settings.tool_rounds),
            timeout_s=settings.tool_timeout_s, protocol=settings.tool_protocol,
            on_call=called, **kwargs)
        reply = result.reply
        reply.cut = reply.finish_reason == "length"   # the tool loop does not continue answers
        reply.text = scrub(reply.text)   # it may be taken out of an action's JSON
        return reply, result.calls

    def _answers(self, node_id: str, ex) -> bool:
        """Whether a run that printed nothing had to print: the code of a last subtask (no
        later one reads its names) of a task whose answer has a prescribed form, which the
        summary fills from what the code printed."""
        wf = self.ctx.workflow
        return (not str(ex.stdout or "").strip() and not wf.children(node_id)
                and prescribed(wf.task or "") is not None)

    async def run(self, node_id: str) -> Outcome:
        ctx, settings = self.ctx, self.ctx.settings
        node = ctx.workflow.nodes[node_id]
        history = len(node.attempts)   # earlier runs of this node (reruns vary the seed)
        outcome = Outcome(ok=False)
        await self._opened()
        start = self._starts.pop(node_id, None)
        try:
            if isinstance(start, Exception):
                raise start
            if start is None and not (self._ran or self._started):   # one that starts later
                start = self._start_again(node)   # and led it before (its parent was rerun)
            if start is None and self._wants_starter(node):   # a node that starts later
                start = await self._starter(node)
                self._ran = self._ran or shared_report(start)
        except (SandboxError, WorkspaceError) as exc:   # the model won't fix that
            return _failed_start(outcome, exc, history)
        limits = self._limits_of(node)
        tries = _Tries(history, start, limits.attempts)
        attempts, attempt = tries.attempts, -1
        while (attempt := attempt + 1) < tries.limit:
            record = self._record(node, tries, attempt)
            if settings.fail_rate and self._chance(node_id, "fail", history + attempt) < settings.fail_rate:
                _failed(attempts, record, output=None, error="injected failure (fail_rate)")
                continue
            # the working start's run: in the start every call shares, once it ran well
            shared = bool(self._ran) and tries.start_report == self._ran
            messages = node_messages(ctx, node_id, ran=self._ran,
                                     started="" if shared else tries.start_report)
            if attempts:   # the conversation goes on: the server's prefix covers the last try
                messages = _continued(messages, retry_turns(attempts, node_id, _end_of(messages)))
            try:
                seed = settings.seed + history + attempt
                reply, tool_calls = (await self._reply(node, messages, seed, limits)
                                     if ctx.tools.any()
                                     else (await self._answer(node, messages, seed, limits,
                                                              record), ()))
            except EndpointError as exc:
                _stopped(outcome, attempts, record, output=None, error=str(exc))
                break   # the LLM door already retried; more attempts would only wait longer
            text = self._take(outcome, record, reply, tool_calls, seed)
            if _unfinished(attempts, record, reply):
                continue
            # a text sent back for its numbers keeps its code's run (not run twice in the session)
            shown, ex = (text, None) if tries.kept is None else (without_code(text), tries.kept)
            if tries.kept is None and self._may_execute(text):
                try:
                    ex = await self._execute(node_id, text)
                except SandboxError as exc:   # code must run and cannot here: retrying won't help
                    _stopped(outcome, attempts, record, error=str(exc))
                    break
                except WorkspaceError as exc:   # what another node left in the workspace: this node only
                    _failed(attempts, record, feedback=f"The workspace refused: {exc}")
                    continue
            output = self._output(node_id, record, shown, ex, tries)
            if output is None:   # the answer's code failed, or a file of it was not saved
                continue
            keep = False   # the names of the answer's code, when they wait for the verdict
            try:
                said = self._verdict_now(output, reply.finish_reason)
                if (said is None or said[0]) and ex is not None:
                    hollow = hollow_result(ex.to_dict(), last=self._answers(node_id, ex))
                    said = (False, hollow) if hollow else said
                passed, feedback = (said if said is not None else
                                    await self._verdict(node, output, bool(ex and ex.ran), record))
                keep = passed
            except EndpointError as exc:   # the judge's endpoint is down: keep the output
                keep = True
                _unjudged(outcome, attempts, record, output, exc)
                break
            except SandboxError as exc:   # code must run and cannot here: retrying won't help
                _stopped(outcome, attempts, record, error=str(exc))
                break
            finally:
                if ex is not None:   # (a text answer ran no code: no coroutine for it)
                    await self._settle(ex, record, keep)
            if self._conclude(node_id, tries, attempt, record, (shown, ex, output),
                              (passed, feedback), outcome):
                if not tool_calls:   # the prompt and answer it passed with, for the summary;
                    # the last node's only (a summary continues one node's: a large flow's
                    # prompts are not all held)
                    ctx.conversations.clear()
                    ctx.conversations[node_id] = (outcome.output, [
                        *messages, {"role": "assistant", "content": text}])
                break
        return self._finish(node_id, tries, outcome)

    def _record(self, node, tries: "_Tries", attempt: int) -> dict:
        """A new attempt's record (its model: the one asked for, until a reply names its own)."""
        return {"start": time.time(), "attempt": tries.history + attempt + 1,
                "model": node.model or self.ctx.settings.model or "default",
                "why": attempt_why(tries.attempts, tries.history)}

    def _take(self, outcome: Outcome, record: dict, reply, tool_calls, seed: int) -> str:
        """The reply counted (spent, tokens) and written into the attempt's record; its text."""
        self.ctx.budget.spend(reply.cost_usd, unpriced=None if reply.priced else reply.model)
        outcome.tokens_in += reply.input_tokens
        outcome.tokens_out += reply.output_tokens
        outcome.cost_usd += reply.cost_usd
        # A key that reached a model's answer is stored nowhere. The LLM door scrubbed a
        # fresh answer already; one from the cache (a key configured since) or joined from
        # continuations (a key across two pieces) is scrubbed here (the tool loop's in _reply).
        text = reply.text if not (reply.cached or reply.continuations) else scrub(reply.text)
        # (a call_id of None is filled in by the flow when it writes the deferred log row)
        record.update(output=text, call_id=reply.call_id, cache_key=reply.cache_key,
                      model=reply.model, cached=reply.cached,
                      tokens_in=reply.input_tokens, tokens_out=reply.output_tokens,
                      cost_usd=reply.cost_usd, seed=seed)
        if not reply.priced:   # 0.0 above is "no price known", not "free"
            record["unpriced"] = True
        if tool_calls:
            record["tool_calls"] = [c.to_dict() for c in tool_calls]
        if reply.continuations:
            record["continuations"] = reply.continuations
        return text

    def _output(self, node_id: str, record: dict, shown: str, ex: Execution | None,
                tries: "_Tries") -> str | None:
        """The node's output of this answer, its code's run and the working start's in it;
        None when the answer failed on its code (the record then says why)."""
        output = strip_claims(shown)   # the model's guesses at its output are no result
        start = tries.start
        if ex is not None:
            record["execution"] = ex.to_dict()
            if ex.ran and not ex.ok:   # what went wrong, as a fix needs it, goes back
                record.update(end=time.time(), passed=False,
                              feedback=self._code_feedback(node_id, record, tries.attempts))
                tries.attempts.append(record)
                return None
            if not ex.ok:   # a file name that cannot be saved: nothing of the answer ran
                record.update(end=time.time(), passed=False,
                              feedback=f"A file of the answer was not saved: {ex.error}")
                tries.attempts.append(record)
                return None
            said = said_once(report(record["execution"]), ex, start)
            if said:
                output = f"{output.rstrip()}\n\n{said}"
        if start is not None:   # the working start's real results lead the node's result
            output = f"{tries.start_report}\n\n{output}"
            if ex is None or not ex.ran:
                record["execution"] = {**start.to_dict(), "saved": ex.saved if ex else []}
            else:   # both ran: the export shows the start's cell (its figures) before the model's
                record["execution"][WORKING_START] = start.to_dict()
        return output

    def _conclude(self, node_id: str, tries: "_Tries", attempt: int, record: dict,
                  answer: tuple, verdict: tuple, outcome: Outcome) -> bool:
        """After the verdict: an answer whose numbers trace to no output is sent back once
        (naming them, even after the last attempt), else marked; the attempt is recorded and
        a passed one is the node's outcome (True: the attempts are over)."""
        (shown, ex, output), (passed, feedback) = answer, verdict
        loose = self._loose_numbers(node_id, shown, record) if passed else []
        if loose and not tries.sent_back:
            tries.sent_back, tries.kept = True, ex
            tries.limit += attempt + 1 == tries.limit
            record.update(end=time.time(), passed=False, untraced=loose,
                          feedback=numbers_feedback(loose, bool(ex and ex.ran)))
            tries.attempts.append(record)
            return False
        if loose:   # still: marked where the output is read
            record["untraced"] = loose
            output += f"\n\n{untraced_mark(loose)}"
        record.update(end=time.time(), passed=passed, feedback=feedback)
        tries.attempts.append(record)
        if passed:
            outcome.ok, outcome.output = True, output
            outcome.execution = record.get("execution")
        return outcome.ok

    def _finish(self, node_id: str, tries: "_Tries", outcome: Outcome) -> Outcome:
        """The outcome once the attempts are over: the working start when the model's answers
        were unusable, one line of why it failed, an injected mask."""
        attempts, start = tries.attempts, tries.start
        if not outcome.ok and outcome.error is None and start is not None:
            fall_back_on_start(outcome, attempts, start, tries.start_report)
        if not outcome.ok and start is not None and attempts and not attempts[-1].get("execution"):
            attempts[-1]["execution"] = start.to_dict()   # it ran: a failed node still shows it
        outcome.attempts = attempts
        if not outcome.ok and outcome.error is None:
            last = attempts[-1] if attempts else {}
            why = " ".join(str(last.get("feedback") or last.get("error") or "no output").split())
            outcome.error = f"failed {len(attempts)} attempt(s); last: {why[:300]}" + ("…" if len(why) > 300 else "")  # one line
        if (outcome.ok and not tries.history and self.ctx.settings.mask_rate
                and self._chance(node_id, "mask") < self.ctx.settings.mask_rate):
            attempts[-1]["masked"] = True
            outcome.output, outcome.masked = MASKED, True
        return outcome


@dataclass(frozen=True)
class _Limits:
    """How many attempts a node gets, and how often a cut answer of it is continued."""
    attempts: int
    continuations: int


@dataclass
class _Tries:
    """One node's attempts in this run, and what they carry from one to the next."""
    history: int                 # attempts of earlier runs of the node (reruns vary the seed)
    start: Execution | None      # the working start's run, when the node has one
    limit: int                   # attempts allowed (one more after a late send-back)
    attempts: list = field(default_factory=list)
    sent_back: bool = False      # an answer was sent back once for its numbers
    kept: Execution | None = None   # that answer's code run, which the new text keeps
    start_report: str = field(init=False)

    def __post_init__(self) -> None:
        self.start_report = report(self.start) if self.start is not None else ""


def _end_of(messages: list[dict]) -> str:
    """What the node's prompt asks it to answer (a retry's feedback ends the same way)."""
    return CODE_END if messages[-1]["content"].endswith(CODE_END) else END


def _continued(messages: list[dict], turns: list[dict]) -> list[dict]:
    """The prompt followed by the retry's turns; feedback on an attempt that got no answer
    (an injected failure) joins the prompt's own user message."""
    if turns and turns[0]["role"] == "user":
        last = messages[-1]
        messages = messages[:-1] + [{**last, "content": f"{last['content']}\n\n{turns[0]['content']}"}]
        turns = turns[1:]
    return messages + turns


def _failed_start(outcome: Outcome, exc: Exception, history: int) -> Outcome:
    outcome.error, outcome.attempts = str(exc), [{"start": time.time(), "end": time.time(),
                                                  "attempt": history + 1, "passed": False,
                                                  "error": str(exc)}]
    return outcome


def _failed(attempts: list, record: dict, **fields) -> None:
    """A failed attempt, recorded: `fields` say why."""
    record.update(end=time.time(), passed=False, **fields)
    attempts.append(record)


def _stopped(outcome: Outcome, attempts: list, record: dict, **fields) -> None:
    """A failed attempt that ends the node's attempts (retrying cannot help)."""
    _failed(attempts, record, **fields)
    outcome.error = fields["error"]


def _unjudged(outcome: Outcome, attempts: list, record: dict, output: str, exc: Exception) -> None:
    """The validator's endpoint is down: the output is kept, and the record says why."""
    record.update(end=time.time(), passed=True, feedback=f"validator unavailable: {exc}")
    attempts.append(record)
    outcome.ok, outcome.output = True, output
    outcome.execution = record.get("execution")


def _unfinished(attempts: list, record: dict, reply) -> bool:
    """A cut or empty answer is never a passed node, whatever the validator says: True when
    this one is (recorded as failed)."""
    if not (reply.cut or not (reply.text or "").strip()):
        return False
    why = (CUT_FEEDBACK.format(tokens=reply.output_tokens, n=reply.continuations)
           if reply.cut else "empty answer: the model wrote nothing")
    record.update(end=time.time(), passed=False, feedback=why, cut=reply.cut)
    attempts.append(record)
    return True


def embedded_on_data(model: str | None, inputs) -> bool:
    """Whether `model` is the embedded model and `inputs` hold a table (a flow on data)."""
    if not any(t.kind == "table" for t in inputs):
        return False
    from ..llm.endpoints import resolve
    try:
        endpoint, _ = resolve(model)
    except FlowError:
        return False
    return endpoint.local
