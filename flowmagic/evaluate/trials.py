"""Trials: the papers' experiments in miniature, on any endpoint.

`trials(plan_or_task, n=5, ...)` runs N trials per condition, each with a fresh seed (the
response cache would otherwise make every trial identical), under conditions such as
with vs without updates and several masking rates (Flow's robustness experiment). A
trial succeeds by a user function `success(flow) -> bool | float`, or by checks (text
the final result must contain; a template's `checks` metadata). The report gives Flow's
tables in miniature (success rates, time, updates and change ratios) and, when an
expected answer and a gold plan are given, each trial's answer score beside its plan
scores with their correlation (CARIAD's question: do better plans give better answers?).

A task (text) is planned again in every trial with that trial's seed, so plans, and
their scores, vary; a plan (a dict, a Workflow or a Flow) is run as it is.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from .._internal.aio import gather_all
from ..errors import ConfigError
from ..model.status import RunState, Status

__all__ = ["Trial", "TrialReport", "trials", "atrials", "template_checks", "changed_originals",
           "CONDITIONS"]

# The default comparison, Flow's Table 4: the same runs with the updater called after every
# node once nothing runs (the paper's default strategy) and with no updater.
CONDITIONS = {"with updates": {"update": "after-completion"}, "without updates": {"update": "off"}}
# What changes a subtask of the plan (an added subtask is not one of the plan's own).
_CHANGES = ("removed", "edited", "rerun", "reassigned", "rewired")


@dataclass
class Trial:
    """One run: its condition, seed, outcome and figures."""
    condition: str
    mask_rate: float
    index: int
    seed: int
    run_id: str | None = None
    status: str = ""   # a RunState once it ran
    success: float = 0.0
    duration_s: float = 0.0
    updates: int = 0
    initial_tasks: int = 0   # the plan's size when the run started
    changed_tasks: int = 0   # subtasks of that plan some update changed, each counted once
    calls: int = 0
    cost_usd: float = 0.0
    answer_score: float | None = None
    plan_scores: dict = field(default_factory=dict)   # ssi, node_f1, edge_f1 against gold
    error: str | None = None

    @property
    def change_ratio(self) -> float:
        """Flow's Table 5: changed original subtasks / the initial plan's size."""
        return self.changed_tasks / self.initial_tasks if self.initial_tasks else 0.0


def changed_originals(initial: Any, update_log: list[dict]) -> list[str]:
    """The subtasks of the initial plan (ids) that any update of the log removed, edited,
    reran, reassigned or rewired, each once, in plan order; added subtasks do not count."""
    touched = {i for entry in update_log for key in _CHANGES
               for i in ((entry.get("diff") or {}).get(key) or [])}
    return [i for i in initial if i in touched]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class TrialReport:
    """Every trial, and the tables built from them."""
    trials: list[Trial]
    settings: dict = field(default_factory=dict)

    def groups(self) -> dict[tuple[str, float], list[Trial]]:
        out: dict[tuple[str, float], list[Trial]] = {}
        for t in self.trials:
            out.setdefault((t.condition, t.mask_rate), []).append(t)
        return out

    def rows(self) -> list[dict]:
        """One row per (condition, mask rate): the figures of Flow's Tables 4, 5 and 9."""
        rows = []
        for (condition, rate), ts in self.groups().items():
            rows.append({
                "condition": condition, "mask_rate": rate, "trials": len(ts),
                "success_rate": _mean(t.success for t in ts),
                "mean_time_s": _mean(t.duration_s for t in ts),
                "mean_calls": _mean(t.calls for t in ts),
                "mean_updates": _mean(t.updates for t in ts),
                "change_ratio": _mean(t.change_ratio for t in ts if t.error is None),
                "answer_score": _mean(t.answer_score for t in ts),
                "plan_ssi": _mean(t.plan_scores.get("ssi") for t in ts),
                "errors": sum(1 for t in ts if t.error)})
        return rows

    def success_table(self) -> str:
        """Success rate by condition (rows) and masking rate (columns): Flow's Tables 4 and 9."""
        rates = sorted({t.mask_rate for t in self.trials})
        by = {(r["condition"], r["mask_rate"]): r for r in self.rows()}
        conditions = list(dict.fromkeys(t.condition for t in self.trials))
        return _markdown(["condition", *[f"mask {r:g}" for r in rates]],
                         [[c, *[(by.get((c, r)) or {}).get("success_rate") for r in rates]]
                          for c in conditions])

    def cost_table(self) -> str:
        """Time, calls, updates and the change ratio (Flow's Table 5 and its update figures)."""
        return _markdown(["condition", "mask", "trials", "time s", "calls", "updates", "change ratio"],
                         [[r["condition"], r["mask_rate"], r["trials"], r["mean_time_s"],
                           r["mean_calls"], r["mean_updates"], r["change_ratio"]] for r in self.rows()])

    def correlations(self) -> dict[str, float | None]:
        """Pearson correlation of the answer score with each plan score, over all trials
        (None when either side does not vary)."""
        scored = [t for t in self.trials if t.answer_score is not None and t.plan_scores]
        out: dict[str, float | None] = {}
        for key in sorted({k for t in scored for k in t.plan_scores}):
            xs = [t.plan_scores[key] for t in scored if t.plan_scores.get(key) is not None]
            ys = [t.answer_score for t in scored if t.plan_scores.get(key) is not None]
            try:
                out[key] = statistics.correlation(xs, ys) if len(xs) >= 2 else None
            except statistics.StatisticsError:   # a constant column
                out[key] = None
        return out

    def answer_table(self) -> str:
        """Each trial's answer score beside its plan scores (CARIAD's end-to-end check)."""
        keys = sorted({k for t in self.trials for k in t.plan_scores})
        return _markdown(["condition", "mask", "trial", "answer", *keys],
                         [[t.condition, t.mask_rate, t.index, t.answer_score,
                           *[t.plan_scores.get(k) for k in keys]] for t in self.trials])

    def text(self) -> str:
        parts = [f"{len(self.trials)} trials", "Success rate", self.success_table(),
                 "Time, calls and updates", self.cost_table()]
        if any(t.answer_score is not None for t in self.trials):
            parts += ["Answers and plans", self.answer_table()]
            corr = self.correlations()
            if corr:
                parts.append("correlation with the answer score: " + ", ".join(
                    f"{k} {_fmt(v)}" for k, v in corr.items()))
        errors = [t for t in self.trials if t.error]
        if errors:
            parts.append(f"{len(errors)} trial(s) failed to run, e.g. {errors[0].error}")
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        from ..view.safe import markdown_html   # a trial's error can quote the model

        return markdown_html(self.text())

    def to_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows(),
                "trials": [{**asdict(t), "change_ratio": t.change_ratio} for t in self.trials],
                "correlations": self.correlations()}


# -- success ---------------------------------------------------------------------------------------
def template_checks(name: str) -> list[str]:
    """The `checks` a template declares in its metadata (flowmagic.template.checks)."""
    from .._internal.nbformat_import import nbformat

    from ..ops.nbrun import template_path

    nb = nbformat.read(str(template_path(name)), as_version=4)
    checks = ((nb.metadata.get("flowmagic") or {}).get("template") or {}).get("checks")
    if not checks:
        raise ConfigError(f"template {name!r} declares no checks; pass success= or checks=")
    return [str(c) for c in checks]


def _success_fn(success: Callable | None, checks: list[str] | None) -> Callable:
    if success is not None and checks:
        raise ConfigError("give success= or checks=, not both")
    if success is not None:
        if not callable(success):
            raise ConfigError("success must be a function flow -> bool or a number in [0, 1]")
        return success
    if checks:
        wanted = [c.lower() for c in checks]
        return lambda flow: all(w in (flow.result or _outputs(flow)).lower() for w in wanted)
    return lambda flow: flow.status == RunState.DONE


def _outputs(flow) -> str:
    return "\n".join(n.output or "" for n in flow.workflow.nodes.values() if n.status == Status.DONE)


# -- running ------------------------------------------------------------------------------------
def _conditions(conditions: Any) -> dict[str, dict]:
    conditions = CONDITIONS if conditions is None else conditions
    if isinstance(conditions, (list, tuple)):   # ["on-failure", "off"]: update strategies
        conditions = {f"update={c}": {"update": c} for c in conditions}
    if not isinstance(conditions, dict) or not conditions:
        raise ConfigError("conditions maps a name to Flow settings, e.g. "
                          "{'with updates': {'update': 'on-failure'}, 'without': {'update': 'off'}}")
    return {str(k): dict(v or {}) for k, v in conditions.items()}


async def _one(source, trial: Trial, settings: dict, *, llm, judge: Callable, expected,
               scorer, plan_score) -> Trial:
    from ..errors import FlowError
    from ..flow import Flow, aplan
    from ..model.graph import Workflow
    from ..ops import batch

    started = time.perf_counter()
    name = f"trial_{trial.index}"
    try:
        if isinstance(source, str):
            flow = await aplan(source, llm=llm, name=name, **settings)
        else:
            wf = source.workflow if hasattr(source, "workflow") else source
            wf = batch.fresh_copy(wf if isinstance(wf, Workflow) else Workflow.from_dict(wf))
            flow = Flow(wf, name=name, llm=llm, **settings)
        initial = [i for i, n in flow.workflow.nodes.items() if n.status != Status.PRUNED]
        await flow.arun()
    except FlowError as exc:   # a trial that cannot run is a failed trial, not a crashed study
        trial.error, trial.status = str(exc), RunState.ERROR
        trial.duration_s = time.perf_counter() - started
        return trial
    trial.duration_s = time.perf_counter() - started
    trial.run_id, trial.status = flow.run_id, flow.status
    value = judge(flow)
    trial.success = float(value) if not isinstance(value, bool) else (1.0 if value else 0.0)
    trial.updates = len(flow.update_log)
    trial.initial_tasks = len(initial)
    trial.changed_tasks = len(changed_originals(initial, flow.update_log))
    cost = flow.cost_data()["total"]
    trial.calls, trial.cost_usd = cost["calls"], cost["cost_usd"]
    if expected is not None:
        trial.answer_score = await batch.score(scorer, flow.result or _outputs(flow),
                                               {"expected": expected})
    if plan_score is not None:
        scores = plan_score(flow.workflow)
        scores = scores.as_dict() if hasattr(scores, "as_dict") else dict(scores)
        trial.plan_scores = {k: float(v) for k, v in scores.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return trial


async def atrials(source: Any, *, n: int = 5, conditions: Any = None,
                  mask_rates: Any = (0.0,), success: Callable | None = None,
                  checks: list[str] | None = None, template: str | None = None,
                  expected: Any = None, scorer: Any = "contains",
                  plan_score: Callable | None = None,
                  seed: int = 0, concurrency: int = 2, llm: Any = None,
                  progress: Callable[[Trial], None] | None = None, **settings: Any) -> TrialReport:
    """Run `n` trials of `source` (a task, a plan dict, a Workflow or a Flow) for every
    condition and masking rate; trial i of every condition has seed `seed + i`.

    `settings` are Flow settings shared by every trial (model, k, validate, ...); each
    condition's settings go on top, then `mask_rate`. Success: `success(flow)`, else the
    `checks` (or the template's) found in the result, else the run finished. With
    `expected` the result is scored by `scorer` (batch's "contains", "exact", "judge" or a
    function); `plan_score(workflow) -> dict of numbers` scores each trial's plan, e.g.
    `lambda wf: flowmagic.evaluate.compare(wf, gold)` (its Scores are read as a dict).
    """
    from ..settings import Settings
    from ..ops.batch import get_scorer

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n is the number of trials per condition, a whole number >= 1, not {n!r}")
    if isinstance(mask_rates, (int, float)):
        mask_rates = (mask_rates,)
    rates = [float(r) for r in mask_rates]
    if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
        raise ConfigError("mask_rates are numbers between 0 and 1, e.g. (0.0, 0.2, 0.5)")
    if template is not None:
        checks = template_checks(template)
    judge = _success_fn(success, checks)
    conds = _conditions(conditions)
    given = sorted({k for c in conds.values() for k in c} | set(settings))
    Settings.refuse_unknown(given)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    score_fn = get_scorer(scorer)
    limit = asyncio.Semaphore(max(1, int(concurrency)))
    plan = [(name, cond, rate, i) for name, cond in conds.items() for rate in rates for i in range(n)]

    async def one(name, cond, rate, i):
        trial = Trial(condition=name, mask_rate=rate, index=i, seed=seed + i)
        merged = {**settings, **cond, "mask_rate": rate, "seed": seed + i}
        async with limit:
            out = await _one(source, trial, merged, llm=llm, judge=judge, expected=expected,
                             scorer=score_fn, plan_score=plan_score)
        if progress is not None:
            progress(out)
        return out

    done = await gather_all(one(*p) for p in plan)
    return TrialReport(list(done), {"n": n, "conditions": conds, "mask_rates": rates,
                                    "seed": seed, "checks": checks, "settings": settings})


def trials(source: Any, **options: Any) -> TrialReport:
    """`atrials` to its end, in a script or a notebook cell, with a progress bar."""
    from .._internal.aio import run_blocking
    from .._internal.bars import progress_bar, ticking

    llm = options.pop("llm", None)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    with progress_bar("trials", unit="trial") as bar:
        options["progress"] = ticking(bar, options.get("progress"))
        return run_blocking(lambda: atrials(source, llm=llm, **options), close=llm.aclose,
                            name="flowmagic-trials")
