"""Planning: ask a model for K candidate plans, repair and score each, pick one.

The K requests go out concurrently, each with its own seed (seed + i) and a modest
temperature so the plans differ. Every reply is repaired by `graph.parse_plan`, cut to
the caps (`max_subtasks`, `max_agents`) with a warning per cut, and scored with
`metrics`. A candidate whose reply could not be used keeps its one-line error and is
never chosen.

`select` reports Flow's P_avg and C_dependency but does not rank by them: P_avg is 1/depth,
so a one-node or dependency-free plan would always win. The rule (RULE) is, in order:
coverage (a connected plan with one final, integrating subtask beats a connected plan with
several loose ends, which beats one subtask or unconnected subtasks for a multi-step task);
the speed-up |V|/T (width-aware parallelism); Theorem 1's expected successes per subtask at
p = 0.1 (fewer dependencies, so Flow's Workflow 2 beats Workflow 1); fewer edges; fewer
nodes; the earlier candidate. Every usable candidate gets a one-line `note` saying why it
won or lost.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..model import metrics
from ..errors import ConfigError, EndpointError, ModelOutputError, PlanError
from ..model.graph import Workflow, parse_plan

__all__ = ["STRATEGIES", "RULE", "Candidate", "plan_schema", "planning_messages", "score",
           "coverage", "multi_step", "candidate_line", "plan_candidates", "select", "plan"]

TIE = 1e-9
FAILURE_P = 0.1
RULE = ("coverage (connected, one final subtask), then speed-up |V|/T, then Theorem 1's "
        f"expected successes per subtask at p={FAILURE_P}, then fewer edges, fewer nodes")
# strategy -> (instruction, usual subtask count as (lo, hi) or None)
STRATEGIES: dict[str, tuple[str, tuple[int, int] | None]] = {
    "balanced": ("Use as many subtasks as the task needs ({size}); balance their size "
                 "against how many can run at once.", (3, 7)),
    "coarse": ("Use few, large subtasks ({size}); each is a substantial piece of work.", (2, 4)),
    "fine": ("Use many small subtasks ({size}); each does one focused step.", (6, 12)),
    "critical-path": ("Make the longest chain of dependent subtasks as short as possible: add a "
                      "dependency only when a result is really needed. Give each subtask "
                      "\"estimate_s\", its estimated duration in seconds.", None),
}
HARD_MAX_K = 1000   # candidate plans per call, whatever max_k says (each one is a paid call)
_EXAMPLE_TASK = "Write a blog post about tea with a photo"
_EXAMPLE = [("facts", "List five facts about tea.", "researcher", [], 60),
            ("photo", "Describe a photo of a teacup.", "designer", [], 30),
            ("post", "Write the post from the facts and the photo.", "writer",
             ["facts", "photo"], 90)]
# Why a candidate failed, by error class, for PlanError's one-line summary.
_WHY = {"TruncatedError": "the answer was cut off by the token limit",
        "ModelOutputError": "the model did not answer with JSON",
        "PlanError": "the plan had no usable subtasks",
        "EndpointError": "the endpoint failed"}


@dataclass
class Candidate:
    index: int
    seed: int
    workflow: Workflow | None = None
    scores: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None         # "<ErrorClass>: <one line>" when the plan was unusable
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    call_id: int | None = None
    model: str | None = None
    latency_s: float = 0.0
    cached: bool = False
    note: str = ""                   # one line: why `select` chose it or not

    @property
    def ok(self) -> bool:
        return self.error is None and self.workflow is not None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "workflow"}
        d["workflow"] = self.workflow.to_dict() if self.workflow is not None else None
        d["scores"], d["warnings"] = dict(self.scores), list(self.warnings)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Candidate:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        wf = known.pop("workflow", None)
        cand = cls(**known)
        cand.workflow = Workflow.from_dict(wf) if wf is not None else None
        return cand


# ------------------------------------------------------------------------------ prompt
def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown planning strategy {strategy!r}; use one of "
                          f"{', '.join(STRATEGIES)}")


def _check_cap(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{name} must be a whole number of at least 1 or None, not {value!r}")


def plan_schema(strategy: str = "balanced", max_subtasks: int | None = None) -> dict:
    """The JSON schema of a plan reply; `estimate_s` is required for critical-path."""
    _check_strategy(strategy)
    required = ["id", "requirement", "agent", "depends_on"]
    props: dict[str, Any] = {"id": {"type": "string"}, "requirement": {"type": "string"},
                             "agent": {"type": "string"},
                             "depends_on": {"type": "array", "items": {"type": "string"}},
                             "estimate_s": {"type": "number"}}
    if strategy == "critical-path":
        required.append("estimate_s")
    # At least two subtasks unless capped at one: on llama.cpp the schema becomes a grammar,
    # and without this SmolLM2 closes the list after one subtask most of the time.
    subtasks: dict[str, Any] = {"type": "array", "minItems": min(2, max_subtasks or 2),
                                "items": {"type": "object", "properties": props,
                                          "required": required}}
    if max_subtasks:
        subtasks["maxItems"] = max_subtasks
    return {"type": "object", "properties": {"subtasks": subtasks}, "required": ["subtasks"]}


def _size(usual: tuple[int, int], cap: int | None) -> str:
    lo, hi = usual
    if cap:
        hi = min(hi, cap)
        lo = min(lo, hi)
    return f"{lo} to {hi}" if lo < hi else f"{hi}"


def _example(strategy: str) -> str:
    rows = [{"id": i, "requirement": r, "agent": a, "depends_on": d,
             **({"estimate_s": s} if strategy == "critical-path" else {})}
            for i, r, a, d, s in _EXAMPLE]
    # One subtask per line: small models copy the layout and keep writing subtasks.
    lines = ",\n".join(" " + json.dumps(row) for row in rows)
    return f'{{"subtasks": [\n{lines}\n]}}'


def _context_text(context: Any) -> str:
    if context is None or context == "" or context == {}:
        return ""
    if not isinstance(context, str):
        context = json.dumps(context, ensure_ascii=False, default=str, indent=1)
    return f"\n\nContext:\n{context.strip()}"


def planning_messages(task: str, *, strategy: str = "balanced", max_subtasks: int | None = None,
                      max_agents: int | None = None, context: Any = None) -> list[dict]:
    """The system and user messages asking for a plan (kept short for 8k-context models)."""
    _check_strategy(strategy)
    instruction, usual = STRATEGIES[strategy]
    lines = [
        "You plan work for a team of AI agents. Split the user's task into subtasks that "
        "form a dependency graph. Each subtask has:",
        "- id: a short snake_case name",
        "- requirement: one sentence saying what to produce",
        "- agent: the role that does it, e.g. researcher, coder, writer",
        "- depends_on: ids of the subtasks whose results it needs ([] if none)",
        "Keep the plan modular: a subtask depends only on results it really uses, so "
        "independent subtasks can run in parallel.",
        instruction.format(size=_size(usual, max_subtasks)) if usual else instruction,
    ]
    if max_subtasks:
        lines.append(f"Use at most {max_subtasks} subtasks.")
    if max_agents:
        lines.append(f"Use at most {max_agents} different agent roles.")
    lines.append(f"Example for the task \"{_EXAMPLE_TASK}\":\n{_example(strategy)}")
    user = f"Task: {task.strip()}{_context_text(context)}"
    return [{"role": "system", "content": "\n".join(lines)}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------ caps and scores
def _cap_subtasks(wf: Workflow, cap: int) -> None:
    """Keep the first `cap` subtasks in plan order; dropped ones pass their dependencies on."""
    dropped = list(wf.nodes)[cap:]
    if not dropped:
        return
    for d in dropped:
        # Graph surgery as in pruning, so order constraints among kept subtasks survive.
        preds, succs = wf.parents(d), wf.children(d)
        wf.graph.remove_node(d)
        wf.graph.add_edges_from((p, s) for p in preds for s in succs if p != s)
        del wf.nodes[d]
    more = " ..." if len(dropped) > 5 else ""
    wf.warnings.append(f"kept the first {cap} of {cap + len(dropped)} subtasks (max_subtasks="
                       f"{cap}); dropped {', '.join(dropped[:5])}{more}")


def _cap_agents(wf: Workflow, cap: int) -> None:
    """Keep the `cap` most common roles; any other goes to a kept one of similar name, else
    to the most common (so "Coder" joins "coder" rather than "writer")."""
    counts = Counter(n.agent for n in wf.nodes.values())
    if len(counts) <= cap:
        return
    first = {}
    for n in wf.nodes.values():
        first.setdefault(n.agent, len(first))
    kept = sorted(counts, key=lambda a: (-counts[a], first[a]))[:cap]
    lowered = {a.lower(): a for a in reversed(kept)}
    mapping = {}
    for role in counts:
        if role not in kept:
            close = difflib.get_close_matches(role.lower(), list(lowered), n=1, cutoff=0.6)
            mapping[role] = lowered[close[0]] if close else kept[0]
    for n in wf.nodes.values():
        n.agent = mapping.get(n.agent, n.agent)
    moves = ", ".join(f"{a} -> {b}" for a, b in mapping.items())
    wf.warnings.append(f"mapped {len(mapping)} agent role(s) onto the {cap} most common "
                       f"(max_agents={cap}): {moves}")


def score(wf: Workflow, task: str = "") -> dict:
    """The numbers `select` and the UI use, from metrics over the active nodes."""
    scores = metrics.shape(wf, FAILURE_P)
    scores["coverage"] = coverage(scores, multi_step(task or wf.task or ""))[0]
    if any(n.estimate_s is not None for n in wf.nodes.values()):
        scores["critical_path_s"] = metrics.critical_path(wf, "duration")[1]
    return scores


# ------------------------------------------------------------------------------ planning
def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


async def _candidate(llm, index: int, seed: int, task: str, messages: list[dict],
                     schema: dict, opts: dict, caps: tuple) -> Candidate:
    cand = Candidate(index=index, seed=seed)
    try:
        reply = await llm.complete(messages, schema=schema, seed=seed, purpose="plan", **opts)
    except (ModelOutputError, EndpointError) as exc:
        # The call is logged by llm/client.py; its id and usage are kept when the error carries them.
        cand.error, cand.call_id = _one_line(exc), getattr(exc, "call_id", None)
        cand.tokens_in = getattr(exc, "input_tokens", 0) or 0
        cand.tokens_out = getattr(exc, "output_tokens", 0) or 0
        cand.cost_usd = getattr(exc, "cost_usd", 0.0) or 0.0
        cand.cached = getattr(exc, "cached", False)
        return cand
    cand.tokens_in, cand.tokens_out = reply.input_tokens, reply.output_tokens
    cand.cost_usd, cand.call_id, cand.model = reply.cost_usd, reply.call_id, reply.model
    cand.latency_s, cand.cached = reply.latency_s, reply.cached
    try:
        wf = parse_plan(reply.data if reply.data is not None else reply.text, task=task)
    except PlanError as exc:
        cand.error = _one_line(exc)
        return cand
    max_subtasks, max_agents = caps
    if max_subtasks:
        _cap_subtasks(wf, max_subtasks)
    if max_agents:
        _cap_agents(wf, max_agents)
    cand.workflow, cand.scores, cand.warnings = wf, score(wf, task), list(wf.warnings)
    return cand


async def plan_candidates(task: str, *, k: int = 3, model: str | None = None,
                          strategy: str = "balanced", max_subtasks: int | None = None,
                          max_agents: int | None = None, llm=None, seed: int = 0,
                          run_id: str | None = None, context: Any = None,
                          temperature: float = 0.7, max_tokens: int | None = None,
                          cache: bool = True,
                          progress: Callable[[dict], Any] | None = None) -> list[Candidate]:
    """K candidate plans requested concurrently (seeds seed..seed+k-1), in index order.

    Unusable replies become candidates with `error` set; configuration errors raise.
    `progress(event)` hears {"phase": "asked", "k"} and, as each reply is read,
    {"phase": "received", "done", "k", "ok"}.
    """
    if not isinstance(task, str) or not task.strip():
        raise ConfigError("the task is empty; describe what the workflow should achieve")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= HARD_MAX_K:
        raise ConfigError(f"k is the number of candidate plans, a whole number from 1 to "
                          f"{HARD_MAX_K}, not {k!r}")
    _check_strategy(strategy)
    _check_cap("max_subtasks", max_subtasks)
    _check_cap("max_agents", max_agents)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    messages = planning_messages(task, strategy=strategy, max_subtasks=max_subtasks,
                                 max_agents=max_agents, context=context)
    schema = plan_schema(strategy, max_subtasks)
    opts = dict(model=model, temperature=temperature, max_tokens=max_tokens, cache=cache,
                run_id=run_id)
    jobs = [asyncio.ensure_future(_candidate(llm, i, seed + i, task.strip(), messages, schema,
                                             opts, (max_subtasks, max_agents)))
            for i in range(k)]
    if progress is not None:
        progress({"phase": "asked", "k": k})
        received = []

        def heard(job: asyncio.Future) -> None:
            if not job.cancelled() and job.exception() is None:
                received.append(job.result().ok)
                progress({"phase": "received", "done": len(received), "k": k,
                          "ok": sum(received)})
        for job in jobs:
            job.add_done_callback(heard)
    try:
        return list(await asyncio.gather(*jobs))
    except BaseException:
        # gather leaves the siblings running when one raises; stop them before re-raising.
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise


def _failure_summary(candidates: list[Candidate]) -> str:
    kinds: Counter = Counter()
    first: dict[str, str] = {}
    for c in candidates:
        kind, _, message = (c.error or "ModelOutputError: no plan").partition(": ")
        why = _WHY.get(kind, "the plan could not be used")
        kinds[why] += 1
        first.setdefault(why, message[:120])
    parts = [f"{why} ({first[why]})" if n == 1 else f"{n} x {why} (e.g. {first[why]})"
             for why, n in kinds.items()]
    return "; ".join(parts)


_CUES = (",", ";", " and ", " then ", " after ", " before ", ":", "\n")


def multi_step(task: str) -> bool:
    """Whether a task reads as several steps (a list, "and", "then", or more than a line's
    worth of words): for such a task a one-subtask plan does not cover it."""
    text = f" {' '.join(task.lower().split())} "
    return len(text.split()) > 8 or any(cue in text for cue in _CUES)


def coverage(scores: dict, several_steps: bool = True) -> tuple[int, str]:
    """(tier, why): 2 connected with one final subtask, 1 connected with several final
    subtasks, 0 one subtask (for a multi-step task) or unconnected subtasks."""
    n, edges, sinks = scores["nodes"], scores["edges"], scores["sinks"]
    if n <= 1:
        return (0, "one subtask for a multi-step task") if several_steps else (2, "one subtask")
    if not scores["connected"]:
        return 0, ("no dependencies (flat)" if edges == 0 else "unconnected pieces")
    if sinks > 1:
        return 1, f"connected but {sinks} final subtasks (no integrating last step)"
    return 2, "connected, one final subtask"


def _scores_of(c, task: str) -> dict:
    scores = c.scores
    if "speedup" not in scores or "sinks" not in scores:   # scored elsewhere (e.g. the updater)
        scores = {**score(c.workflow, task), **scores}
    return scores


def _rank(c, scores: dict, several: bool) -> tuple:
    return (-coverage(scores, several)[0], -round(scores["speedup"], 9),
            -round(scores["success_share"], 9), scores["edges"], scores["nodes"], c.index)


def _why(winner, runner, s: dict, r: dict, several: bool) -> str:
    """One line: the first criterion of RULE on which the winner beat the runner-up."""
    (tw, why_w), (tr, why_r) = coverage(s, several), coverage(r, several)
    if tw != tr:
        return f"{why_w}; candidate {runner.index}: {why_r}"
    if abs(s["speedup"] - r["speedup"]) > TIE:
        return (f"{why_w}; speed-up |V|/T {s['speedup']:.2f} > {r['speedup']:.2f} "
                f"(candidate {runner.index})")
    if abs(s["success_share"] - r["success_share"]) > TIE:
        return (f"{why_w}; same speed-up {s['speedup']:.2f}, fewer dependencies: expected "
                f"successes (p={FAILURE_P}) {s['expected_successes']:.3f} > "
                f"{r['expected_successes']:.3f} (candidate {runner.index})")
    return (f"{why_w}; ties candidate {runner.index} on coverage, speed-up and expected "
            f"successes; {s['edges']} vs {r['edges']} edges, {s['nodes']} vs {r['nodes']} nodes")


def select(candidates: list, task: str = "") -> int:
    """`index` of the best usable candidate by RULE; sets each usable candidate's `note`."""
    ok = [c for c in candidates if c.ok]
    if not ok:
        if not candidates:
            raise PlanError("there are no candidate plans to choose from; plan with k >= 1")
        raise PlanError(f"all {len(candidates)} candidate plans failed: "
                        f"{_failure_summary(candidates)}; try again, raise k, or use a "
                        "stronger model")
    task = task or next((c.workflow.task for c in ok if c.workflow.task), "")
    several = multi_step(task)
    scored = {c.index: _scores_of(c, task) for c in ok}
    ranked = sorted(ok, key=lambda c: _rank(c, scored[c.index], several))
    best = ranked[0]
    head = (f"P_avg {scored[best.index]['parallelism']:.2f}, C_dependency "
            f"{scored[best.index]['dependency_complexity']:.2f} (paper, reported); ")
    if len(ranked) == 1:
        _set_note(best, f"chosen: the only usable candidate; {coverage(scored[best.index], several)[1]}")
    else:
        _set_note(best, "chosen: " + head + _why(best, ranked[1], scored[best.index],
                                                  scored[ranked[1].index], several))
    for c in ranked[1:]:
        _set_note(c, f"lost to candidate {best.index}: " + _why(best, c, scored[best.index],
                                                                scored[c.index], several))
    return best.index


def candidate_line(c, chosen: int | None = None) -> str:
    """One line per candidate for the CLI and the panel: its scores and why it won or lost."""
    mark = "*" if c.index == chosen else " "
    if not c.ok:
        return f"{mark} candidate {c.index} (seed {c.seed}): failed: {c.error}"
    s = c.scores
    numbers = (f"{s.get('nodes')} nodes, {s.get('edges')} edges, speed-up "
               f"{s.get('speedup', 0):.2f}, P_avg {s.get('parallelism', 0):.2f}, C_dependency "
               f"{s.get('dependency_complexity', 0):.2f}, expected successes "
               f"{s.get('expected_successes', 0):.3f}")
    return f"{mark} candidate {c.index} (seed {c.seed}): {numbers}" + (f" -- {c.note}" if c.note else "")


def _set_note(c, text: str) -> None:
    if hasattr(c, "note"):
        c.note = text


_RETRY_ROUNDS = 8   # earlier failed rounds of one task skipped by a retry


async def plan(task: str, **options: Any) -> tuple[list[Candidate], int]:
    """`plan_candidates(task, **options)` and the index `select` chose (told to
    `options["progress"]` as {"phase": "chosen", "chosen", "usable", "k"}).

    When every candidate failed and every failure was replayed from the cache, this is a
    retry of a planning that already failed: the next K seeds are asked instead, so
    "try again" calls the model rather than returning the stored failure.
    """
    candidates = await plan_candidates(task, **options)
    k, seed = options.get("k", 3), options.get("seed", 0) or 0
    for _ in range(_RETRY_ROUNDS):
        if any(c.ok for c in candidates) or not all(c.cached for c in candidates):
            break
        seed += k
        candidates = await plan_candidates(task, **{**options, "seed": seed})
    chosen = select(candidates, task)
    if options.get("progress") is not None:
        options["progress"]({"phase": "chosen", "chosen": chosen, "k": len(candidates),
                             "usable": sum(c.ok for c in candidates)})
    return candidates, chosen
