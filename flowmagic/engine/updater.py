"""The global updater: ask a model how to revise the plan from progress so far.

`build_update_prompt` says why the updater was called, shows every subtask with its
status, failures with their feedback and the outputs of done subtasks within a character
budget, and asks (as the Flow paper's D.3 prompt does) whether finished outputs are
sufficient, for a modular, parallel plan and for a rationale. `propose` asks for K candidate
updates concurrently (uncapped; a cut-off answer is continued), reads each through the gate
(`answers.update_from_answer`: a field an update may not give refuses it), merges each onto a copy of
the workflow by node id (see `merge`, re-exported here) and chooses one: a candidate that
changes a node whose failure or empty result called the update beats one that does not,
then the planner's rule decides (`planner.select`: coverage, speed-up, Theorem 1's
expected successes). A candidate that fails is recorded with its
error; when all fail the result is a no-change, so an update never crashes a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..model import metrics
from ..errors import FlowError
from .._internal.aio import gather_all
from .._internal.text import cut, short_repr
from ..model.answers import update_from_answer
from ..model.graph import Workflow
from ..model.merge import DIFF_KEYS, merge, stats
from ..model.status import Status
from .plan_selection import BaseCandidate
from .prompt_start import HOUSE_RULES

__all__ = ["UPDATE_SCHEMA", "UPDATE_MAX_TOKENS", "TRIGGER_KINDS", "DIFF_KEYS", "UpdateCandidate", "UpdateResult",
           "build_update_prompt", "merge", "stats", "propose"]

# The answer _RULES asks for; merge also reads looser shapes that small models write.
_SUBTASK = {"type": "object", "required": ["id"], "properties": {
    "id": {"type": "string"}, "requirement": {"type": "string"}, "agent": {"type": "string"},
    "depends_on": {"type": "array", "items": {"type": "string"}}, "rerun": {"type": "boolean"}}}
UPDATE_SCHEMA = {"type": "object", "required": ["action"], "properties": {
    "rationale": {"type": "string"},
    "action": {"enum": ["no_change", "update"]}, "subtasks": {"type": "array", "items": _SUBTASK},
    "remove": {"type": "array", "items": {"type": "string"}}}}
# Why the updater was called: a node failed, came back empty ("none" included), or finished.
TRIGGER_KINDS = ("failed", "empty", "finished")
_PROBLEMS = ("failed", "empty")
_CONTINUATIONS = 2   # a cut-off answer is continued at most this many times
# Room for a multi-node restructure (the old 512 cut one and it became "no change"), yet a
# bound on a small model that rambles; an answer cut here is continued.
UPDATE_MAX_TOKENS = 2048
# The done results shown, in characters in all (see _fit_outputs). On the embedded model every
# prompt token is ~9 ms of evaluation on its one thread, and csv_eda's update request was the
# longest prompt of its run (2,382 tokens, ~1,100 of them results at 6,000): there each result
# is shown by its head and tail in a quarter of that.
RESULTS_CHARS, EMBEDDED_RESULTS_CHARS = 6000, 1500


# ---------------------------------------------------------------------------- the prompt
_SYSTEM = ("You are the global updater of a team of agents working through a plan of "
           "subtasks. From the progress so far, decide whether the rest of the plan still "
           "reaches the goal, and revise it only where that helps. Answer with JSON only.")
# The Flow paper's update prompt (its appendix D.3) asks first whether the finished results
# are sufficient; its P_update asks for a modular, parallel plan. Both are said here.
_CHECKS = """Before you answer:
1. Check every done subtask's result: is it sufficient for the subtasks that build on it and for the task? A result that is empty, "none", cut off, an error message or off the point is NOT sufficient: set "rerun": true on that subtask (give it a clearer requirement if that helps), or add a subtask that supplies what is missing.
2. Fix every failed subtask: give it a clearer requirement or another agent, or remove it and add a replacement.
3. Keep the plan modular and parallel: each subtask does one thing; subtasks that do not need each other's results must not depend on each other; add no dependency that is not needed."""
_RULES = """Answer with one JSON object; "rationale" comes first and says in one or two sentences why you change what you change (or why nothing needs to change):
- if the plan needs no change: {"rationale": "...", "action": "no_change"}
- otherwise: {"rationale": "...", "action": "update", "subtasks": [{"id": "...", "requirement": "...", "agent": "...", "depends_on": ["..."], "rerun": false}], "remove": ["..."]}
Rules:
- "subtasks" lists ONLY subtasks to add or change. Subtasks you leave out stay exactly as they are; they are NOT deleted.
- A new id adds a subtask (ids: lowercase letters, digits and _). "depends_on" replaces a subtask's dependencies.
- Done subtasks keep their results. Set "rerun": true only if a done subtask must be redone; everything after it will run again too.
- Running subtasks cannot be changed.
- A failed subtask you list runs again: give it a clearer requirement or another agent, or remove it and add a replacement.
- "remove" lists ids of subtasks that are no longer needed; their dependents inherit their dependencies."""


def _cut(text: str, limit: int) -> str:
    """Two thirds head, one third tail, in `limit` characters; under 20, just "[cut]"."""
    return cut(text, limit, " [cut] ", head=limit * 2 // 3, fit=True, least=20)


def _fit_outputs(wf: Workflow, budget: int) -> dict[str, str]:
    """Outputs of done nodes within `budget` characters in all.

    The longest are cut first (they share one cap); when even the cap is too small to be
    useful, the earliest finished outputs are dropped whole, each shown as "[cut]".
    """
    done = [i for i, n in wf.nodes.items() if n.status == Status.DONE]
    done.sort(key=lambda i: (wf.nodes[i].end or 0.0, list(wf.nodes).index(i)))
    texts = {i: wf.nodes[i].output or "" for i in done}
    dropped: list[str] = []
    while done:
        lengths, left, cap = sorted(len(texts[i]) for i in done), max(budget, 0), None
        for k, length in enumerate(lengths):
            if length * (len(lengths) - k) > left:
                cap = left // (len(lengths) - k)
                break
            left -= length
        if cap is None or cap >= 120:
            break
        dropped.append(done.pop(0))
    out = {i: "[cut]" for i in dropped}
    out.update({i: _cut(texts[i], cap) if cap is not None else texts[i] for i in done})
    return out


def _node_line(wf: Workflow, node_id: str) -> str:
    n = wf.nodes[node_id]
    if n.status == Status.PRUNED:
        return f"- {node_id} [removed]"
    flags = n.status + (", stale" if n.stale else "")
    line = (f"- {node_id} [{flags}] agent: {n.agent}; depends on: "
            f"{', '.join(wf.parents(node_id)) or 'nothing'}\n  requirement: {_cut(n.requirement, 500)}")
    if n.status == Status.FAILED:
        last = n.attempts[-1] if n.attempts else {}
        why = str(n.error or last.get("error") or "no reason recorded")
        feedback = str(last.get("feedback") or "")
        line += f"\n  failed: {_cut(_said_once(why, feedback), 300)}"
        if feedback:
            line += f"\n  reviewer: {_cut(feedback, 400)}"
    return line


def _said_once(why: str, feedback: str) -> str:
    """The failure without the last attempt's feedback when it quotes it ("failed 2
    attempt(s); last: <the feedback>"): the reviewer's line says it whole, once."""
    head, sep, quoted = why.partition("; last: ")
    same = sep and feedback and " ".join(quoted.split())[:60] == " ".join(feedback.split())[:60]
    return head if same else why


def _why(wf: Workflow, trigger: list[dict] | None) -> str:
    """One line per event that called the updater, in plan order (not arrival order, so
    the prompt, and its cache key, do not depend on which node finished first). An empty
    or "none" result is said as "finished": the updater reads the results itself (the
    sufficiency check), so a masking experiment does not tell it which output was masked."""
    lines = []
    order = {node_id: i for i, node_id in enumerate(wf.nodes)}
    for t in sorted(trigger or [], key=lambda t: order.get(t.get("node"), len(order))):
        node_id, kind = t.get("node"), t.get("why")
        if node_id not in wf.nodes:
            continue
        lines.append(f"- subtask {node_id} " + ("failed" if kind == "failed" else "finished"))
    return "\n".join(lines) or "- a check of the plan between subtasks"


def build_update_prompt(workflow: Workflow, *, budget_chars: int = 6000,
                        trigger: list[dict] | None = None, start: str | None = None) -> list[dict]:
    """Chat messages asking for an update: why it was called (`trigger`: [{"node", "why"}],
    why one of TRIGGER_KINDS), the task, every node with its status, requirement and
    dependencies, failures with their feedback, the outputs of done nodes cut to
    `budget_chars` in all, the sufficiency and structure checks, and the answer's form.

    `start` (prompt_start.flow_start: a flow on input files) lays the request out as a call
    of the flow: the house rules, that start (it holds the task), then the updater's part, so
    a server's prompt cache evaluates only what follows the start its nodes' prompts share
    (on csv_eda's embedded flows the update was the largest prompt of the run, ~2,400 tokens
    with 5 reused)."""
    wf = workflow
    nodes = "\n".join(_node_line(wf, i) for i in wf.nodes)
    outputs = _fit_outputs(wf, budget_chars)
    results = "\n\n".join(f"[{i}]\n{outputs[i]}" for i in wf.nodes if i in outputs)
    task = "" if start else f"Task:\n{_cut(wf.task or '(no task text)', 2000)}\n\n"
    user = (f"You were called because:\n{_why(wf, trigger)}\n\n{task}"
            f"Subtasks (plan order):\n{nodes or '(none)'}\n\n"
            f"Results of done subtasks:\n{results or '(none yet)'}\n\n{_CHECKS}\n\n{_RULES}")
    if start:
        return [{"role": "system", "content": HOUSE_RULES},
                {"role": "user", "content": f"{start}\n\n{_SYSTEM}\n\n{user}"}]
    return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------- proposing
@dataclass
class UpdateCandidate(BaseCandidate):
    index: int
    seed: int
    workflow: Workflow | None = None
    diff: dict | None = None
    stats: dict | None = None
    scores: dict = field(default_factory=dict)
    update: Any = None          # the model's answer as the gate read it (canonical form)
    raw: str = ""
    error: str | None = None    # "<ErrorClass>: <one line>" when unusable
    no_change: bool = False
    addresses: bool = False     # it changes a node whose failure or empty result called the update
    rationale: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    call_id: int | None = None


@dataclass
class UpdateResult:
    workflow: Workflow          # the merged workflow (a copy of the input when no change)
    diff: dict
    stats: dict
    candidates: list[UpdateCandidate]
    chosen: int | None          # index of the chosen candidate, None when all failed
    no_change: bool
    raw: str | None             # the chosen answer's text
    update: Any = None          # the chosen parsed update, to merge again onto a live workflow
    before: Workflow | None = None
    errors: list[str] = field(default_factory=list)
    rationale: str = ""         # the chosen answer's "rationale"

    def to_dict(self) -> dict:
        return {"workflow": self.workflow.to_dict(), "diff": self.diff, "stats": self.stats,
                "candidates": [c.to_dict() for c in self.candidates], "chosen": self.chosen,
                "no_change": self.no_change, "raw": self.raw, "update": self.update,
                "errors": list(self.errors), "rationale": self.rationale}


def _score(wf: Workflow) -> dict:
    return metrics.shape(wf)


def _rule(candidates: list[UpdateCandidate]) -> int:
    """Flow's rule, as the planner applies it: max P_avg, then min complexity, then fewer nodes."""
    ok = [c for c in candidates if c.ok]
    return min(ok, key=lambda c: (-round(c.scores["parallelism"], 9),
                                  round(c.scores["dependency_complexity"], 9),
                                  c.scores["nodes"], c.index)).index


def _addresses(diff: dict, trigger: list[dict] | None) -> bool:
    """Whether the merged candidate changes a node whose failure or empty result called it."""
    problems = {t.get("node") for t in trigger or [] if t.get("why") in _PROBLEMS}
    touched = {i for key in ("rerun", "edited", "reassigned", "removed", "rewired")
               for i in diff.get(key, [])}
    return bool(problems & touched)


def _choose(candidates: list[UpdateCandidate], select: Callable | None, warn) -> UpdateCandidate:
    """A candidate that addresses the trigger beats one that does not (a fix beats "no
    change", which the structural rule alone cannot tell apart); among those, `select`
    (the planner's structural rule by default) decides."""
    ok = [c for c in candidates if c.ok]
    pool = [c for c in ok if c.addresses] or ok
    if select is None:
        try:
            from .planner import select
        except ImportError:
            select = _rule
    try:
        got = select(pool)
    except FlowError as exc:
        warn(f"the selection rule failed ({exc}); used max P_avg, min complexity")
        got = _rule(pool)
    by_index = {c.index: c for c in pool}
    chosen = got if isinstance(got, UpdateCandidate) else by_index.get(got) if isinstance(got, int) else None
    if chosen is None or not chosen.ok:
        warn(f"the selection rule returned {short_repr(got)}, not a usable candidate; "
             "used max P_avg, min complexity")
        chosen = by_index[_rule(pool)]
    return chosen


async def _ask(llm, messages: list, **kwargs):
    """The reply's parsed update; an answer cut off by a length limit is continued (at most
    _CONTINUATIONS times, by `LLM.complete_whole`) instead of being lost; one still cut
    raises. Returns (text, data, call_id, usage)."""
    reply = await llm.complete_whole(messages, continuations=_CONTINUATIONS,
                                     schema=UPDATE_SCHEMA, **kwargs)
    return reply.text, reply.data, reply.call_id, (reply.input_tokens, reply.output_tokens,
                                                   reply.cost_usd)


async def _candidate(before: Workflow, messages: list, i: int, *, llm, k: int, model, seed: int,
                     run_id, max_tokens, trigger) -> UpdateCandidate:
    cand = UpdateCandidate(index=i, seed=seed + i)
    try:
        cand.raw, data, cand.call_id, usage = await _ask(
            llm, messages, model=model, seed=seed + i, temperature=None if k == 1 else 0.7,
            run_id=run_id, max_tokens=max_tokens, purpose="update")
        cand.tokens_in, cand.tokens_out, cand.cost_usd = usage
        cand.update = update_from_answer(data)   # the gate: refused, or canonical and checked
        cand.workflow, cand.diff = merge(before, cand.update)
    except FlowError as exc:  # a failed candidate is recorded; an update never crashes a run
        cand.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        cand.cost_usd += getattr(exc, "cost_usd", 0.0) or 0.0
        cand.workflow = None
        return cand
    if isinstance(cand.update.get("rationale"), str):
        cand.rationale = _cut(" ".join(cand.update["rationale"].split()), 600)
    cand.stats = stats(cand.diff, before)
    cand.no_change = cand.stats["changed_tasks"] == 0
    cand.addresses = _addresses(cand.diff, trigger)
    cand.scores = _score(cand.workflow)
    return cand


def _results_chars(model: str | None) -> int:
    """The done results' budget for the model that answers: EMBEDDED_RESULTS_CHARS on the
    embedded model, RESULTS_CHARS on any other (one that cannot be resolved included)."""
    from ..llm.endpoints import resolve
    try:
        endpoint, _ = resolve(model)
    except FlowError:
        return RESULTS_CHARS
    return EMBEDDED_RESULTS_CHARS if endpoint.local else RESULTS_CHARS


async def propose(workflow: Workflow, *, llm: Any = None, k: int = 1, model: str | None = None,
                  seed: int = 0, run_id: str | None = None, select: Callable | None = None,
                  budget_chars: int | None = None, max_tokens: int | None = None,
                  trigger: list[dict] | None = None, start: str | None = None) -> UpdateResult:
    """Ask for K update candidates concurrently (seeds seed..seed+K-1), merge each, choose one.

    `trigger` says why the update was called ([{"node": id, "why": "failed" | "empty" |
    "finished"}]); the prompt says so, and a candidate that changes a failed or empty node
    beats one that does not. Among those, `select(candidates) -> index` decides, by default
    `flowmagic.engine.planner.select` (the planner's rule). When every candidate fails, the result
    is a no-change with the errors in `errors` and in the diff's warnings. `max_tokens`
    None sends no cap; an answer cut off anyway is continued. `budget_chars` (the done
    results shown) None: the model's (`_results_chars`). `start`: see `build_update_prompt`.
    """
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    before = workflow.copy()
    if budget_chars is None:
        budget_chars = _results_chars(model)
    messages = build_update_prompt(before, budget_chars=budget_chars, trigger=trigger,
                                   start=start)
    k = max(1, int(k))
    # A bug in one candidate's call cancels the others (a bare gather left them running).
    cands = await gather_all(
        _candidate(before, messages, i, llm=llm, k=k, model=model, seed=seed, run_id=run_id,
                   max_tokens=max_tokens, trigger=trigger) for i in range(k))
    errors = [f"candidate {c.index}: {c.error}" for c in cands if c.error]
    if not any(c.ok for c in cands):
        diff = {key: [] for key in DIFF_KEYS}
        diff["warnings"] = [f"no update: every candidate failed ({'; '.join(errors)})"]
        diff["kept_finished"] = [i for i, n in before.nodes.items() if n.status == Status.DONE]
        return UpdateResult(before.copy(), diff, stats(diff, before), cands, None, True, None,
                            None, before, errors)
    warnings: list[str] = []
    chosen = _choose(cands, select, warnings.append)
    chosen.diff["warnings"] = warnings + chosen.diff["warnings"]
    return UpdateResult(chosen.workflow, chosen.diff, chosen.stats, cands, chosen.index,
                        chosen.no_change, chosen.raw, chosen.update, before, errors,
                        chosen.rationale)
