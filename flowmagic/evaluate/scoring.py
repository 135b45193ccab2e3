"""Score a planned workflow against a gold task graph.

`compare(pred, gold)` matches nodes one to one by label similarity (an optimal
assignment), then reports node / edge / tool precision-recall-F1, node-label
similarity, SSI, graph edit distance, path-length similarity and complexity.
`load_gold`, `evaluate_records`, `evaluate_predictions`, `summarize`,
`format_table` and `write_results` run a whole benchmark file. The label similarity
backends live in `similarity` and are re-exported here.

Conventions shared by every metric: an empty side scores 0 unless both sides are
empty, in which case it scores 1 (nothing was asked and nothing was given).
"""

from __future__ import annotations

import asyncio
import csv
import inspect
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

import networkx as nx

from ..errors import ConfigError, FlowError, PlanError
from .._internal.aio import gather_all, run_blocking
from ..llm.similarity import as_similarity, get_similarity
from ..model.similarity import (SIMILARITIES, EmbeddingSimilarity, Matrix, TfidfSimilarity,
                                similarity_matrix)
from ..model.status import Status

__all__ = [
    "Scores", "compare", "get_similarity", "TfidfSimilarity", "EmbeddingSimilarity",
    "SIMILARITIES", "SHAPES", "METRICS", "load_gold", "load_predictions", "evaluate_records",
    "aevaluate_records", "evaluate_predictions", "summarize", "format_table", "write_results",
]

SHAPES = ("sequential", "parallel", "dag")
_EMPTY = {"nodes": [], "edges": []}


@dataclass(frozen=True)
class Scores:
    """Every plan-vs-gold metric for one pair of graphs (tool_* are None without tools)."""

    node_precision: float
    node_recall: float
    node_f1: float
    edge_precision: float
    edge_recall: float
    edge_f1: float
    label_similarity: float
    ssi: float
    ged: float
    ged_exact: bool
    path_length_similarity: float
    pred_complexity: int
    gold_complexity: int
    tool_precision: float | None = None
    tool_recall: float | None = None
    tool_f1: float | None = None
    # (pred id, gold id, similarity), sorted by gold id: which nodes were matched.
    matches: tuple[tuple[str, str, float], ...] = ()
    # Neither graph has an edge: edge P/R/F1 and S_PL are 1.0 by convention (nothing to
    # get wrong), so SSI is at least 0.5 whatever the labels; read them with this flag.
    edges_vacuous: bool = False

    def as_dict(self) -> dict:
        d = asdict(self)
        d["matches"] = [list(m) for m in self.matches]
        return d


# Scalar metrics that summarize() averages (ged_exact becomes a fraction).
METRICS = tuple(f.name for f in fields(Scores) if f.name not in ("matches", "edges_vacuous"))


# ---------------------------------------------------------------- graphs


class _Graph(NamedTuple):
    ids: list[str]
    labels: list[str]
    tools: list[tuple[str, ...]]     # per node: the tools it declares or really called
    edges: set[tuple[int, int]]  # by index into ids

    def digraph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(range(len(self.ids)))
        g.add_edges_from(sorted(self.edges))
        return g


def _node_tools(n: Mapping) -> tuple[str, ...]:
    """The tools a node declares ("tool" or "tools") and those it really called: the calls
    (without error) of the attempt whose output stands, the last passed one. A node that
    called a tool twice used it once."""
    declared = n.get("tools") if isinstance(n.get("tools"), list) else [n.get("tool")]
    names = {str(t).strip() for t in declared if isinstance(t, str) and t.strip()}
    attempts = [a for a in n.get("attempts") or [] if isinstance(a, Mapping)]
    standing = next((a for a in reversed(attempts) if a.get("passed")), attempts[-1] if attempts else {})
    names |= {str(c["tool"]) for c in standing.get("tool_calls") or []
              if isinstance(c, Mapping) and c.get("tool") and not c.get("error")}
    return tuple(sorted(names))


def _as_graph(obj, side: str) -> _Graph:
    """Nodes sorted by (label, id), so scores never depend on input order."""
    if hasattr(obj, "workflow") and hasattr(obj.workflow, "to_dict"):
        obj = obj.workflow  # a Flow
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        obj = obj.to_dict()  # a Workflow
    if not isinstance(obj, Mapping) or not isinstance(obj.get("nodes"), list):
        raise PlanError(f"the {side} graph must be a dict with a 'nodes' list and an 'edges' list")
    nodes = {}
    for n in obj["nodes"]:
        if not isinstance(n, Mapping) or "id" not in n:
            raise PlanError(f"every {side} node needs an 'id' and a 'label' (or 'requirement')")
        if n.get("status") == Status.PRUNED:
            continue
        nid = str(n["id"])
        if nid in nodes:
            raise PlanError(f"the {side} graph has two nodes with id {nid!r}; give each node its own id")
        label = n.get("label", n.get("requirement"))
        nodes[nid] = (str(label or ""), _node_tools(n))
    ids = sorted(nodes, key=lambda i: (nodes[i][0], i))
    index = {nid: k for k, nid in enumerate(ids)}
    edges = set()
    for e in obj.get("edges") or []:
        if not isinstance(e, (list, tuple)) or len(e) != 2:
            raise PlanError(f"every {side} edge must be a pair [from, to], got {e!r}")
        a, b = str(e[0]), str(e[1])
        if a in index and b in index and a != b:  # edges to pruned nodes drop out
            edges.add((index[a], index[b]))
    return _Graph(ids, [nodes[i][0] for i in ids], [nodes[i][1] for i in ids], edges)


# ---------------------------------------------------------------- metrics


def _prf(tp: float, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    if n_pred == 0 and n_gold == 0:
        return 1.0, 1.0, 1.0
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _match(sim: Matrix, threshold: float, p: _Graph, g: _Graph) -> dict[int, int]:
    """Optimal one-to-one assignment (pred index -> gold index) over pairs >= threshold.

    Sub-threshold entries are zeroed first, so the assignment maximises the total
    similarity of pairs that will count rather than spending a node on one that won't.
    Ties between equal labels are broken by alike in/out degree, then equal ids, so
    a graph with repeated labels still matches itself node for node.
    """
    if not sim or not sim[0]:
        return {}
    deg = [[(sum(a == i for a, _ in x.edges), sum(b == i for _, b in x.edges)) for i in range(len(x.ids))]
           for x in (p, g)]  # (out, in) per node

    def tie(i: int, j: int) -> float:
        (po, pi), (go, gi) = deg[0][i], deg[1][j]
        return 1e-6 / (1 + abs(po - go) + abs(pi - gi)) + 1e-9 * (p.ids[i] == g.ids[j])

    weights = [[s + tie(i, j) if s >= threshold else 0.0 for j, s in enumerate(row)]
               for i, row in enumerate(sim)]
    # the maximum-weight matching of the bipartite graph pred x gold is the optimal
    # assignment; zero entries are left out, as they would never count
    bipartite = nx.Graph()
    bipartite.add_weighted_edges_from(((("p", i), ("g", j), w) for i, row in enumerate(weights)
                                       for j, w in enumerate(row) if w > 0))
    found = dict(sorted((a[1], b[1]) if a[0] == "p" else (b[1], a[1])
                        for a, b in nx.max_weight_matching(bipartite)))
    return {i: j for i, j in found.items() if sim[i][j] >= threshold and sim[i][j] > 0}


def _tool_prf(p: _Graph, g: _Graph):
    """Tools compared as multisets of names (a tool counts once per node that uses it):
    one use of a tool per gold use."""
    pt, gt = Counter(t for ts in p.tools for t in ts), Counter(t for ts in g.tools for t in ts)
    if not pt and not gt:
        return None, None, None
    return _prf(sum((pt & gt).values()), sum(pt.values()), sum(gt.values()))


def _label_similarity(sim: Matrix, n_pred: int, n_gold: int) -> float:
    if n_gold == 0:
        return 1.0 if n_pred == 0 else 0.0
    if n_pred == 0:
        return 0.0
    return sum(max(sim[i][j] for i in range(n_pred)) for j in range(n_gold)) / n_gold


def _path_length_similarity(p: _Graph, g: _Graph, match: dict[int, int], alpha: float) -> float:
    """S_PL: mean over ordered gold pairs (u, v), u != v, v reachable from u, of
    exp(-alpha * |d_pred - d_gold|), d = shortest-path length in edges.

    A pair counts 0 when u or v is unmatched or the matched pred nodes are not
    connected in that direction. A gold graph with no reachable pair scores 1 when
    the prediction has no edge either, else 0.
    """
    gold_d = {
        (u, v): d
        for u, dists in nx.all_pairs_shortest_path_length(g.digraph())
        for v, d in dists.items()
        if u != v
    }
    if not gold_d:
        return 1.0 if not p.edges else 0.0
    back = {j: i for i, j in match.items()}
    pred_dist = dict(nx.all_pairs_shortest_path_length(p.digraph()))
    total = 0.0
    for (u, v), d in gold_d.items():
        if u in back and v in back and back[v] in pred_dist[back[u]]:
            total += math.exp(-alpha * abs(pred_dist[back[u]][back[v]] - d))
    return total / len(gold_d)


def _matching_cost(p: _Graph, g: _Graph, sim: Matrix, match: dict[int, int], edge_tp: int) -> float:
    """Cost of the edit path the matching implies: an upper bound on GED."""
    k = len(match)
    subst = sum(1.0 - sim[i][j] for i, j in match.items())
    return float(subst + len(p.ids) + len(g.ids) - 2 * k + len(p.edges) + len(g.edges) - 2 * edge_tp)


def _ged(p: _Graph, g: _Graph, sim: Matrix, bound: float, timeout: float | None) -> tuple[float, bool]:
    """Best GED found by networkx's anytime search within `timeout` seconds.

    Node substitution costs 1 - similarity, insertion and deletion 1, edges 1.
    Exact when the search finished before the deadline (or the bound is 0).
    """
    if bound == 0.0:
        return 0.0, True
    if timeout is not None and timeout <= 0:
        return bound, False
    g1, g2 = p.digraph(), g.digraph()
    nx.set_node_attributes(g1, {i: i for i in g1}, "i")
    nx.set_node_attributes(g2, {j: j for j in g2}, "j")
    best, start = bound, time.perf_counter()
    for _, _, cost in nx.optimize_edit_paths(
        g1,
        g2,
        node_subst_cost=lambda a, b: 1.0 - sim[a["i"]][b["j"]],
        node_del_cost=lambda a: 1.0,
        node_ins_cost=lambda b: 1.0,
        upper_bound=bound,  # prunes everything no better than the matching's path
        timeout=timeout,
    ):
        best = min(best, cost)
    exact = timeout is None or time.perf_counter() - start < timeout
    return round(best, 9), exact


def compare(pred, gold, *, similarity=None, threshold: float = 0.5, alpha: float = 1.0,
            ged_timeout: float | None = 2.0) -> Scores:
    """Score `pred` against `gold`: dicts {"nodes": [{"id", "label"|"requirement", "tool"?}],
    "edges": [[a, b], ...]}, or a Workflow / Flow (pruned nodes ignored).

    Nodes are matched one to one by label similarity (`similarity`: a name for
    `get_similarity` or a callable; default "auto"); pairs below `threshold` stay
    unmatched. A pred edge is correct when both ends are matched and the mapped edge
    is in gold. SSI = (label similarity + edge F1) / 2. See `_path_length_similarity`
    for S_PL and `_ged` for the edit distance. When neither graph has an edge, edge F1 and
    S_PL are 1.0 by convention and `edges_vacuous` says so (the papers leave the case
    undefined). Tools: a node's declared "tool"/"tools" and, for an executed flow, the
    tools it really called.
    """
    p, g = _as_graph(pred, "pred"), _as_graph(gold, "gold")
    sim = similarity_matrix(as_similarity(similarity), p.labels, g.labels)
    match = _match(sim, threshold, p, g)
    node = _prf(len(match), len(p.ids), len(g.ids))
    edge_tp = sum(1 for a, b in p.edges if a in match and b in match and (match[a], match[b]) in g.edges)
    edge = _prf(edge_tp, len(p.edges), len(g.edges))
    label = _label_similarity(sim, len(p.ids), len(g.ids))
    ged, exact = _ged(p, g, sim, _matching_cost(p, g, sim, match, edge_tp), ged_timeout)
    matches = sorted(((p.ids[i], g.ids[j], sim[i][j]) for i, j in match.items()), key=lambda m: m[1])
    tools = _tool_prf(p, g)
    return Scores(
        *node, *edge,
        label_similarity=label,
        ssi=(label + edge[2]) / 2,
        ged=ged,
        ged_exact=exact,
        path_length_similarity=_path_length_similarity(p, g, match, alpha),
        pred_complexity=len(p.ids) + len(p.edges),
        gold_complexity=len(g.ids) + len(g.edges),
        tool_precision=tools[0],
        tool_recall=tools[1],
        tool_f1=tools[2],
        matches=tuple(matches),
        edges_vacuous=not p.edges and not g.edges,
    )


# ---------------------------------------------------------------- benchmarks


def _read_jsonl(path, what: str) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no {what} file at {path}; pass the path of a JSONL file")
    records = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                rec = None
            if not isinstance(rec, dict) or not isinstance(rec.get("nodes"), list):
                raise PlanError(f"line {number} of {path} is not a JSON object with 'nodes' and 'edges'")
            records.append(rec)
    return records


def load_gold(path) -> list[dict]:
    """Gold records from a JSONL file ({"id", "task", "nodes", "edges", "shape", ...})."""
    return _read_jsonl(path, "gold")


def load_predictions(path) -> dict[str, dict]:
    """Predictions from a JSONL file of {"id", "nodes", "edges"}, keyed by id."""
    return {str(rec.get("id")): rec for rec in _read_jsonl(path, "prediction")}


def _row(record: dict, pred, error: str | None, seconds: float, similarity, threshold, ged_timeout) -> dict:
    """One result row: the record's id and shape, the scalar scores, and any error.

    A plan that failed or cannot be read is scored as an empty plan, so it counts
    as 0 in the means instead of silently dropping out.
    """
    kw = dict(similarity=similarity, threshold=threshold, ged_timeout=ged_timeout)
    try:
        scores = compare(_EMPTY if error else pred, record, **kw)
    except PlanError as exc:
        _as_graph(record, "gold")  # a broken gold record is the caller's bug: let it raise
        error, scores = str(exc), compare(_EMPTY, record, **kw)
    row = {"id": str(record.get("id", "")), "shape": record.get("shape") or "unknown"}
    row.update({k: v for k, v in scores.as_dict().items() if k != "matches"})
    row.update(error=error, seconds=round(seconds, 3))
    return row


async def _plan(plan_fn, record: dict, threaded: bool):
    if threaded and not inspect.iscoroutinefunction(plan_fn):
        result = await asyncio.to_thread(plan_fn, record)
    else:
        result = plan_fn(record)
    return await result if inspect.isawaitable(result) else result


async def aevaluate_records(records: Iterable[dict], plan_fn, *, similarity=None, threshold: float = 0.5,
                            ged_timeout: float | None = 2.0, concurrency: int = 1,
                            progress: Callable | None = None) -> list[dict]:
    """Plan every record with `plan_fn(record)` (sync or async) and score it; rows in record order.

    Up to `concurrency` plans run at once (sync planners in threads). A planner that
    raises a FlowError gives a row with `error` set; anything else propagates.
    `progress(done, total, row)` is called after each record.
    """
    records, sim = list(records), as_similarity(similarity)
    gate, rows, done = asyncio.Semaphore(max(1, concurrency)), [None] * len(records), 0

    async def one(i: int, record: dict) -> None:
        nonlocal done
        async with gate:
            start, pred, error = time.perf_counter(), None, None
            try:
                pred = await _plan(plan_fn, record, concurrency > 1)
            except FlowError as exc:
                error = str(exc)
            seconds = time.perf_counter() - start
        rows[i] = _row(record, pred, error, seconds, sim, threshold, ged_timeout)
        done += 1
        if progress:
            progress(done, len(records), rows[i])

    # on a bug in one planner call, the others are cancelled
    await gather_all(one(i, r) for i, r in enumerate(records))
    return rows


def evaluate_records(records: Iterable[dict], plan_fn, **options) -> list[dict]:
    """`aevaluate_records` to its end, for scripts, the CLI and a notebook cell."""
    return run_blocking(lambda: aevaluate_records(records, plan_fn, **options),
                        name="flowmagic-evaluate")


def evaluate_predictions(records: Iterable[dict], preds, *, similarity=None, threshold: float = 0.5,
                         ged_timeout: float | None = 2.0, progress: Callable | None = None) -> list[dict]:
    """Score saved predictions: `preds` maps record id -> pred, or is a list of {"id", ...}."""
    if not isinstance(preds, Mapping):
        preds = {str(p.get("id")): p for p in preds}
    records, sim = list(records), as_similarity(similarity)
    rows = []
    for record in records:
        pred = preds.get(str(record.get("id")))
        error = None if pred is not None else "no prediction for this id"
        rows.append(_row(record, pred, error, 0.0, sim, threshold, ged_timeout))
        if progress:
            progress(len(rows), len(records), rows[-1])
    return rows


def _means(rows: list[dict]) -> dict:
    out = {"n": len(rows), "errors": sum(1 for r in rows if r.get("error"))}
    for key in (*METRICS, "seconds"):
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def summarize(rows: list[dict]) -> dict:
    """Means over all rows and per gold shape: {"overall": {...}, "by_shape": {shape: {...}}}.

    Each block has n, errors and the mean of every metric (ged_exact as a fraction;
    tool metrics over the rows that have tools, None when no row has).
    """
    shapes = [s for s in SHAPES if any(r["shape"] == s for r in rows)]
    shapes += sorted({r["shape"] for r in rows} - set(SHAPES))
    return {"overall": _means(rows), "by_shape": {s: _means([r for r in rows if r["shape"] == s]) for s in shapes}}


_COLUMNS = (("node F1", "node_f1"), ("edge F1", "edge_f1"), ("label", "label_similarity"),
            ("SSI", "ssi"), ("GED", "ged"), ("S_PL", "path_length_similarity"), ("tool F1", "tool_f1"))


def _cells(name: str, extra: str, values: dict) -> list[str]:
    nums = ["-" if values.get(k) is None else f"{values[k]:.3f}" for _, k in _COLUMNS]
    return [name, extra, *nums]


def format_table(rows: list[dict], summary: dict) -> str:
    """A plain-text table: one line per row, then the means by shape and overall."""
    head = ["id", "shape", *(c for c, _ in _COLUMNS)]
    body = [_cells(r["id"][:36], r["shape"] + (" !" if r.get("error") else ""), r) for r in rows]
    means = [_cells(f"mean {s}", f"n={v['n']}", v) for s, v in summary["by_shape"].items()]
    means.append(_cells("mean overall", f"n={summary['overall']['n']}", summary["overall"]))
    widths = [max(len(line[k]) for line in [head, *body, *means]) for k in range(len(head))]

    def fmt(line):
        return "  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(line, widths))).rstrip()

    rule = "-" * len(fmt(head))
    lines = [fmt(head), rule, *map(fmt, body)] + ([rule] if body else []) + list(map(fmt, means))
    errors = summary["overall"]["errors"]
    if errors:
        lines.append(f"{errors} of {summary['overall']['n']} plans failed (marked !) and scored as empty plans")
    return "\n".join(lines)


def write_results(rows: list[dict], summary: dict, path) -> Path:
    """Write rows as CSV (.csv, one line per record) or rows and summary as JSON (.json)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    elif suffix == ".csv":
        columns = list(dict.fromkeys(k for r in rows for k in r)) or ["id", "shape", *METRICS]
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    else:
        raise ConfigError(f"cannot write results to {path.name}: use a .csv or .json file")
    return path

