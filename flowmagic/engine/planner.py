"""Planning: ask a model for K candidate plans, repair and score each, pick one.

The K requests go out concurrently, each with its own seed (seed + i) and a modest
temperature so the plans differ. Every reply goes through the gate (`answers.plan_from_answer`:
a strict schema and `plans.repair_plan`'s repairs; a model a plan names must be one its
endpoint serves), is cut to the caps (`max_subtasks`, `max_agents`) with a warning per cut, and scored with
`metrics`. A candidate whose reply could not be used keeps its one-line error and is
never chosen. `plan_selection.select` (re-exported here) chooses one and writes each usable
candidate's one-line `note` saying why it won or lost.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from . import stepwise
from .answerform import prescribed
from .prompt_start import HOUSE_RULES
from ..errors import (ConfigError, EndpointError, FlowError, ModelOutputError, OffTopicError,
                      PlanError)
from ..settings import HARD_MAX_K
from ..model.answers import plan_from_answer
from ..model.graph import Workflow
from ..model.plan_checks import (asks_split, check_plan, data_task, loads_only, same_task,
                                 splits_only, states_only, topic_share, without_split, writes)
from .plan_selection import BaseCandidate, RULE, candidate_line, coverage, multi_step, score, select

__all__ = ["STRATEGIES", "METHODS", "RULE", "PLAN_TIME_S", "EXAMPLE_TEXTS", "Candidate",
           "plan_schema", "planning_messages", "score", "coverage", "multi_step",
           "candidate_line", "plan_candidates", "select", "plan", "K", "default_k",
           "named_values", "direct_plan", "direct_requirement", "DIRECT_ID",
           "DIRECT_REQUIREMENT"]

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
# Placeholders, not a worked example: SmolLM2 answered "List five facts about tea" to an
# analysis of sales.csv when the prompt showed a real plan for a tea blog post.
_EXAMPLE = [("<first_id>", "<what this subtask produces for the task>", "<role>", [], 60),
            ("<second_id>", "<another part of the task>", "<role>", [], 60),
            ("<last_id>", "<the deliverable, made from the results above>", "<role>",
             ["<first_id>", "<second_id>"], 60)]
EXAMPLE_TEXTS = tuple(r for _, r, _, _, _ in _EXAMPLE)
# For a task on data: every subtask's code has the data at hand, and a chain of reloads
# (load -> split -> train -> evaluate -> plot, for a question that asked for four numbers and
# a plot) is what a small model plans without being told.
DATA_RULES = (
    "The task's data is at hand for every subtask's code (each table as a pandas DataFrame, "
    "with pandas, numpy and matplotlib), so no subtask only loads or reads data.",
    "Give each question the task asks its own subtask; questions that do not use each "
    "other's results do not depend on each other, so they run in parallel. A task whose "
    "answer is a few numbers needs few subtasks: one per question and a last one that "
    "states the answer.",
    "Add no step the task does not ask for: no train/test split, cleaning or tuning unless "
    "the task asks for it.")
# For a data task whose answer has a prescribed form (a few values): the closing summary
# writes that form from what the code printed, a loading or stating subtask is dropped
# (`_drop_loading`, `_drop_stating`) and a chain is joined into one script (`_join_chains`).
# Asked for 3 to 7 subtasks, the bench model padded one question into a load -> compute ->
# report chain that came back as one node. This rule and "1 to 7": on 11 stored plan prompts
# of issue 29's sixth sample the plan's answer 1,823 -> 1,291 tokens (the plan call ~8 s less
# of its ~50 s on one thread); on 9 dabench-dev questions run whole, 7 alike, one right ->
# wrong and one wrong -> right, median time ~92 -> ~71 s (8 pairs).
FORM_RULE = DATA_RULES[1].replace(
    "A task whose answer is a few numbers needs few subtasks: one per question and a last one "
    "that states the answer.",
    "The task's answer is a few values, written for you from the subtasks' results: give each "
    "question it asks one subtask, and add none that loads the data or only states the answer.")
_FORM_SIZE = 1   # the least number of subtasks asked for such a task
# one call for the whole plan, steps first then dependencies (see stepwise.py), or the task as
# its one subtask without a call ("direct")
METHODS = ("auto", "oneshot", "stepwise", "direct")
# A data task whose answer is a few named values (`@name[value]` pairs, a JSON object's keys)
# is one subtask, planned without a model call: on issue 29's samples the bench model's plans
# for such tasks came back as one node in most flows once loading, stating and chained steps
# were dropped or joined, after a plan call of 40-65 s (the one-call baseline's whole answer
# took ~20 s), and a plan that rewrote the question (a p-value left out, a filter or a product
# of columns added) was the first cause of the flow's wrong answers in every sample. The node
# sees the task itself; a node that keeps failing is re-planned by the updater as before.
DIRECT_ID = "answer"
DIRECT_REQUIREMENT = ("Compute every value the task's answer format names and print each one "
                      "as @name[value] on its own line.")   # plan_checks.computes: code is asked
# The embedded model's bound per candidate (K candidates: K x 300 s). A capped candidate
# takes ~10-20 s at load 1; 120 s cut a plan at load 30 on this 2-core machine.
PLAN_TIME_S = 300.0
K = 3   # candidate plans where the endpoint answers them side by side


def default_k(model: str | None = None) -> int:
    """Candidate plans when k is not given: K, or as many as a server you run answers at once
    (its slots, llm.queue). There the candidates queue one behind the other, so K of them cost
    K plans' time: on the bench model's one slot (issue 29's second sample) the plan phase of
    K=3 took 116-791 s, and three of five such flows ran out of time where K=1 flows did not.
    Blocking (it may ask the server, once per process): call it in a thread from a loop."""
    from ..llm import endpoints, queue

    try:
        endpoint, _ = endpoints.resolve(model)
    except FlowError:   # planning itself says what is wrong with the model
        return K
    if not endpoint.self_hosted:
        return K
    slots = queue.slots_of(endpoint, endpoint.base_url)
    return K if slots is None else max(1, min(K, slots))
_TOKENS_PER_SUBTASK = 70


@dataclass
class Candidate(BaseCandidate):
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


# ------------------------------------------------------------------------------ prompt
def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown planning strategy {strategy!r}; use one of "
                          f"{', '.join(STRATEGIES)}")


def _check_cap(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{name} must be a whole number of at least 1 or None, not {value!r}")


def _few_values(task: str) -> bool:
    """Whether a task is a data task whose answer is a few values in a prescribed form."""
    return data_task(task) and prescribed(task) is not None


def named_values(task: str) -> bool:
    """Whether a task is a data task whose answer is a few values the form names (`@name[...]`
    pairs or a JSON object's keys): what `method="auto"` answers with one subtask."""
    form = prescribed(task) if data_task(task) else None
    return form is not None and form.checked


def direct_requirement(task: str) -> str:
    """The one subtask's requirement: DIRECT_REQUIREMENT and the task's own words about its
    answer's form (which the flow's shared start leaves out, `answerform.without_pairs`), so
    its code prints the form and the result is that printout, with no summary call."""
    form = prescribed(task)
    words = f"\nThe answer format, in the task's words:\n{form.words}" if form is not None else ""
    return DIRECT_REQUIREMENT + words


def direct_plan(task: str) -> Workflow:
    """The plan of `method="direct"`: the task as its one subtask (`direct_requirement`)."""
    return plan_from_answer({"subtasks": [{"id": DIRECT_ID, "requirement": direct_requirement(task),
                                           "agent": "coder", "depends_on": []}]}, task=task)


def plan_schema(strategy: str = "balanced", max_subtasks: int | None = None,
                least: int = 2) -> dict:
    """The JSON schema of a plan reply; `estimate_s` is required for critical-path. `least`
    subtasks at the fewest (1 for a data task with a few values for an answer)."""
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
    subtasks: dict[str, Any] = {"type": "array", "minItems": min(least, max_subtasks or least),
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
                      max_agents: int | None = None, context: Any = None,
                      start: str | None = None) -> list[dict]:
    """The system and user messages asking for a plan (kept short for 8k-context models).
    `start` (prompt_start.flow_start without the working start: a flow on input files) lays
    the request out as a call of the flow: the house rules, that start (the task, how code
    runs, the inputs; it holds what `context` would say), then the planner's part, so the
    first node's prompt is evaluated from where this one left off."""
    _check_strategy(strategy)
    instruction, usual = STRATEGIES[strategy]
    few = _few_values(task)
    if few and usual:
        usual = (_FORM_SIZE, usual[1])
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
    if data_task(task):
        lines.extend(DATA_RULES if not few else (DATA_RULES[0], FORM_RULE, DATA_RULES[2]))
    if max_subtasks:
        lines.append(f"Use at most {max_subtasks} subtasks.")
    if max_agents:
        lines.append(f"Use at most {max_agents} different agent roles.")
    lines.append("Answer with JSON of this shape; every <...> is a placeholder to replace with "
                 f"your own words for the task, never to copy:\n{_example(strategy)}")
    if start:
        lines[0] = ("Split the overall task above into subtasks that form a dependency graph "
                    "for the team. Each subtask has:")
        own = "\n".join(["Your role: the planner.", "", "Your subtask:", *lines])
        return [{"role": "system", "content": HOUSE_RULES},
                {"role": "user", "content": f"{start}\n\n{own}"}]
    user = f"Task: {task.strip()}{_context_text(context)}"
    return [{"role": "system", "content": "\n".join(lines)}, {"role": "user", "content": user}]


# ------------------------------------------------------------------------------ caps and scores
def _bypass(wf: Workflow, node_id: str) -> None:
    """Remove a subtask; graph surgery as in pruning, so order among the others survives."""
    preds, succs = wf.parents(node_id), wf.children(node_id)
    wf.graph.remove_node(node_id)
    wf.graph.add_edges_from((p, s) for p in preds for s in succs if p != s)
    del wf.nodes[node_id]


def _cap_subtasks(wf: Workflow, cap: int) -> None:
    """Keep the first `cap` subtasks in plan order; dropped ones pass their dependencies on."""
    dropped = list(wf.nodes)[cap:]
    if not dropped:
        return
    for d in dropped:
        _bypass(wf, d)
    more = " ..." if len(dropped) > 5 else ""
    wf.warnings.append(f"kept the first {cap} of {cap + len(dropped)} subtasks (max_subtasks="
                       f"{cap}); dropped {', '.join(dropped[:5])}{more}")


def _drop_loading(wf: Workflow) -> None:
    """Remove the subtasks that only load data or import libraries (plan_checks.loads_only):
    every subtask's code has them at hand, and a loading step is a model call that computes
    nothing. Graph surgery, as in pruning; a plan made of nothing else keeps its first one."""
    dropped = [i for i, n in wf.nodes.items() if loads_only(n.requirement)]
    if len(dropped) == len(wf.nodes):
        dropped = dropped[1:]
    for d in dropped:
        _bypass(wf, d)
    if dropped:
        wf.warnings.append(f"left out {', '.join(dropped)}: a subtask that only loads data or "
                           "imports libraries (every subtask's code has them at hand)")


def _drop_split(wf: Workflow, task: str) -> None:
    """Remove a train/test split the task did not ask for, in a plan for a data task: a
    subtask that only splits goes, and the others' "from the training set" with it (they
    mean the whole data). The planner is told to add no such step (DATA_RULES); the bench
    model added one anyway on dabench-dev q272, whose mean and standard deviation of a ratio
    were then computed on 80% of the rows. A plan made of nothing else keeps its first."""
    if not data_task(task) or asks_split(task):
        return
    dropped = [i for i, n in wf.nodes.items() if splits_only(n.requirement)]
    if len(dropped) == len(wf.nodes):
        dropped = dropped[1:]
    for d in dropped:
        _bypass(wf, d)
    for node in wf.nodes.values():
        node.requirement = without_split(node.requirement)
    if dropped:
        wf.warnings.append(f"left out {', '.join(dropped)}: a train/test split the task does "
                           "not ask for (its questions are about the whole data)")


def _drop_stating(wf: Workflow, task: str) -> None:
    """Remove the last subtasks that only state, format or show the answer
    (plan_checks.states_only) when the task prescribes its answer's form: the closing summary
    writes that form from what the code printed, and such a step would see the form the
    subtasks are not shown (answerform.without_pairs). Of 29 last subtasks in the bench
    model's dabench-dev plans, 12 were such steps, each one or two calls that compute
    nothing. A step that fed only such steps is one too once they are gone; a plan made of
    nothing else keeps its first subtask."""
    if prescribed(task) is None:
        return
    dropped: list[str] = []
    while len(wf.nodes) > 1:
        last = [i for i, n in wf.nodes.items()
                if not wf.children(i) and states_only(n.requirement)]
        if not last:
            break
        if len(last) == len(wf.nodes):
            last = last[1:]
        for d in last:
            _bypass(wf, d)
        dropped += last
    if dropped:
        wf.warnings.append(f"left out {', '.join(dropped)}: a last subtask that only states the "
                           "answer (the closing summary writes it in the task's form from what "
                           "the code printed)")


def _join_chains(wf: Workflow, task: str) -> None:
    """Join each chain of computing subtasks into one subtask, in a plan for a data task that
    prescribes its answer's form (a question with a few values for an answer). A link of a
    chain (a subtask whose one child has it as its one parent) gains no parallelism from
    being a node of its own, and on a model that writes code each link cost a model call with
    the flow's whole prompt and a chance to lose the thread: on the bench model's dabench-dev
    flows, a chain of 2 to 4 code steps took 70-130 s of calls where one script for the same
    question took 15-45 s, and q136's chain dropped what its first link computed. Joined
    steps keep their order in one requirement ("A; then B"), the last step's id and role;
    independent questions stay parallel branches, and a step that writes prose (or states
    a result) stays a step of its own."""
    if prescribed(task) is None or not data_task(task):
        return
    joined: list[str] = []
    again = True
    while again:
        again = False
        for first in list(wf.nodes):
            kids = wf.children(first)
            if len(kids) != 1 or wf.parents(kids[0]) != [first]:
                continue
            a, b = wf.nodes[first], wf.nodes[kids[0]]
            if writes(a.requirement) or writes(b.requirement):
                continue
            step = b.requirement.strip()
            if step[1:2].islower():   # "Calculate ..." reads on as "then calculate ..."
                step = step[:1].lower() + step[1:]
            b.requirement = f"{a.requirement.strip().rstrip('.;')}; then {step}"
            _bypass(wf, first)
            joined.append(first)
            again = True
            break
    if joined:
        wf.warnings.append(f"joined {', '.join(joined)} into the steps after them: a chain of "
                           "steps on the data answers the question in one script (no step "
                           "of it could run beside another)")


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


# ------------------------------------------------------------------------------ planning
def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _keep_usage(cand: Candidate, replies: list) -> None:
    first = replies[0]
    cand.call_id, cand.model = first.call_id, first.model
    cand.tokens_in = sum(r.input_tokens for r in replies)
    cand.tokens_out = sum(r.output_tokens for r in replies)
    cand.cost_usd = sum(r.cost_usd for r in replies)
    cand.latency_s = sum(r.latency_s for r in replies)
    cand.cached = all(r.cached for r in replies)


def _keep_error_usage(cand: Candidate, exc: BaseException) -> None:
    # The call is logged by llm.py; its id and usage are kept when the error carries them.
    cand.error, cand.call_id = _one_line(exc), getattr(exc, "call_id", None)
    cand.tokens_in += getattr(exc, "input_tokens", 0) or 0
    cand.tokens_out += getattr(exc, "output_tokens", 0) or 0
    cand.cost_usd += getattr(exc, "cost_usd", 0.0) or 0.0
    cand.cached = getattr(exc, "cached", False)


async def _candidate(llm, index: int, seed: int, task: str, job: dict, opts: dict,
                     caps: tuple) -> Candidate:
    cand = Candidate(index=index, seed=seed)
    extra: list[str] = []
    try:
        if job["method"] == "stepwise":
            data, extra, replies = await stepwise.plan_stepwise(
                llm, task, seed=seed, lo=job["lo"], hi=job["hi"], examples=job["examples"],
                opts=dict(opts), refused=lambda steps: check_plan(steps, task, job["copyable"]))
        else:
            reply = await llm.complete(job["messages"], schema=job["schema"], seed=seed,
                                       purpose="plan", **opts)
            data, replies = (reply.data if reply.data is not None else reply.text), [reply]
    except (ModelOutputError, EndpointError, PlanError) as exc:
        _keep_error_usage(cand, exc)
        return cand
    _keep_usage(cand, replies)
    try:
        wf = plan_from_answer(data, task=task)   # the gate: model text becomes plan data here
        problem = check_plan([n.requirement for n in wf.nodes.values()], task, job["copyable"])
        if problem:
            raise OffTopicError(problem)
        await _check_models(wf)
    except (PlanError, ConfigError) as exc:
        cand.error = _one_line(exc)
        return cand
    wf.warnings.extend(extra)
    _drop_loading(wf)
    _drop_split(wf, task)
    _drop_stating(wf, task)
    _join_chains(wf, task)
    if topic_share([n.requirement for n in wf.nodes.values()], task) == 0.0:
        wf.warnings.append("no subtask shares a word with the task; check that the plan is "
                           "about it (a stronger model plans better)")
    max_subtasks, max_agents = caps
    if max_subtasks:
        _cap_subtasks(wf, max_subtasks)
    if max_agents:
        _cap_agents(wf, max_agents)
    cand.workflow, cand.scores, cand.warnings = wf, score(wf, task), list(wf.warnings)
    return cand


async def _check_models(wf: Workflow) -> None:
    """A model a plan names must be one its endpoint serves, where the endpoint lists its
    models (`endpoints.check_model`, off with FLOWMAGIC_CHECK_MODELS=0): ConfigError if not."""
    named = sorted({n.model for n in wf.nodes.values() if n.model})
    if named:
        from ..llm.endpoints import check_model

        for model in named:   # a list is asked once per endpoint, then kept: a thread, not the loop
            await asyncio.to_thread(check_model, model, say=lambda line: wf.warnings.append(
                line.removeprefix("flowmagic: ")))


def _method_of(method: str, model: str | None, task: str = "",
               strategy: str = "balanced") -> str:
    if method not in METHODS:
        raise ConfigError(f"unknown planning method {method!r}; use one of {', '.join(METHODS)}")
    if method != "auto":
        return method
    if strategy == "balanced" and named_values(task):   # a strategy asked for is a plan asked for
        return "direct"
    from ..llm.endpoints import resolve

    return "stepwise" if resolve(model)[0].local else "oneshot"


def _job(task: str, method: str, strategy: str, max_subtasks, max_agents, context,
         store, start: str | None = None) -> dict:
    """What every candidate of one planning shares: prompt or examples, schema, copy texts."""
    if method == "stepwise":
        usual = STRATEGIES[strategy][1] or (3, 6)
        hi = min(max_subtasks or stepwise.MAX_STEPS, usual[1], stepwise.MAX_STEPS)
        lo = max(min(usual[0], hi), min(2, hi))
        examples = stepwise.retrieve(task, 2, store)
        # A finished run of this same task (make demo twice) is the user's own plan for it:
        # following it is no copy.
        copyable = [s for e in examples if not same_task(e.task, task) for s in e.steps]
        return {"method": method, "lo": lo, "hi": hi, "examples": examples,
                "copyable": copyable + list(EXAMPLE_TEXTS)}
    return {"method": method, "copyable": EXAMPLE_TEXTS,
            "messages": planning_messages(task, strategy=strategy, max_subtasks=max_subtasks,
                                          max_agents=max_agents, context=context,
                                          start=start),
            "schema": plan_schema(strategy, max_subtasks,
                                  least=_FORM_SIZE if _few_values(task) else 2)}


def _direct(task: str, seed: int, progress: Callable[[dict], Any] | None) -> Candidate:
    """The one candidate of `method="direct"`, made without a model call."""
    if progress is not None:
        progress({"phase": "asked", "k": 1})
    wf = direct_plan(task)
    wf.warnings.append("the task asks for a few named values: it is one subtask, planned "
                       "without a model call (plan_method=\"oneshot\" asks the model for a plan)")
    cand = Candidate(index=0, seed=seed, workflow=wf, scores=score(wf, task),
                     warnings=list(wf.warnings))
    if progress is not None:
        progress({"phase": "received", "done": 1, "k": 1, "ok": 1})
    return cand


def _timed_out(index: int, seed: int, limit: float) -> Candidate:
    return Candidate(index=index, seed=seed,
                     error=f"TimeoutError: no plan within {limit:g} s (time_limit_s); "
                           "raise it, lower k, or use a faster model")


def _check_options(task: Any, k: Any, strategy: str, max_subtasks: Any, max_agents: Any,
                   time_limit_s: Any) -> None:
    """One line for the first of `plan_candidates`'s arguments that is wrong."""
    if not isinstance(task, str) or not task.strip():
        raise ConfigError("the task is empty; describe what the workflow should achieve")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= HARD_MAX_K:
        raise ConfigError(f"k is the number of candidate plans, a whole number from 1 to "
                          f"{HARD_MAX_K}, not {k!r}")
    _check_strategy(strategy)
    _check_cap("max_subtasks", max_subtasks)
    _check_cap("max_agents", max_agents)
    if time_limit_s is not None and not (isinstance(time_limit_s, (int, float))
                                         and time_limit_s > 0):
        raise ConfigError(f"time_limit_s must be a positive number of seconds, not {time_limit_s!r}")


def _tell_progress(jobs: list[asyncio.Future], progress: Callable[[dict], Any], k: int) -> None:
    """{"phase": "asked"} now, and {"phase": "received", ...} as each candidate's job ends."""
    progress({"phase": "asked", "k": k})
    received = []

    def heard(fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            received.append(fut.result().ok)
            progress({"phase": "received", "done": len(received), "k": k,
                      "ok": sum(received)})
    for fut in jobs:
        fut.add_done_callback(heard)


async def plan_candidates(task: str, *, k: int = 3, model: str | None = None,
                          strategy: str = "balanced", max_subtasks: int | None = None,
                          max_agents: int | None = None, llm=None, seed: int = 0,
                          run_id: str | None = None, context: Any = None,
                          start: str | None = None, temperature: float = 0.7,
                          max_tokens: int | None = None,
                          cache: bool = True, method: str = "auto",
                          time_limit_s: float | None = None,
                          progress: Callable[[dict], Any] | None = None) -> list[Candidate]:
    """K candidate plans requested concurrently (seeds seed..seed+k-1), in index order.

    method "oneshot" asks for the whole plan in one answer; "stepwise" asks for the steps
    and then for their dependencies (stepwise.py); "direct" makes the task its one subtask
    without a call (one candidate, whatever k); "auto" is "direct" for a data task whose
    answer is a few named values (`named_values`; not when a strategy other than "balanced"
    is asked), else stepwise on the embedded model and oneshot elsewhere. Every call has a
    token cap that fits its schema (`max_tokens` overrides it), and the whole planning stops
    after `time_limit_s` (K x PLAN_TIME_S on the embedded model, no limit elsewhere unless
    given): candidates still waiting then fail with a TimeoutError.
    Unusable replies, copies of the prompt's example and off-topic plans become candidates
    with `error` set; configuration errors raise. `progress(event)` hears {"phase": "asked",
    "k"} and, as each reply is read, {"phase": "received", "done", "k", "ok"}.
    """
    _check_options(task, k, strategy, max_subtasks, max_agents, time_limit_s)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    chosen_method = _method_of(method, model, task, strategy)
    if chosen_method == "direct":
        return [_direct(task.strip(), seed, progress)]
    if time_limit_s is None and chosen_method == "stepwise" and method == "auto":
        time_limit_s = PLAN_TIME_S * k
    job = _job(task.strip(), chosen_method, strategy, max_subtasks, max_agents, context,
               getattr(llm, "store", None), start)
    if chosen_method == "oneshot" and max_tokens is None:
        max_tokens = _TOKENS_PER_SUBTASK * (max_subtasks or 10) + 40
    opts = dict(model=model, temperature=temperature, max_tokens=max_tokens, cache=cache,
                run_id=run_id)
    jobs = [asyncio.ensure_future(_candidate(llm, i, seed + i, task.strip(), job, opts,
                                             (max_subtasks, max_agents)))
            for i in range(k)]
    if progress is not None:
        _tell_progress(jobs, progress, k)
    try:
        await asyncio.wait(jobs, timeout=time_limit_s)
    finally:
        for j in jobs:
            j.cancel()
        # A cancelled wait (the user stopped the cell) still collects every job.
        await asyncio.gather(*jobs, return_exceptions=True)
    out = []
    for i, j in enumerate(jobs):
        if j.cancelled():
            out.append(_timed_out(i, seed + i, time_limit_s or 0.0))
        elif j.exception() is not None:
            raise j.exception()
        else:
            out.append(j.result())
    return out


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
