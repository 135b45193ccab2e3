"""Flow's three tasks end to end, scored as its Tables 1-3 score them, beside two baselines
on the same model, with the times of its Table 9.

For a template that declares criteria (`gobang`, `website`, `beamer`), each trial runs the
task three ways: **one call** (the whole task in one answer, its files saved as a run saves
them), **sequential** (the plan flowmagic made, its nodes one at a time, no updates) and
**flowmagic** (the same plan, ready nodes at once, the updater on: after completion unless
`update=` says otherwise). Each way's files are scored by the template's criteria
(`flowmagic.ops.criteria`: 0 or 1 each; success = their mean, over the criteria that could be
checked). Every method has its own seed, so no method replays another's cached answers.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, FlowError
from ..ops.criteria import CRITERIA, Score, score

__all__ = ["TASKS", "METHODS", "Arm", "Comparison", "template_task", "is_task_template",
           "acompare", "compare_task"]

TASKS = {"gobang": "gobang", "website": "conference_website", "beamer": "beamer_slides"}
METHODS = ("one call", "sequential", "flowmagic")
_SEEDS = {"one call": 0, "sequential": 1000, "flowmagic": 2000}   # no shared cache entries
_ONE_CALL = ("You are an expert. Do the whole task in this one answer. Write every file the "
             "task asks for in full, each as a fenced block with its file name after the "
             "language, e.g. ```html index.html")
_JUDGE = ("You are a strict reviewer. Answer with JSON only: "
          '{"verdict": "pass" or "fail", "reason": "one sentence"}.')
_JUDGE_SCHEMA = {"type": "object", "required": ["verdict", "reason"], "properties": {
    "verdict": {"enum": ["pass", "fail"]}, "reason": {"type": "string"}}}


def _template_name(name: str) -> str:
    return TASKS.get(name, name)


def _read_template(name: str):
    from .._internal.nbformat_import import nbformat

    from ..ops.nbrun import template_path

    return nbformat.read(str(template_path(_template_name(name))), as_version=4)


def _criteria_of(nb) -> list[str]:
    meta = ((nb.metadata.get("flowmagic") or {}).get("template") or {})
    return [str(c) for c in meta.get("criteria") or []]


def is_task_template(name: str | None) -> bool:
    """Whether `name` (or its short name) is a template that declares criteria."""
    if not name:
        return False
    try:
        return bool(_criteria_of(_read_template(name)))
    except (ConfigError, FileNotFoundError, OSError):
        return False


def template_task(name: str, params: Any = None) -> tuple[str, dict, list[str]]:
    """(the task as the template's %%flow cell says it, with its parameters filled in, the
    parameters, the criteria it declares)."""
    from ..magic_grammar import interpolate
    from ..ops.nbrun import parameters_of, parse_params

    nb = _read_template(name)
    criteria = _criteria_of(nb)
    if not criteria:
        raise ConfigError(f"template {name!r} declares no criteria; the three tasks that do: "
                          f"{', '.join(TASKS)}")
    unknown = [c for c in criteria if c not in CRITERIA]
    if unknown:
        raise ConfigError(f"template {name!r} declares unknown criteria {', '.join(unknown)}")
    defaults = parameters_of(nb)
    given = parse_params(params, defaults) if isinstance(params, list) else dict(params or {})
    values = {**defaults, **given}
    cell = next((c for c in nb.cells if c.cell_type == "code"
                 and c.source.lstrip().startswith("%%flow")), None)
    if cell is None:
        raise ConfigError(f"template {name!r} has no %%flow cell to take the task from")
    body = cell.source.lstrip().split("\n", 1)[1]
    return interpolate(body, values).strip(), values, criteria


@dataclass
class Arm:
    """One method's run in one trial: its scores and what it took."""
    method: str
    trial: int
    scores: list[Score] = field(default_factory=list)
    time_s: float = 0.0
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    folder: str = ""
    error: str | None = None

    @property
    def success(self) -> float | None:
        values = [s.value for s in self.scores if s.value is not None]
        return sum(values) / len(values) if values else None

    def to_dict(self) -> dict:
        return {**asdict(self), "success": self.success}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _cell(value: Any) -> str:
    if value is None:
        return "n/c"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _markdown(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


@dataclass
class Comparison:
    """Every arm of every trial, and the paper's tables built from them."""
    template: str
    task: str
    criteria: list[str]
    arms: list[Arm]
    settings: dict = field(default_factory=dict)
    plan_time_s: list[float] = field(default_factory=list)

    def labels(self) -> list[str]:
        scored = next((a.scores for a in self.arms if a.scores), [])
        return [s.criterion for s in scored] or list(self.criteria)

    def how(self) -> dict[str, str]:
        """How each criterion was scored: "program", "LLM judge" or "not checkable"."""
        out: dict[str, str] = {}
        for arm in self.arms:
            for s in arm.scores:
                if out.get(s.criterion, "not checkable") == "not checkable":
                    out[s.criterion] = s.how
        return out

    def rows(self) -> list[dict]:
        """One row per method: each criterion's mean over trials, success, time, calls, tokens."""
        rows = []
        for method in METHODS:
            arms = [a for a in self.arms if a.method == method]
            if not arms:
                continue
            row: dict[str, Any] = {"method": method, "trials": len(arms)}
            for label in self.labels():
                row[label] = _mean(s.value for a in arms for s in a.scores if s.criterion == label)
            row.update(success=_mean(a.success for a in arms), time_s=_mean(a.time_s for a in arms),
                       calls=_mean(a.calls for a in arms), tokens=_mean(a.tokens for a in arms),
                       errors=sum(1 for a in arms if a.error))
            rows.append(row)
        return rows

    def to_frame(self):
        """rows() as a pandas DataFrame indexed by method (pandas: the `data` extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError("to_frame needs pandas: pip install 'flowmagic[data]'") from None
        return pd.DataFrame(self.rows()).set_index("method")

    def success_table(self) -> str:
        """Flow's Tables 1-3: one column per criterion (0/1, mean over trials), success = mean."""
        labels, how = self.labels(), self.how()
        head = ["method", *labels, "success"]
        checked = ["checked by", *[how.get(lab, "not checkable") for lab in labels],
                   "mean of the checkable"]
        return _markdown(head, [checked] + [[r["method"], *[r[lab] for lab in labels], r["success"]]
                                            for r in self.rows()])

    def time_table(self) -> str:
        """Flow's Table 9: time per method (planning counted apart), with calls and tokens."""
        return _markdown(["method", "time s", "calls", "tokens", "errors"],
                         [[r["method"], r["time_s"], r["calls"], r["tokens"], r["errors"]]
                          for r in self.rows()])

    def markdown(self) -> str:
        plan = _mean(self.plan_time_s)
        notes = ["n/c: not checkable here (counted in no mean)."]
        if plan is not None:
            notes.append(f"Planning took {plan:.1f} s per trial, shared by sequential and "
                         "flowmagic and not in their times.")
        for arm in self.arms:
            if arm.error:
                notes.append(f"{arm.method} (trial {arm.trial}) failed: {arm.error}")
        return "\n\n".join([f"{self.template}: {len({a.trial for a in self.arms})} trial(s)",
                            self.success_table(), self.time_table(), "\n".join(notes)])

    text = markdown

    def __repr__(self) -> str:
        return self.markdown()

    def _repr_html_(self) -> str:
        from ..view.safe import markdown_html   # an error line can quote the model
        return markdown_html(self.markdown())

    def to_dict(self) -> dict:
        return {"template": self.template, "task": self.task, "criteria": self.criteria,
                "settings": self.settings, "plan_time_s": self.plan_time_s, "how": self.how(),
                "rows": self.rows(), "arms": [a.to_dict() for a in self.arms]}


# -- the methods -----------------------------------------------------------------------------------
def _judge(llm, model: str | None, seed: int) -> Callable:
    from .._internal.text import keep_ends

    async def judge(question: str, text: str) -> tuple[bool, str]:
        messages = [{"role": "system", "content": _JUDGE},
                    {"role": "user", "content": f"{question}\n\n{keep_ends(text, 12000, ' [cut] ')}"}]
        try:
            reply = await llm.complete(messages, model=model, schema=_JUDGE_SCHEMA, seed=seed,
                                       max_tokens=200, purpose="judge")
        except FlowError as exc:
            return False, f"the judge could not answer: {exc}"
        data = reply.data if isinstance(reply.data, dict) else {}
        return data.get("verdict") == "pass", str(data.get("reason") or "")[:300]
    return judge


async def _one_call(task: str, arm: Arm, *, llm, model, seed: int, max_tokens) -> None:
    from ..engine.answer_code import execute
    from ..engine.workspace import Workspace

    messages = [{"role": "system", "content": _ONE_CALL}, {"role": "user", "content": task}]
    reply = await llm.complete_whole(messages, model=model, seed=seed, max_tokens=max_tokens,
                                     purpose="one-call baseline")
    arm.calls = 1 + reply.continuations
    arm.tokens = reply.input_tokens + reply.output_tokens
    arm.cost_usd = reply.cost_usd
    if reply.cut:   # scored as it is: what a cut file passes, it passes
        arm.error = f"the answer was still cut after {reply.continuations} continuation(s)"
    # named files are saved; nothing is run (mode "off")
    await asyncio.to_thread(execute, Workspace(arm.folder), "one_call", reply.text, mode="off")


async def _run_plan(base, arm: Arm, name: str, **settings: Any) -> None:
    from ..ops.batch import fresh_copy
    from ..flow import Flow

    flow = Flow(fresh_copy(base.workflow), name=name, llm=base.llm, **settings)
    arm.folder = str(flow.workspace.root)
    await flow.arun()
    total = flow.cost_data()["total"]
    arm.calls, arm.cost_usd = total["calls"], total["cost_usd"]
    arm.tokens = total["input_tokens"] + total["output_tokens"]
    if flow.status != "done":
        arm.error = f"the run ended {flow.status}"


async def _timed(arm: Arm, work) -> Arm:
    started = time.perf_counter()
    try:
        await work
    except FlowError as exc:   # a method that cannot finish scores what it left
        arm.error = " ".join(str(exc).split())[:300]
    arm.time_s = time.perf_counter() - started
    return arm


async def _trial(task: str, i: int, comp: Comparison, params: dict, *, llm, model, k: int,
                 seed: int, settings: dict, judge: bool, sandbox: str, max_tokens,
                 progress: Callable[[Arm], None] | None) -> None:
    from ..flow import aplan
    from ..store import home

    verdicts = _judge(llm, model, seed) if judge else None

    async def finish(arm: Arm) -> None:
        """Score what the method left, as soon as it is done (the progress line says so)."""
        if arm.folder:
            arm.scores = await score(comp.criteria, Path(arm.folder), params, judge=verdicts,
                                     sandbox=sandbox)
        else:
            arm.scores = [Score(c, 0.0, "program", "the method made no files") for c in comp.criteria]
        comp.arms.append(arm)
        if progress is not None:
            progress(arm)

    where = home() / "baselines"
    where.mkdir(exist_ok=True)
    one = Arm("one call", i, folder=tempfile.mkdtemp(prefix=f"{comp.template}_{i}_", dir=where))
    await finish(await _timed(one, _one_call(task, one, llm=llm, model=model,
                                             seed=seed + _SEEDS["one call"], max_tokens=max_tokens)))
    started = time.perf_counter()
    try:
        base = await aplan(task, k=k, model=model, llm=llm, name=f"{comp.template}_plan_{i}",
                           seed=seed, **settings)
    except FlowError as exc:
        comp.plan_time_s.append(time.perf_counter() - started)
        for method in METHODS[1:]:
            await finish(Arm(method, i, error=f"planning failed: {' '.join(str(exc).split())[:240]}"))
        return
    comp.plan_time_s.append(time.perf_counter() - started)
    runs = (("sequential", "seq", {"concurrency": 1, "update": "off"}),
            ("flowmagic", "flow", {"update": settings.get("update", "after-completion")}))
    for method, tag, own in runs:
        arm = Arm(method, i)
        await finish(await _timed(arm, _run_plan(base, arm, f"{comp.template}_{tag}_{i}", **{
            **settings, **own, "seed": seed + _SEEDS[method]})))


async def acompare(template: str, *, params: Any = None, n: int = 1, k: int = 1,
                   model: str | None = None, seed: int = 0, judge: bool = True,
                   llm: Any = None, progress: Callable[[Arm], None] | None = None,
                   **settings: Any) -> Comparison:
    """Run the template's task `n` times each way (one call, sequential, flowmagic) and
    score every run by the template's criteria. `settings` are Flow settings for both plan
    runs (the sequential one always runs one node at a time with no updates); `judge=False`
    leaves the criteria only a reader can judge not checked."""
    from ..settings import Settings

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n is the number of trials, a whole number >= 1, not {n!r}")
    task, values, criteria = template_task(template, params)
    Settings.refuse_unknown(sorted(settings))
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    sandbox = settings.get("sandbox") or "bwrap"
    comp = Comparison(_template_name(template), task, criteria, [],
                      {"n": n, "k": k, "model": model, "seed": seed, "params": values, **settings})
    for i in range(n):
        await _trial(task, i, comp, values, llm=llm, model=model, k=k, seed=seed + i,
                     settings=settings, judge=judge, sandbox=sandbox,
                     max_tokens=settings.get("max_tokens"), progress=progress)
    return comp


def compare_task(template: str, **options: Any) -> Comparison:
    """`acompare` for scripts; in a notebook use `await acompare(...)`."""
    from .._internal.aio import run_blocking

    llm = options.pop("llm", None)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    return run_blocking(lambda: acompare(template, llm=llm, **options), close=llm.aclose,
                        name="flowmagic-compare")
