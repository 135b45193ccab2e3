"""CORAL's comparison: the same tasks as a planned workflow and under the orchestrator.

`compare_modes(tasks, scorer)` runs every task both ways on the same model: **workflow**
(planned with K candidates and run, planning counted) and **orchestrator** (messages
between an orchestrator and its agents, with CORAL's consensus step). Each answer is scored
by `scorer(answer, example) -> float` (e.g. `flowmagic.ops.batch.contains`); a task passes
when its score reaches `threshold`. The report gives, per mode, the pass rate (CORAL's RQ1),
the distribution of tokens per task (RQ2: min, quartiles, max, and every task's count) and
the time per task.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..errors import ConfigError, FlowError

__all__ = ["MODES", "ModeRun", "ModeComparison", "acompare_modes", "compare_modes"]

MODES = ("workflow", "orchestrator")


@dataclass
class ModeRun:
    """One task under one mode."""
    mode: str
    index: int
    score: float = 0.0
    passed: bool = False
    tokens: int = 0
    calls: int = 0
    time_s: float = 0.0
    answer: str = ""
    error: str | None = None


def _quantiles(values: list[float]) -> tuple:
    """(min, first quartile, median, third quartile, max); one value repeats."""
    if len(values) == 1:
        return (values[0],) * 5
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return min(values), q1, q2, q3, max(values)


def _fmt(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


@dataclass
class ModeComparison:
    runs: list[ModeRun]
    settings: dict = field(default_factory=dict)

    def rows(self) -> list[dict]:
        rows = []
        for mode in MODES:
            runs = [r for r in self.runs if r.mode == mode]
            if not runs:
                continue
            tokens = [float(r.tokens) for r in runs]
            lo, q1, med, q3, hi = _quantiles(tokens)
            rows.append({"mode": mode, "tasks": len(runs),
                         "pass_rate": sum(r.passed for r in runs) / len(runs),
                         "mean_score": statistics.fmean(r.score for r in runs),
                         "tokens_min": lo, "tokens_q1": q1, "tokens_median": med,
                         "tokens_q3": q3, "tokens_max": hi,
                         "tokens_per_task": [r.tokens for r in runs],
                         "time_mean_s": statistics.fmean(r.time_s for r in runs),
                         "time_median_s": statistics.median(r.time_s for r in runs),
                         "errors": sum(1 for r in runs if r.error)})
        return rows

    def markdown(self) -> str:
        head = ["mode", "tasks", "pass rate", "tokens min", "q1", "median", "q3", "max",
                "time mean s", "time median s", "errors"]
        keys = ["mode", "tasks", "pass_rate", "tokens_min", "tokens_q1", "tokens_median",
                "tokens_q3", "tokens_max", "time_mean_s", "time_median_s", "errors"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in self.rows()]
        per = "; ".join(f"{r['mode']}: {r['tokens_per_task']}" for r in self.rows())
        return "\n".join(lines) + f"\n\ntokens per task: {per}"

    text = markdown

    def __repr__(self) -> str:
        return self.markdown()

    def to_frame(self):
        """One row per task and mode (pandas: the `data` extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError("to_frame needs pandas: pip install 'flowmagic[data]'") from None
        return pd.DataFrame([asdict(r) for r in self.runs])

    def to_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows(),
                "runs": [asdict(r) for r in self.runs]}


def _examples(tasks: Any) -> list[dict]:
    out = []
    for item in tasks or []:
        example = {"task": item} if isinstance(item, str) else dict(item) if isinstance(item, dict) else None
        if not example or not isinstance(example.get("task"), str) or not example["task"].strip():
            raise ConfigError("tasks are texts or dicts with a 'task' text (and what your scorer "
                              f"reads, e.g. 'expected'), not {item!r:.80}")
        out.append(example)
    if not out:
        raise ConfigError("compare_modes needs at least one task")
    return out


async def _score(scorer: Callable, answer: str, example: dict) -> float:
    value = scorer(answer, example)
    if inspect.isawaitable(value):
        value = await value
    return float(value)


async def _workflow(example: dict, run: ModeRun, *, llm, model, k: int, settings: dict) -> str:
    from ..flow import aplan

    flow = await aplan(example["task"], k=k, model=model, llm=llm, name=f"mode_{run.index}",
                       **settings)
    await flow.arun()
    total = flow.cost_data()["total"]   # planning included
    run.tokens, run.calls = total["input_tokens"] + total["output_tokens"], total["calls"]
    done = [n.output or "" for n in flow.workflow.nodes.values() if n.status == "done"]
    return flow.result or "\n".join(done)


async def _orchestrator(example: dict, run: ModeRun, *, llm, model, options: dict) -> str:
    from .hub import Orchestrator

    o = await Orchestrator(example["task"], llm=llm, model=model, name=f"mode_{run.index}",
                           **options).run()
    run.tokens, run.calls = o.tokens_in + o.tokens_out, o.calls
    return o.answer or ""


async def acompare_modes(tasks: Any, scorer: Callable, *, threshold: float = 1.0, k: int = 1,
                         model: str | None = None, llm: Any = None,
                         orchestrator: dict | None = None,
                         progress: Callable[[ModeRun], None] | None = None,
                         **settings: Any) -> ModeComparison:
    """Every task as a workflow (Flow `settings`, `k` candidate plans) and under the
    orchestrator (`orchestrator=` its options: agents, max_turns, budget_s, ...), one
    after the other so their times do not share the machine."""
    if not callable(scorer):
        raise ConfigError("scorer is a function (answer, example) -> float, e.g. "
                          "flowmagic.ops.batch.contains")
    examples = _examples(tasks)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    runs = []
    for i, example in enumerate(examples):
        for mode in MODES:
            run = ModeRun(mode, i)
            started = time.perf_counter()
            try:
                work = (_workflow(example, run, llm=llm, model=model, k=k, settings=settings)
                        if mode == "workflow" else
                        _orchestrator(example, run, llm=llm, model=model,
                                      options=dict(orchestrator or {})))
                run.answer = await work
            except FlowError as exc:   # a task that cannot run fails; the study goes on
                run.error = " ".join(str(exc).split())[:300]
            run.time_s = time.perf_counter() - started
            run.score = await _score(scorer, run.answer, example)
            run.passed = run.score >= threshold
            runs.append(run)
            if progress is not None:
                progress(run)
    return ModeComparison(runs, {"k": k, "model": model, "threshold": threshold,
                                 "orchestrator": dict(orchestrator or {}), **settings})


def compare_modes(tasks: Any, scorer: Callable, **options: Any) -> ModeComparison:
    """`acompare_modes` for scripts; in a notebook `await acompare_modes(...)`."""
    from .._internal.aio import run_blocking

    llm = options.pop("llm", None)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    return run_blocking(lambda: acompare_modes(tasks, scorer, llm=llm, **options),
                        close=llm.aclose, name="flowmagic-modes")
