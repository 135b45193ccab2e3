"""Run the planner over a file of gold task graphs and score every plan.

`evaluate_file(path, k=1, strategy="fine")` (or `await aevaluate_file(...)` in a
notebook) plans each record's task with `planner.plan_candidates` + `select`, scores
the chosen plan with `evaluate.compare`, and returns an `EvalRun`: rows, summary by
gold shape, the predictions (save them and re-score later with `pred=`, no model
call), the settings, and which similarity backend was used and why.

Similarity "auto" asks the planning endpoint's /embeddings once and remembers a
refusal per endpoint (`LLM.embed`); without it, MiniLM when the package is installed,
else TF-IDF. Scoring saved predictions never calls a model unless told to
(`similarity="embeddings"`). `compare_flow` scores one notebook flow against a gold
graph (`%flow eval NAME GOLD.json`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from . import scoring as ev
from ..errors import ConfigError, EndpointError, FlowError

__all__ = ["EvalRun", "EvalSettings", "aresolve_similarity", "resolve_similarity", "select_records",
           "prediction_of", "aevaluate_file", "evaluate_file", "load_one_gold", "compare_flow",
           "format_scores"]

Say = Callable[[str], None]


# ------------------------------------------------------------------------------ similarity
class _EndpointEmbedder:
    """`texts -> vectors` from an endpoint; `prefetch` fills it from async code so that
    scoring inside the event loop does not block on HTTP."""

    def __init__(self, llm, model: str | None):
        self.llm, self.model, self.vectors = llm, model, {}

    async def prefetch(self, texts) -> None:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, await self.llm.embed(new, model=self.model)))

    def __call__(self, texts: list[str]) -> list[list[float]]:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, self.llm.embed_sync(new, model=self.model)))
        return [self.vectors[t] for t in texts]


def _embedder_of(backend) -> _EndpointEmbedder | None:
    embed = getattr(backend, "embed", None)
    return embed if isinstance(embed, _EndpointEmbedder) else None


def _offline(name: str, why: str | None) -> tuple[Any, str]:
    backend = ev.get_similarity("auto" if name == "auto" else name)
    return backend, f"similarity: {backend.name}" + (f" ({why})" if why else "")


def _embedding_model(model: str | None, embed_model: str | None) -> str | None:
    """The model asked for vectors (see `flowmagic.llm.endpoints.embedding_model`)."""
    from ..llm.endpoints import embedding_model
    return embedding_model(model, embed_model)


async def aresolve_similarity(name: str = "auto", *, model: str | None = None, llm=None,
                              calls: bool = True, embed_model: str | None = None) -> tuple[Any, str]:
    """(similarity backend, one line saying which and why) for `evaluate.compare`.

    "embeddings" uses the endpoint of `model` (asking it for `embed_model`, see
    `_embedding_model`) and fails if it cannot embed; "auto" tries it once when `calls`
    is true and falls back to MiniLM / TF-IDF, saying so.
    """
    if name not in ev.SIMILARITIES:
        raise ConfigError(f"unknown similarity {name!r}; choose one of {', '.join(ev.SIMILARITIES)}")
    if name in ("tfidf", "minilm") or (name == "auto" and not calls):
        return _offline(name, None if name != "auto" else "no model calls when scoring saved plans")
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    model = _embedding_model(model, embed_model)
    embedder = _EndpointEmbedder(llm, model)
    try:
        await embedder.prefetch(["flowmagic"])   # the probe; cached once it worked
    except EndpointError as exc:   # EmbeddingsUnsupportedError included
        if name == "embeddings":
            raise
        return _offline("auto", f"no endpoint embeddings: {_brief(exc)}")
    endpoint = _endpoint_name(model)
    return ev.EmbeddingSimilarity(embedder, name="embeddings"), f"similarity: embeddings from {endpoint}"


def resolve_similarity(name: str = "auto", **options) -> tuple[Any, str]:
    """`aresolve_similarity` for sync callers (a worker thread when a loop is running)."""
    return _blocking(lambda: aresolve_similarity(name, **options), close=options.get("llm"))


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 140 else text[:139] + "…"


def _endpoint_name(model: str | None) -> str:
    from ..llm.endpoints import resolve

    endpoint, name = resolve(model)
    where = "the embedded model" if endpoint.local else endpoint.base_url
    return f"{where} ({name})" if name else where


def _blocking(make, close=None):
    """Run the coroutine `make()` to the end from sync code, closing HTTP clients after."""
    from ..llm.client import run_closing
    return run_closing(make, close, name="flowmagic-eval")


# ------------------------------------------------------------------------------ records
def select_records(records: list[dict], *, limit: int | None = None,
                   sample: int | None = None) -> list[dict]:
    """Records to run, each with an id (`line-N` when it had none).

    `sample` takes N records in turn from each gold shape (file order within a shape), so
    a small slice still covers sequential, parallel and dag graphs; `limit` keeps the first N.
    """
    for name, value in (("limit", limit), ("sample", sample)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a whole number of at least 1, not {value!r}")
    out = [{**r, "id": str(r.get("id") or f"line-{i + 1}")} for i, r in enumerate(records)]
    if sample is not None:
        groups: dict[str, list[dict]] = {}
        for r in out:
            groups.setdefault(r.get("shape") or "unknown", []).append(r)
        turns = [r for batch in zip_longest(*groups.values()) for r in batch if r is not None]
        chosen = {id(r) for r in turns[:sample]}
        out = [r for r in out if id(r) in chosen]
    return out[:limit] if limit is not None else out


def prediction_of(workflow, record_id: str, **extra) -> dict:
    """A compact, re-scorable prediction: {"id", "nodes": [{"id", "label", "agent"}], "edges"}."""
    active = workflow.active()
    nodes = [{"id": n.id, "label": n.requirement, "agent": n.agent}
             for n in workflow.nodes.values() if n.id in active]
    return {"id": record_id, "nodes": nodes, "edges": [[a, b] for a, b in workflow.edges()
                                                        if a in active and b in active], **extra}


def _labels(graph: dict) -> list[str]:
    return [str(n.get("label", n.get("requirement")) or "") for n in graph.get("nodes") or []
            if isinstance(n, dict)]


# ------------------------------------------------------------------------------ the result
_MEANS = (("node F1", "node_f1"), ("edge F1", "edge_f1"), ("label", "label_similarity"),
          ("SSI", "ssi"), ("GED", "ged"))


class EvalSettings(BaseModel):
    """What an evaluation ran with: the gold file and its selection, the scoring, and either
    the predictions file it scored or how it planned each record (k ... cache) and the usage.
    `to_dict()` has only the keys that were set, in this order (the --out JSON's "settings")."""

    gold: str
    records: int
    available: int
    limit: int | None = None
    sample: int | None = None
    similarity: str = ""
    threshold: int | float = 0.5
    ged_timeout: int | float | None = 2.0
    pred: str | None = None
    k: int = 3
    model: str | None = None
    strategy: str = "balanced"
    context: bool = False
    seed: int = 0
    max_tokens: int | None = None
    cache: bool = True
    usage: dict | None = None

    def to_dict(self) -> dict:
        return self.model_dump(exclude_unset=True)


@dataclass
class EvalRun:
    """What one evaluation produced; `table()` and `summary_text()` are what the CLI prints."""

    rows: list[dict]
    summary: dict
    settings: EvalSettings
    predictions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        return ev.format_table(self.rows, self.summary)

    def summary_text(self) -> str:
        s = self.settings
        lines = [f"gold: {s.gold} ({s.records} of {s.available} records)"]
        if s.pred:
            lines.append(f"predictions: {s.pred} (no planning)")
        else:
            lines.append(f"planner: {s.model or 'the default model'}, strategy {s.strategy}, "
                         f"k {s.k}" + (", with the records' context" if s.context else ""))
        lines += self.notes
        blocks = [("overall", self.summary["overall"]), *self.summary["by_shape"].items()]
        for name, block in blocks:
            means = ", ".join("-" if block[key] is None else f"{label} {block[key]:.3f}"
                              for label, key in _MEANS)
            failed = f", {block['errors']} failed" if block["errors"] else ""
            lines.append(f"mean {name} (n={block['n']}{failed}): {means}")
        usage = s.usage
        if usage:
            lines.append(f"model calls: {usage['calls']} (+{usage['cached']} from the cache), "
                         f"tokens {usage['input_tokens']:,} in, {usage['output_tokens']:,} out, "
                         f"${usage['cost_usd']:.4f}; {self.seconds:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"settings": self.settings.to_dict(), "notes": self.notes, "summary": self.summary,
                "rows": self.rows}

    def write(self, path) -> Path:
        """Rows as CSV (.csv), or settings, notes, summary and rows as JSON (.json)."""
        path = Path(path)
        if path.suffix.lower() != ".json":
            return ev.write_results(self.rows, self.summary, path)
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n",
                        encoding="utf-8")
        return path

    def save_predictions(self, path) -> Path:
        """The plans as JSONL, for `flowmagic eval GOLD --pred FILE` (failed plans keep their error)."""
        path = Path(path)
        path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in self.predictions),
                        encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return f"{self.table()}\n\n{self.summary_text()}"

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..view.safe import preformatted   # plan labels are model text

        text = repr(self)
        return {"text/plain": text, "text/html": preformatted(text)}, {}


# ------------------------------------------------------------------------------ running
class _Planner:
    """plan_fn for `aevaluate_records`: K candidates, Flow's selection, usage kept per record."""

    def __init__(self, llm, options: EvalSettings, embedder: _EndpointEmbedder | None):
        self.llm, self.options, self.embedder = llm, options, embedder
        self.predictions: dict[str, dict] = {}
        self.usage = {"calls": 0, "cached": 0, "input_tokens": 0, "output_tokens": 0,
                      "cost_usd": 0.0}

    async def __call__(self, record: dict) -> dict:
        from ..engine import planner

        o = self.options
        context = record.get("context") if o.context else None
        rid, base = record["id"], {"model": o.model, "strategy": o.strategy, "k": o.k}
        try:
            candidates = await planner.plan_candidates(
                record.get("task") or "", llm=self.llm, context=context, k=o.k, model=o.model,
                strategy=o.strategy, seed=o.seed, max_tokens=o.max_tokens, cache=o.cache)
            self._count(candidates)
            chosen = planner.select(candidates)
        except FlowError as exc:
            self.predictions[rid] = {"id": rid, "nodes": [], "edges": [], **base, "error": str(exc)}
            raise
        cand = candidates[chosen]
        base["model"] = cand.model or base["model"]   # the resolved "endpoint:model"
        pred = prediction_of(cand.workflow, rid, **base, candidate=chosen, warnings=cand.warnings)
        if "critical_path_s" in cand.scores:
            pred["critical_path_s"] = cand.scores["critical_path_s"]
        self.predictions[rid] = pred
        if self.embedder is not None:
            await self.embedder.prefetch(_labels(pred) + _labels(record))
        return pred

    def _count(self, candidates) -> None:
        for c in candidates:
            self.usage["calls" if not c.cached else "cached"] += 1
            self.usage["input_tokens"] += c.tokens_in
            self.usage["output_tokens"] += c.tokens_out
            self.usage["cost_usd"] += c.cost_usd


def _progress_line(say: Say | None):
    if say is None:
        return None

    def line(done: int, total: int, row: dict) -> None:
        if row.get("error"):
            what = f"failed: {_brief(row['error'])}"
        else:
            what = (f"node F1 {row['node_f1']:.2f}, edge F1 {row['edge_f1']:.2f}, "
                    f"SSI {row['ssi']:.2f}, GED {row['ged']:.1f}")
        say(f"{done}/{total} {row['id']} ({row['shape']}): {what} [{row['seconds']:.1f} s]")
    return line


async def _score_saved(records, pred_path, backend, options, say) -> tuple[list[dict], list[dict]]:
    preds = ev.load_predictions(pred_path)
    embed = _embedder_of(backend)
    if embed is not None:
        await embed.prefetch([t for r in records for t in _labels(r) + _labels(preds.get(r["id"], {}))])
    line = _progress_line(say)

    def keep_failures(done: int, total: int, row: dict) -> None:
        error = (preds.get(row["id"]) or {}).get("error")
        if error and not row["error"]:   # a plan that failed when it was made stays a failure
            row["error"] = error
        if line:
            line(done, total, row)

    rows = ev.evaluate_predictions(records, preds, similarity=backend, progress=keep_failures,
                                   **options)
    return rows, [preds[r["id"]] for r in records if r["id"] in preds]


async def aevaluate_file(gold, *, k: int = 3, model: str | None = None,
                         strategy: str = "balanced", similarity: str = "auto",
                         limit: int | None = None, sample: int | None = None,
                         concurrency: int = 1, context: bool = False, pred=None,
                         max_tokens: int | None = None, seed: int = 0, cache: bool = True,
                         threshold: float = 0.5, ged_timeout: float | None = 2.0,
                         embed_model: str | None = None, llm=None,
                         progress: Say | None = None) -> EvalRun:
    """Plan and score every selected record of the JSONL file `gold` (or score `pred`).

    `progress(line)` gets one line per record. Plans that fail are rows with `error`.
    """
    started = time.perf_counter()
    if pred is None:
        _check_planning(k, strategy, concurrency)
    records = ev.load_gold(gold)
    chosen = select_records(records, limit=limit, sample=sample)
    if llm is None:
        from ..llm.client import get_llm
        llm = get_llm()
    backend, note = await aresolve_similarity(similarity, model=model, llm=llm, calls=pred is None,
                                              embed_model=embed_model)
    if progress:
        progress(note)
    scoring = dict(threshold=threshold, ged_timeout=ged_timeout)
    settings = EvalSettings(gold=str(gold), records=len(chosen), available=len(records),
                            limit=limit, sample=sample, similarity=backend.name, **scoring)
    if pred is not None:
        if limit is None and sample is None:   # score what was planned, e.g. an earlier --sample
            saved = ev.load_predictions(pred)
            chosen = [r for r in chosen if r["id"] in saved] or chosen
            settings.records = len(chosen)
        rows, predictions = await _score_saved(chosen, pred, backend, scoring, progress)
        settings.pred = str(pred)
    else:
        settings = settings.model_copy(update=dict(k=k, model=model, strategy=strategy,
                                                   context=context, seed=seed,
                                                   max_tokens=max_tokens, cache=cache))
        planner = _Planner(llm, settings, _embedder_of(backend))
        rows = await ev.aevaluate_records(chosen, planner, similarity=backend, concurrency=concurrency,
                                          progress=_progress_line(progress), **scoring)
        predictions = [planner.predictions[r["id"]] for r in chosen if r["id"] in planner.predictions]
        settings.usage = planner.usage
    return EvalRun(rows, ev.summarize(rows), settings, predictions, [note],
                   time.perf_counter() - started)


def _check_planning(k, strategy: str, concurrency) -> None:
    """Mistakes that would otherwise fail every record one by one."""
    from ..engine.planner import STRATEGIES

    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown planning strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    for name, value in (("k", k), ("concurrency", concurrency)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a whole number of at least 1, not {value!r}")


def evaluate_file(gold, **options) -> EvalRun:
    """`aevaluate_file` for scripts and the CLI (a worker thread inside a running loop)."""
    return _blocking(lambda: aevaluate_file(gold, **options), close=options.get("llm"))


# ------------------------------------------------------------------------------ one flow
def _same_task(a: str, b: str) -> bool:
    return " ".join(str(a).casefold().split()) == " ".join(str(b).casefold().split())


def load_one_gold(path, task: str | None = None) -> dict:
    """One gold graph from `path`: a JSON object, or the record of a JSON list / JSONL file
    whose task is `task` (the only record when there is one)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no gold file at {path}; give a .json graph or a .jsonl of records")
    if path.suffix.lower() == ".jsonl":
        records = ev.load_gold(path)
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not JSON ({exc}); give a gold graph "
                              '{"nodes": [{"id", "label"}], "edges": [[a, b]]}') from None
        records = data if isinstance(data, list) else [data]
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("nodes"), list)]
    if len(records) == 1:
        return records[0]
    found = [r for r in records if task is not None and _same_task(r.get("task", ""), task)]
    if not found:
        raise ConfigError(f"{path} has {len(records)} gold graphs and none has this flow's task; "
                          "give a file with one graph, or one whose record has the same task")
    return found[0]


def compare_flow(flow, gold, *, similarity: str = "auto", **options) -> tuple[Any, dict, str]:
    """(Scores, gold record, similarity note) of a Flow's plan against `gold` (a path or dict)."""
    record = gold if isinstance(gold, dict) else load_one_gold(gold, task=flow.task)
    model = getattr(getattr(flow, "settings", None), "model", None)
    backend, note = resolve_similarity(similarity, model=model, llm=getattr(flow, "llm", None))
    return ev.compare(flow, record, similarity=backend, **options), record, note


def format_scores(scores, record: dict, pred_labels: dict[str, str] | None = None) -> str:
    """A few lines: every metric, then which plan node matched which gold node."""
    d = scores.as_dict()
    head = ", ".join(f"{label} {d[key]:.3f}" for label, key in _MEANS)
    lines = [f"gold {record.get('id') or ''} ({record.get('shape') or 'unknown'}): {head}".replace("  ", " "),
             f"nodes P/R {d['node_precision']:.3f}/{d['node_recall']:.3f}, edges P/R "
             f"{d['edge_precision']:.3f}/{d['edge_recall']:.3f}, S_PL {d['path_length_similarity']:.3f}"
             f", complexity {d['pred_complexity']} vs gold {d['gold_complexity']}"]
    gold_labels = {str(n["id"]): n.get("label", "") for n in record["nodes"]}
    for pid, gid, sim in scores.matches:
        mine = (pred_labels or {}).get(pid, pid)
        lines.append(f"  {pid} ~ gold {gid} ({sim:.2f}): {mine[:50]!r} ~ {gold_labels.get(gid, '')[:50]!r}")
    return "\n".join(lines)
