"""Batch runs: the same workflow (structure, prompts, models) on many inputs, and probe sets.

`amap(flow, inputs)` runs one fresh copy of the workflow per input, up to `concurrency`
inputs at once, each with the usual Executor (so the nodes of one input run concurrently
too, and the LLM's process-wide limit still holds). In every requirement and in the task,
`{{input}}` becomes the input and `{{field}}` a field of a dict input; when the workflow
has no placeholder at all, the input is appended to the task so every node sees it.

The final result of one input is the output of the workflow's sink (the active node
nobody depends on) when there is exactly one; with several sinks it is the consolidation
call's answer (setting `consolidate`, the default), else the sinks' outputs joined.

Cost is list price: every call of the run (cache hits included, since a cached answer is
free only on this machine) is priced from the price table by the model that made it, so
a downgraded node is priced at the cheap model's prices.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..llm.endpoints import price_of
from .._internal.aio import gather_all, run_blocking
from ..errors import ConfigError, FlowError
from ..model.graph import Workflow
from ..model import status as transition
from ..model.status import RunState, Status

# "Flow" in annotations is flowmagic.flow.Flow: the layer above, which hands itself in.
if TYPE_CHECKING:
    from ..llm.client import LLM

__all__ = ["Item", "BatchRun", "Probe", "Evaluation", "amap", "evaluate", "probe_set",
           "instantiate", "fresh_copy", "sinks", "exact_match", "contains", "LLMJudge",
           "get_scorer", "score", "price_call", "run_sync", "gather_all", "EXPECTED_KEYS",
           "canonical", "fingerprint", "result_frame", "NOT_RUN"]

PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
EXPECTED_KEYS = ("expected", "answer", "target")


# -- one input --------------------------------------------------------------------------
def fresh_copy(workflow: Workflow) -> Workflow:
    """A copy with every run state cleared; pruned nodes stay pruned, models stay as set."""
    wf = workflow.copy()
    for node in wf.nodes.values():
        if node.status != Status.PRUNED:
            transition.requeue(node)   # execution kept: it is in map fingerprints
        node.output = node.error = node.clone = None
        node.start = node.end = None
        node.attempts, node.tokens_in, node.tokens_out, node.cost_usd = [], 0, 0, 0.0
        node.stale = False
    return wf


def sinks(workflow: Workflow) -> list[str]:
    """Active nodes with no active child, in plan order: they produce the final result."""
    g = workflow.active()
    return [i for i in g.nodes if g.out_degree(i) == 0]


def _fields(example: Any) -> dict[str, str]:
    if isinstance(example, dict):
        out = {str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
               for k, v in example.items()}
        if "input" not in out:
            rest = {k: v for k, v in example.items() if k not in EXPECTED_KEYS}
            out["input"] = json.dumps(rest, ensure_ascii=False)
        return out
    return {"input": example if isinstance(example, str) else json.dumps(example, ensure_ascii=False)}


def instantiate(workflow: Workflow, example: Any, index: int = 0) -> Workflow:
    """A fresh copy with `{{input}}` / `{{field}}` filled in from `example`."""
    wf = fresh_copy(workflow)
    values = _fields(example)
    used = False

    def fill(text: str, where: str) -> str:
        def one(match: re.Match) -> str:
            nonlocal used
            name = match.group(1)
            if name not in values:
                raise ConfigError(f"input {index} has no field {name!r} used as {{{{{name}}}}} in "
                                  f"{where}; add the field or change the text")
            used = True
            return values[name]
        return PLACEHOLDER.sub(one, text)

    wf.task = fill(wf.task, "the task")
    for node in wf.nodes.values():
        node.requirement = fill(node.requirement, f"node {node.id!r}")
    if not used:
        wf.task = f"{wf.task}\n\nInput:\n{values['input']}".strip()
    return wf


def canonical(value: Any) -> str:
    """One JSON text per value (keys sorted; numpy numbers and the like as their str)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def fingerprint(base: str, example: Any) -> str:
    """sha256 of (what every input of a batch shares, this input): a batch input's identity,
    so a distributed map started again skips the inputs it already finished."""
    return hashlib.sha256(f"{base}\n{canonical(example)}".encode()).hexdigest()


@dataclass
class Item:
    """One input's run: its final result, tokens and list-price cost (by node too)."""
    index: int
    input: Any
    result: str | None = None
    state: RunState = RunState.PENDING
    error: str | None = None
    score: float | None = None
    run_id: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0        # list price of every call of the run
    paid_usd: float = 0.0        # what was actually spent (cache hits are free)
    duration_s: float = 0.0
    nodes: dict[str, dict] = field(default_factory=dict)   # node -> tokens, cost, models
    outputs: dict[str, str | None] = field(default_factory=dict)   # node -> its output
    unpriced: list[str] = field(default_factory=list)      # model ids with no price

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def price_call(model_id: str, tokens_in: int, tokens_out: int) -> float | None:
    """USD for one call of `model_id` ("endpoint:model"), or None when the model has no price."""
    endpoint, _, name = (model_id or "").partition(":")
    price = price_of(name or endpoint, local=endpoint == "local")
    if price is None:
        return None
    return (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000


def _account(item: Item, rows: list[dict]) -> None:
    for row in rows:
        t_in, t_out = int(row["input_tokens"] or 0), int(row["output_tokens"] or 0)
        usd = price_call(row["model"], t_in, t_out)
        if usd is None:
            usd = 0.0
            if row["model"] not in item.unpriced:
                item.unpriced.append(row["model"])
        item.tokens_in += t_in
        item.tokens_out += t_out
        item.cost_usd += usd
        item.paid_usd += float(row["cost_usd"] or 0.0)
        key = row["node_id"] or f"({row['purpose'] or 'other'})"
        slot = item.nodes.setdefault(key, {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0,
                                           "models": []})
        slot["tokens_in"] += t_in
        slot["tokens_out"] += t_out
        slot["cost_usd"] += usd
        if row["model"] not in slot["models"]:
            slot["models"].append(row["model"])


def _final_result(flow: "Flow", ends: list[str], consolidated: bool) -> str | None:
    if consolidated:
        return flow.result
    outputs = [(i, flow.workflow.nodes[i].output or "") for i in ends]
    if len(outputs) == 1:
        return outputs[0][1]
    return "\n\n".join(f"[{i}]\n{text}" for i, text in outputs)


async def run_one(flow: "Flow", workflow: Workflow, example: Any, index: int,
                  scorer: Callable | None = None) -> Item:
    """Run a fresh instance of `workflow` on one input with `flow`'s settings, LLM and store."""
    wf = instantiate(workflow, example, index)
    ends = sinks(wf)
    if not ends:
        raise ConfigError("the workflow has no active nodes; nothing to run")
    consolidated = bool(flow.settings.consolidate) and len(ends) > 1
    # The same workflow on every input: no updater rewriting it mid-run.
    child = flow.derive(wf, name=f"{flow.name}[{index}]", update="off", consolidate=consolidated)
    item = Item(index=index, input=example, run_id=child.run_id)
    started = time.perf_counter()
    try:
        item.state = await child.arun()
    except FlowError as exc:
        item.state, item.error = RunState.FAILED, str(exc)
    item.duration_s = time.perf_counter() - started
    item.outputs = {n.id: n.output for n in wf.nodes.values() if n.status != Status.PRUNED}
    if item.state == RunState.DONE:
        item.result = _final_result(child, ends, consolidated)
    elif item.error is None:
        failed = [n for n in wf.nodes.values() if n.status == Status.FAILED]
        item.error = (f"node {failed[0].id!r} failed: {failed[0].error}" if failed
                      else child.message or f"the run ended {item.state}")
    _account(item, flow.store.usage(child.run_id))
    if scorer is not None:
        item.score = await score(scorer, item.result, example) if item.result is not None else 0.0
    return item


# -- many inputs ----------------------------------------------------------------------------
@dataclass
class BatchRun:
    """Per-input results in input order, with totals; `max_active` is the measured peak."""
    items: list[Item]
    concurrency: int
    max_active: int = 0
    elapsed_s: float = 0.0

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, i: int) -> Item:
        return self.items[i]

    @property
    def results(self) -> list[str | None]:
        return [i.result for i in self.items]

    @property
    def cost_usd(self) -> float:
        return sum(i.cost_usd for i in self.items)

    @property
    def tokens(self) -> tuple[int, int]:
        return sum(i.tokens_in for i in self.items), sum(i.tokens_out for i in self.items)

    @property
    def score(self) -> float | None:
        scores = [i.score for i in self.items if i.score is not None]
        return sum(scores) / len(scores) if scores else None

    def to_rows(self) -> list[dict]:
        return [{"index": i.index, "state": i.state, "score": i.score, "tokens_in": i.tokens_in,
                 "tokens_out": i.tokens_out, "cost_usd": i.cost_usd, "error": i.error,
                 "result": i.result} for i in self.items]

    def __repr__(self) -> str:
        done = sum(i.state == RunState.DONE for i in self.items)
        scored = "" if self.score is None else f", score {self.score:.3f}"
        return (f"<BatchRun {done}/{len(self.items)} done, ${self.cost_usd:.6f}{scored}, "
                f"{self.elapsed_s:.2f}s>")


async def amap(flow: "Flow", inputs: Iterable[Any], *, concurrency: int | None = 4,
               scorer: Any = None, workflow: Workflow | None = None,
               limit: asyncio.Semaphore | None = None,
               progress: Callable[[Item], Any] | None = None) -> BatchRun:
    """Run `workflow` (default: the flow's) once per input, at most `concurrency` at once;
    `progress(item)` hears each input as it finishes."""
    if hasattr(inputs, "to_dict") and hasattr(inputs, "columns"):   # a pandas DataFrame
        inputs = [{str(k): v for k, v in row.items()} for row in inputs.to_dict("records")]
    inputs = list(inputs)
    if not inputs:
        raise ConfigError("map() needs at least one input")
    if concurrency is not None and int(concurrency) < 1:
        raise ConfigError("concurrency must be at least 1 (or None for no limit)")
    scorer = get_scorer(scorer) if scorer is not None else None
    gate = limit or asyncio.Semaphore(int(concurrency) if concurrency else len(inputs))
    workflow = workflow if workflow is not None else flow.workflow
    batch = BatchRun([], int(concurrency or len(inputs)))
    active = 0

    async def one(index: int, example: Any) -> Item:
        nonlocal active
        async with gate:
            active += 1
            batch.max_active = max(batch.max_active, active)
            try:
                item = await run_one(flow, workflow, example, index, scorer)
            finally:
                active -= 1
        if progress is not None:
            progress(item)
        return item

    started = time.perf_counter()
    batch.items = await gather_all([one(i, x) for i, x in enumerate(inputs)])
    batch.elapsed_s = time.perf_counter() - started
    return batch


def run_sync(flow: "Flow", make: Callable[[], Any], name: str) -> Any:
    """A coroutine run to its end, in a script or a notebook cell (a worker thread's loop,
    see _internal.aio; `await flow.a{name}(...)` is the way that leaves the cell free)."""
    return run_blocking(make, close=flow.llm.aclose, on_interrupt=flow.stop,
                        name=f"flowmagic-{name}")


# -- scorers --------------------------------------------------------------------------------
def _norm(text: Any) -> str:
    return " ".join(str(text).split()).casefold()


def _expected(example: Any, scorer: str) -> Any:
    if isinstance(example, dict):
        for key in EXPECTED_KEYS:
            if key in example:
                return example[key]
    raise ConfigError(f"the {scorer} scorer needs an 'expected' field in every example "
                      "(a dict such as {'input': ..., 'expected': ...}); or pass your own scorer")


def exact_match(result: str | None, example: Any) -> float:
    """1.0 when the result equals the expected answer (case and spacing ignored)."""
    return float(_norm(result or "") == _norm(_expected(example, "exact-match")))


def contains(result: str | None, example: Any) -> float:
    """1.0 when the expected answer appears in the result (case and spacing ignored)."""
    return float(_norm(_expected(example, "contains")) in _norm(result or ""))


_JUDGE_SCHEMA = {"type": "object", "required": ["score"],
                 "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1},
                                "reason": {"type": "string"}}}


class LLMJudge:
    """An LLM scores each result from 0 to 1 (against the expected answer when there is one)."""

    def __init__(self, model: str | None = None, rubric: str = "", llm: "LLM | None" = None):
        self.model, self.rubric, self.llm = model, rubric, llm

    async def __call__(self, result: str | None, example: Any) -> float:
        from ..llm.client import get_llm

        expected = next((example[k] for k in EXPECTED_KEYS
                         if isinstance(example, dict) and k in example), None)
        parts = [f"Input:\n{_fields(example)['input']}"]
        if expected is not None:
            parts.append(f"Expected answer:\n{expected}")
        parts += [f"Result to grade:\n{result or ''}",
                  self.rubric or "Grade how well the result answers the input.",
                  'Reply with JSON {"score": a number from 0 (wrong) to 1 (right), "reason": "..."}.']
        reply = await (self.llm or get_llm()).complete(
            [{"role": "system", "content": "You are a strict, fair grader."},
             {"role": "user", "content": "\n\n".join(parts)}],
            model=self.model, schema=_JUDGE_SCHEMA, temperature=0, seed=0, purpose="judge")
        value = (reply.data or {}).get("score") if isinstance(reply.data, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"the judge model answered without a numeric score: {reply.text[:120]!r}")
        return min(1.0, max(0.0, float(value)))


SCORERS = {"exact": exact_match, "exact_match": exact_match, "contains": contains}


def get_scorer(spec: Any) -> Callable:
    """A scorer from a name ("exact", "contains", "judge") or a `(result, example) -> float`."""
    if callable(spec):
        return spec
    if spec == "judge":
        return LLMJudge()
    if isinstance(spec, str) and spec in SCORERS:
        return SCORERS[spec]
    raise ConfigError(f"scorer {spec!r} is not callable nor one of exact, contains, judge; "
                      "pass a function (result, example) -> float")


async def score(scorer: Callable, result: str | None, example: Any) -> float:
    value = scorer(result, example)
    if inspect.isawaitable(value):
        value = await value
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"the scorer returned {value!r}; it must return a number") from None
    if math.isnan(value):
        raise ConfigError("the scorer returned NaN; it must return a number")
    return value


# -- probe sets and evaluation ------------------------------------------------------------------
@dataclass
class Probe:
    """Examples drawn by a seeded shuffle (not the first rows), and the scorer that grades them."""
    examples: list
    scorer: Callable
    seed: int = 0
    indices: list[int] = field(default_factory=list)   # positions in the examples given

    def __len__(self) -> int:
        return len(self.examples)


def probe_set(examples: Iterable[Any], scorer: Any, n: int | None = None, seed: int = 0) -> Probe:
    """Shuffle `examples` with `seed` and keep the first `n` (all when None)."""
    examples = list(examples)
    if not examples:
        raise ConfigError("the probe set is empty; give at least one example")
    if n is not None and int(n) < 1:
        raise ConfigError("a probe set needs n >= 1 examples")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    order = order[: int(n)] if n is not None else order
    return Probe([examples[i] for i in order], get_scorer(scorer), seed, order)


@dataclass
class Evaluation:
    """Score S (mean over the probe set) and cost C (mean list-price USD per example)."""
    score: float
    cost_usd: float
    tokens_in: float
    tokens_out: float
    failures: int
    node_cost: dict[str, float]        # node -> mean USD per example
    batch: BatchRun
    unpriced: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"score": self.score, "cost_usd": self.cost_usd, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "failures": self.failures}


async def evaluate(flow: "Flow", workflow: Workflow, probe: Probe, *,
                   concurrency: int | None = 4, limit: asyncio.Semaphore | None = None) -> Evaluation:
    """Run `workflow` on every probe example and average score and cost."""
    batch = await amap(flow, probe.examples, concurrency=concurrency, scorer=probe.scorer,
                       workflow=workflow, limit=limit)
    n = len(batch)
    node_cost: dict[str, float] = {}
    unpriced: list[str] = []
    for item in batch:
        for node_id, slot in item.nodes.items():
            node_cost[node_id] = node_cost.get(node_id, 0.0) + slot["cost_usd"] / n
        unpriced += [m for m in item.unpriced if m not in unpriced]
    return Evaluation(score=sum(i.score or 0.0 for i in batch) / n,
                      cost_usd=batch.cost_usd / n,
                      tokens_in=sum(i.tokens_in for i in batch) / n,
                      tokens_out=sum(i.tokens_out for i in batch) / n,
                      failures=sum(i.state != RunState.DONE for i in batch),
                      node_cost=node_cost, batch=batch, unpriced=unpriced)


# -- a map's answer as a table ----------------------------------------------------------------
NOT_RUN = "not run: the map's budget was reached"


def result_frame(rows: list, fields: list[str], items: list[dict | None],
                 nodes: list[str] | None = None):
    """A map's answer: one row per input (its fields, or `input`), in order, with its
    item's result, state, tokens, cost, time, error, run and one column per node (`nodes`,
    else every node any item ran)."""
    import pandas as pd

    node_ids: list[str] = list(nodes or [])
    if nodes is None:
        for item in items:
            node_ids += [n for n in (item or {}).get("outputs", {}) if n not in node_ids]
    table = []
    for example, item in zip(rows, items):
        item = item or {"state": RunState.SKIPPED, "error": NOT_RUN}
        row = dict(example) if fields else {"input": example}
        row.update(result=item.get("result"), status=item["state"],
                   tokens_in=item.get("tokens_in", 0), tokens_out=item.get("tokens_out", 0),
                   cost_usd=item.get("cost_usd", 0.0), time_s=item.get("duration_s", 0.0),
                   error=item.get("error"), run_id=item.get("run_id"),
                   resumed=bool(item.get("resumed")))
        row.update({f"node:{n}": (item.get("outputs") or {}).get(n) for n in node_ids})
        table.append(row)
    return pd.DataFrame(table)
