"""Stepwise planning for small models: list the steps, then ask what each step needs.

A whole plan in one JSON answer is too much for a 135M model: SmolLM2 copied the prompt's
example or wrote one or two unlinked subtasks (bench/plans.py measures it). So the embedded
model is asked two small things instead:

1. 3 to 8 one-sentence steps in order, as numbered lines, after two worked examples
   chosen by similarity to the task (TF-IDF) from the user's own finished runs in the
   store and from the plans shipped in `templates/plans.json`; the question names the
   task's subject words (plan_checks.subject_words), which every step should name. Plain
   lines, not JSON under a grammar: llama-cpp-python applies a grammar to the whole
   vocabulary at every token, which made each generated token ~3x slower, and SmolLM2
   follows numbered worked examples as it followed JSON ones (bench/plans.py).
2. For each step, the numbers of the earlier steps it uses, under a JSON schema whose
   items are enums of earlier numbers; llama.cpp turns it into a grammar, so the model
   can neither invent an id nor write a cycle. It is asked as the steps conversation
   continued (the steps as the model's answer, then the question), so a server that keeps
   the prompts it evaluated (llama.cpp) evaluates the question, not the examples again:
   on csv_eda 546 prompt tokens were evaluated for it as a prompt of its own.

When a step still shares no word with the task (SmolLM2 drifts: "Serve hot ginger beer" in
a guide to green tea), or there are fewer steps than asked for (no grammar counts them),
the steps are asked once more with another seed, and the better answer is kept. Steps
that no later step uses feed the last step, which delivers the result, so the plan is
connected and ends in one integrating subtask (a warning says which links were added).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import ModelOutputError, PlanError
from ..model.plan_checks import data_task, subject_words, topic_share
from ..model.graph import SLUG_MAX, slugify
from ..model.plans import role_for
from ..model.status import RunState, Status

__all__ = ["Example", "shipped_examples", "past_examples", "retrieve", "steps_cap",
           "steps_messages", "needs_schema", "needs_continued", "clean_steps", "build_plan",
           "plan_stepwise", "SHIPPED"]

SHIPPED = Path(__file__).resolve().parent.parent / "templates" / "plans.json"
MAX_STEPS = 8
STEP_CHARS = 150   # a step is one sentence; a run-on one is cut at a word
REASK_SEED = 7919  # the second ask for steps (a drift, too few steps) uses seed + this
# "1. ", "Step 2) ", and "1. 1. " (SmolLM2 numbered twice after the numbered examples)
_NUMBERING = re.compile(r"^\s*(?:(?:step\s*)?\d{1,2}\s*[.):-]\s*)+", re.I)
# "1. Soak it. 2. Crush it." on one line is two steps
_INLINE_NUMBER = re.compile(r"(?<=\S)\s+(?=\d{1,2}[.)]\s+[A-Za-z])")
# The prompt's own phrases, each written once: a listed line that says one of them back
# ("Pattern: name it in each step", "Task: ...") is no step, whatever words of the task it
# quotes (SmolLM2 does it).
_TEAM, _LINES, _SHORT, _LAST = ("steps a team of AI agents", "numbered lines", "at most 12 words",
                                "The last step delivers")
_ABOUT, _NAME_IT = "Every step is about", "name it in each step"
_STEPS_SYSTEM = (
    f"You split a task into the {_TEAM} will do. Answer with {{lo}} to {{hi}} "
    f"{_LINES}, the steps in the order they are done, each one short sentence ({_SHORT}"
    f") that names what it works on (the file, data or topic of the task). {_LAST} "
    "what the task asks for.")
# For a task on data (plan_checks.data_task): every step's code has the data at hand.
_LOADED, _PER_QUESTION = ("every step has the data at hand", "one step per question")
_DATA_NOTE = (f" For a task on data: {_LOADED}, so no step only loads it; {_PER_QUESTION} "
              "the task asks, and no step it does not ask for.")
_ECHOES = tuple(p.lower() for p in (_NAME_IT, _ABOUT, _LINES, _SHORT, _TEAM, _LAST, _LOADED,
                                    _PER_QUESTION))
_TASK_LINE = re.compile(r"^\W*task\s*:", re.I)
_NEEDS_SYSTEM = (
    "For each step of the plan below, give the numbers of the earlier steps whose results "
    "it uses, or [] when it needs none. Steps that do not use each other can run at the "
    "same time, so list only what a step really uses.")


@dataclass
class Example:
    task: str
    steps: list[str]
    needs: dict[str, list[str]] = field(default_factory=dict)
    source: str = "shipped"


@lru_cache(maxsize=1)
def shipped_examples() -> tuple[Example, ...]:
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    return tuple(Example(p["task"], list(p["steps"]), dict(p.get("needs") or {}),
                         f"template {p['template']}" if p.get("template") else "shipped")
                 for p in data["plans"])


def _example_of_run(run: dict) -> Example | None:
    workflow = run.get("workflow") or {}
    nodes = [n for n in workflow.get("nodes") or []
             if n.get("status") != Status.PRUNED and n.get("requirement")]
    if not 3 <= len(nodes) <= MAX_STEPS:
        return None
    number = {n["id"]: i + 1 for i, n in enumerate(nodes)}
    needs: dict[str, list[str]] = {}
    for a, b in workflow.get("edges") or []:
        # Only links to earlier steps: an example must show the shape asked for.
        if a in number and b in number and number[a] < number[b]:
            needs.setdefault(str(number[b]), []).append(str(number[a]))
    return Example(run["task"], [n["requirement"] for n in nodes], needs, f"run {run['id']}")


def past_examples(store, limit: int = 50) -> list[Example]:
    """Plans of the user's runs that finished with every subtask done (newest first)."""
    out = []
    for row in store.list_runs(limit):
        if row.get("status") != RunState.DONE or not row.get("task"):
            continue
        try:
            example = _example_of_run(store.load_run(row["id"]))
        except Exception:  # noqa: BLE001 - an unreadable old run is simply not an example
            continue
        if example is not None:
            out.append(example)
    return out


def retrieve(task: str, n: int = 2, store=None) -> list[Example]:
    """The n examples most similar to the task; the user's own runs first on equal scores."""
    from ..model.similarity import TfidfSimilarity

    pool = (past_examples(store) if store is not None else []) + list(shipped_examples())
    if not pool or n <= 0:
        return []
    sims = TfidfSimilarity()([task], [f"{e.task} {' '.join(e.steps)}" for e in pool])[0]
    order = sorted(range(len(pool)), key=lambda i: (-round(sims[i], 9), i))
    seen, out = set(), []
    for i in order:
        if pool[i].task not in seen:
            seen.add(pool[i].task)
            out.append(pool[i])
        if len(out) == n:
            break
    return out


def _numbered(steps: list[str]) -> str:
    return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


def steps_messages(task: str, examples: list[Example], lo: int, hi: int,
                   about: list[str] | None = None) -> list[dict]:
    """The question for the steps; what differs between tasks comes last, so the k
    candidates (and the next task) reuse the evaluated prompt prefix."""
    system = _STEPS_SYSTEM.format(lo=lo, hi=hi) + (_DATA_NOTE if data_task(task) else "")
    messages = [{"role": "system", "content": system}]
    for e in examples:
        messages += [{"role": "user", "content": f"Task: {e.task}"},
                     {"role": "assistant", "content": _numbered(e.steps)}]
    ask = f"Task: {task}"
    if about:
        ask += f"\n{_ABOUT} {', '.join(about)}: {_NAME_IT}."
    return messages + [{"role": "user", "content": ask}]


def steps_cap(hi: int) -> int:
    """Tokens for `hi` numbered steps of up to STEP_CHARS characters (~4 per token)."""
    return (STEP_CHARS // 4 + 6) * hi + 16


def needs_schema(n: int) -> dict:
    props = {str(i): {"type": "array", "maxItems": i - 1,
                      "items": {"enum": [str(j) for j in range(1, i)]}} for i in range(2, n + 1)}
    return {"type": "object", "properties": props, "required": list(props)}


def _needs_of(e: Example) -> str:
    return json.dumps({str(i): e.needs.get(str(i), []) for i in range(2, len(e.steps) + 1)})


def needs_continued(ask: list[dict], steps: list[str], examples: list[Example],
                    said: str = "") -> list[dict]:
    """The dependency question after the steps question `ask` and its answer, with the first
    worked example's answer to it as the example of the form. The answer is the model's own
    text `said` when its lines are numbered 1, 2, ... and each became the step of that number
    (the server matches the whole conversation it evaluated), else the steps as kept."""
    question = _NEEDS_SYSTEM.replace("of the plan below", "you listed")
    if examples:
        question += f" For the first task above, the answer is {_needs_of(examples[0])}."
    lines = _lines(said)
    own = len(lines) == len(steps) and all(
        x.lstrip().startswith(f"{i}. ") and _one_sentence(x) == step
        for i, (x, step) in enumerate(zip(lines, steps), 1))
    return ask + [{"role": "assistant", "content": said if own else _numbered(steps)},
                  {"role": "user", "content": question}]


def _lines(text: str) -> list[str]:
    """The numbered lines of a text answer (every non-blank line when none is numbered)."""
    lines = [x for line in text.splitlines() for x in _INLINE_NUMBER.split(line) if x.strip()]
    numbered = [x for x in lines if _NUMBERING.match(x)]
    return numbered or lines


def _one_sentence(text: str) -> str:
    """At most STEP_CHARS characters, cut at a word (a run-on step is one step)."""
    text = " ".join(_NUMBERING.sub("", text).split()).strip(" \"',")
    if len(text) > STEP_CHARS:
        text = text[:STEP_CHARS].rsplit(" ", 1)[0].rstrip(",;:")
    return text


def _whole_lines(reply) -> str:
    """The reply's text without a last line cut off by the token cap."""
    text = reply.text or ""
    return text.rsplit("\n", 1)[0] if reply.finish_reason == "length" and "\n" in text else text


def clean_steps(raw: Any, hi: int) -> list[str]:
    """Step texts without numbering, blanks or repeats, at most `hi`, from numbered lines
    (or a JSON list, or {"steps": [...]}, which some models write anyway)."""
    items = raw.get("steps") if isinstance(raw, dict) else raw
    if isinstance(items, str):
        try:
            parsed = json.loads(items)
        except ValueError:
            parsed = None
        items = clean_steps(parsed, hi) if isinstance(parsed, (dict, list)) else _lines(items)
    if not isinstance(items, list):
        raise PlanError("the model gave no list of steps; try again or use a stronger model")
    out: list[str] = []
    for item in items:
        text = _one_sentence(item) if isinstance(item, str) else ""
        # a line that says the prompt back is no step (and no usable one for the count)
        if len(text) >= 8 and text.lower() not in {s.lower() for s in out} \
                and not _echoes_prompt(text):
            out.append(text)
    if len(out) < min(2, hi):   # (a plan capped at one subtask needs one)
        raise PlanError(f"the model listed {len(out)} usable step(s); a plan needs at least two")
    return out[:hi]


def _echoes_prompt(text: str) -> bool:
    """Whether a listed "step" is our prompt said back (SmolLM2 does it)."""
    flat = " ".join(text.lower().split())
    return bool(_TASK_LINE.match(flat)) or any(e in flat for e in _ECHOES)


def _ids(steps: list[str]) -> list[str]:
    ids: list[str] = []
    for i, step in enumerate(steps, 1):
        words = re.findall(r"[A-Za-z0-9]+", step)[:4]
        base = slugify("_".join(words))[: SLUG_MAX - 3].rstrip("_") or f"step_{i}"
        name, k = base, 2
        while name in ids:
            name, k = f"{base}_{k}", k + 1
        ids.append(name)
    return ids


def build_plan(steps: list[str], needs: Any) -> tuple[dict, list[str]]:
    """A plan dict for `parse_plan` and the warnings of the links added to the last step."""
    ids = _ids(steps)
    needs = needs if isinstance(needs, dict) else {}
    deps: list[list[str]] = []
    for i in range(1, len(steps) + 1):
        got = needs.get(str(i)) or []
        nums = sorted({int(x) for x in got if str(x).isdigit() and 1 <= int(x) < i})
        deps.append([ids[j - 1] for j in nums])
    used = {d for ds in deps for d in ds}
    loose = [ids[i] for i in range(len(steps) - 1) if ids[i] not in used]
    warnings = []
    if loose:
        deps[-1] = deps[-1] + [x for x in loose if x not in deps[-1]]
        warnings.append(f"the last step, {ids[-1]}, now also uses {', '.join(loose)} "
                        "(no later step used them), so the plan ends in one deliverable")
    plan = {"subtasks": [{"id": ids[i], "requirement": steps[i], "agent": role_for(steps[i]),
                          "depends_on": deps[i]} for i in range(len(steps))]}
    return plan, warnings


def _rank(steps: list[str], task: str, lo: int) -> tuple:
    """Which list of steps is better: enough steps, then more of them on topic."""
    return (len(steps) >= lo, topic_share(steps, task)) if steps else (False, -1.0)


async def _ask_steps(llm, ask: list[dict], seed: int, cap: int, hi: int, opts: dict,
                     asked: list) -> tuple[list[str], str, Exception | None]:
    """(steps, the answer's text they came from, None), or ([], "", the error) when the
    answer was no usable list."""
    try:
        reply = await llm.complete(ask, seed=seed, purpose="plan", max_tokens=cap, **opts)
        asked.append(reply)
        said = _whole_lines(reply)
        return clean_steps(said, hi), said, None
    except (ModelOutputError, PlanError) as exc:
        return [], "", exc


async def plan_stepwise(llm, task: str, *, seed: int, lo: int, hi: int,
                        examples: list[Example], opts: dict,
                        refused=None) -> tuple[dict, list[str], list]:
    """(plan dict, warnings, replies) from the two calls; raises what `llm.complete` raises.
    `refused(steps)` (the planner's check for copies of the prompt's examples) says when the
    steps already fail the candidate: no dependency question is asked for them."""
    cap = opts.pop("max_tokens", None) or steps_cap(hi)
    ask = steps_messages(task, examples, lo, hi, subject_words(task))
    asked: list = []
    notes: list[str] = []
    steps, said, problem = await _ask_steps(llm, ask, seed, cap, hi, opts, asked)
    if problem is None:
        share = topic_share(steps, task)
        if len(steps) < lo or share < 1.0:
            kept = _rank(steps, task, lo)
            other, other_said, _ = await _ask_steps(llm, ask, seed + REASK_SEED, cap, hi,
                                                    opts, asked)
            if _rank(other, task, lo) > kept:
                notes.append(f"the first answer had {len(steps)} steps, {share:.0%} about the "
                             f"task; asked again and kept the second ({len(other)} steps, "
                             f"{topic_share(other, task):.0%})")
                steps, said = other, other_said
    else:
        steps, said, again = await _ask_steps(llm, ask, seed + REASK_SEED, cap, hi, opts,
                                              asked)
        if again is not None:
            raise problem
    n = len(steps)
    if n == 1 or (refused is not None and refused(steps)):   # nothing to ask (or no use)
        plan, warnings = build_plan(steps, {})
        return plan, notes + warnings, asked
    try:
        # Room for every key and every earlier number, at a few tokens each.
        second = await llm.complete(needs_continued(ask, steps, examples, said),
                                    schema=needs_schema(n), seed=seed, purpose="plan",
                                    max_tokens=8 * n + 2 * n * (n - 1) + 30, **opts)
    except ModelOutputError as exc:
        plan, warnings = build_plan(steps, {})
        why = " ".join(str(exc).split())[:100]
        warnings[:0] = notes + [f"the model's answer on which steps need which could not be "
                                f"read ({why}); the steps were kept, all feeding the last one"]
        return plan, warnings, asked
    plan, warnings = build_plan(steps, second.data)
    return plan, notes + warnings, asked + [second]
