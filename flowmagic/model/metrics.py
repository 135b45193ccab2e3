"""Shape metrics of a workflow: how parallel, how tangled, how long, how fragile.

Every function takes a `Workflow` (its pruned nodes are ignored) or an `nx.DiGraph` of
active nodes, and returns plain numbers or lists, so results go straight into JSON.
An empty graph gives zeros, never an exception.

Parallelism follows Flow's definition with longest-path levels (networkx
`topological_generations`) and the mean of |S_t| / |V|; Flow's own breadth-first count,
which visits a node once per parent, is what this module deliberately does not do.
Note that the mean of |S_t| / |V| over T levels is exactly 1 / T: it ranks plans by depth,
so a one-node plan or a plan with no dependencies scores 1.0. `speedup` (|V| / T, the mean
level width, which is the critical-path speed-up when every subtask takes as long) rewards
width instead; `shape` gathers what plan selection needs (see planner.select).
"""

from __future__ import annotations

import math
from typing import Union

import networkx as nx

from ..errors import ConfigError
from .graph import Workflow

__all__ = [
    "levels", "parallelism", "dependency_complexity", "depth", "width", "num_nodes",
    "num_edges", "complexity", "critical_path", "success_probabilities",
    "expected_successes", "speedup", "sinks", "is_connected", "shape", "summary",
]

Graphish = Union[Workflow, nx.DiGraph]


def _graph(g: Graphish) -> nx.DiGraph:
    if isinstance(g, Workflow):
        return g.active()
    if isinstance(g, nx.DiGraph):
        return g
    raise TypeError(f"metrics take a Workflow or an nx.DiGraph, not {type(g).__name__}")  # a bug


def _ordered(graph: nx.DiGraph, ids) -> list[str]:
    pos = {n: i for i, n in enumerate(graph)}
    return sorted(ids, key=pos.__getitem__)


def levels(g: Graphish) -> list[list[str]]:
    """Longest-path levels S_1..S_T: a node sits one level below its deepest parent."""
    graph = _graph(g)
    return [_ordered(graph, gen) for gen in nx.topological_generations(graph)]


def parallelism(g: Graphish) -> float:
    """P_avg = mean over levels t of |S_t| / |V| (0.0 for an empty graph)."""
    lv = levels(g)
    n = sum(len(s) for s in lv)
    if not n:
        return 0.0
    return sum(len(s) / n for s in lv) / len(lv)


def speedup(g: Graphish) -> float:
    """|V| / T: subtasks per level, the speed-up over running them one by one when each takes
    as long (0.0 for an empty graph). Unlike P_avg it grows with width, not only shallowness."""
    lv = levels(g)
    return sum(len(s) for s in lv) / len(lv) if lv else 0.0


def sinks(g: Graphish) -> list[str]:
    """Subtasks no other subtask depends on, in plan order (the plan's deliverables)."""
    graph = _graph(g)
    return [n for n in graph if graph.out_degree(n) == 0]


def is_connected(g: Graphish) -> bool:
    """True when every subtask is linked to every other by some chain of dependencies
    (ignoring direction); False for an empty graph and for unlinked pieces."""
    graph = _graph(g)
    return graph.number_of_nodes() > 0 and nx.is_weakly_connected(graph)


def dependency_complexity(g: Graphish) -> float:
    """Population standard deviation of total degree (in + out) over the nodes."""
    graph = _graph(g)
    degrees = [d for _, d in graph.degree()]
    if not degrees:
        return 0.0
    mean = sum(degrees) / len(degrees)
    return math.sqrt(sum((d - mean) ** 2 for d in degrees) / len(degrees))


def depth(g: Graphish) -> int:
    """Number of levels: the node count of the longest path."""
    return len(levels(g))


def width(g: Graphish) -> int:
    """Size of the largest level: the most subtasks that can ever run at once by level."""
    return max((len(s) for s in levels(g)), default=0)


def num_nodes(g: Graphish) -> int:
    return _graph(g).number_of_nodes()


def num_edges(g: Graphish) -> int:
    return _graph(g).number_of_edges()


def complexity(g: Graphish) -> int:
    """|V| + |E|, the size measure used to compare decompositions."""
    graph = _graph(g)
    return graph.number_of_nodes() + graph.number_of_edges()


def _weights(g: Graphish, graph: nx.DiGraph, weight: str) -> dict[str, float]:
    if weight == "count":
        return {n: 1.0 for n in graph}
    if weight != "duration":
        raise ConfigError(f"critical_path weight must be 'count' or 'duration', not {weight!r}")
    out = {}
    for n in graph:
        if isinstance(g, Workflow):
            node = g.nodes[n]
            value = node.duration if node.duration is not None else node.estimate_s
        else:
            attrs = graph.nodes[n]
            value = attrs.get("duration", attrs.get("estimate_s"))
        # A clock that went backwards must not shorten a path below zero.
        out[n] = 1.0 if value is None else max(0.0, float(value))
    return out


def critical_path(g: Graphish, weight: str = "count") -> tuple[list[str], float]:
    """The heaviest path and its total weight.

    weight="count": every node weighs 1, so the total is the node count.
    weight="duration": Node.duration when measured, else Node.estimate_s, else 1.0
    (for a bare DiGraph, the node attributes "duration" / "estimate_s").
    Ties go to the node earlier in plan order, so the answer is deterministic.
    """
    graph = _graph(g)
    w = _weights(g, graph, weight)
    pos = {n: i for i, n in enumerate(graph)}
    best: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for n in nx.lexicographical_topological_sort(graph, key=pos.__getitem__):
        parents = sorted(graph.predecessors(n), key=pos.__getitem__)
        # max() keeps the first of equal parents, i.e. the earliest in plan order.
        parent = max(parents, key=lambda p: best[p], default=None)
        best[n] = w[n] + (best[parent] if parent is not None else 0.0)
        via[n] = parent
    if not best:
        return [], 0.0
    end = max(sorted(best, key=pos.__getitem__), key=lambda n: best[n])
    path = [end]
    while via[path[-1]] is not None:
        path.append(via[path[-1]])
    return path[::-1], best[end]


def success_probabilities(g: Graphish, p: float) -> dict[str, float]:
    """Flow's Theorem 1: P(v) = (1 - p) * product of P(parent), each subtask failing with p."""
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ConfigError(f"p is a failure probability between 0 and 1, not {p!r}; pick e.g. 0.1")
    graph = _graph(g)
    prob: dict[str, float] = {}
    for n in nx.topological_sort(graph):
        prob[n] = (1.0 - p) * math.prod(prob[q] for q in graph.predecessors(n))
    return {n: prob[n] for n in graph}


def expected_successes(g: Graphish, p: float) -> float:
    """Expected number of subtasks that succeed: the sum of P(v) over the nodes."""
    return sum(success_probabilities(g, p).values())


def shape(g: Graphish, p: float = 0.1) -> dict:
    """The numbers plan selection and the UI use: the paper's P_avg and C_dependency as
    defined there, the width-aware speed-up, connectivity, sinks and Theorem 1's expected
    successes (total, and per subtask so bigger plans are not favoured by size alone)."""
    graph = _graph(g)
    n = graph.number_of_nodes()
    expected = expected_successes(graph, p)
    return {"parallelism": parallelism(graph), "dependency_complexity": dependency_complexity(graph),
            "speedup": speedup(graph), "nodes": n, "edges": graph.number_of_edges(),
            "depth": depth(graph), "width": width(graph), "connected": is_connected(graph),
            "sinks": len(sinks(graph)), "expected_successes": expected,
            "success_share": expected / n if n else 0.0, "failure_p": p}


def summary(g: Graphish, p: float = 0.1) -> dict:
    """Every metric in one JSON-ready dict (p is the failure probability for Theorem 1)."""
    graph = _graph(g)
    path, length = critical_path(graph, "count")
    # Durations live on the Node objects, so the Workflow itself goes to this one.
    dpath, dlength = critical_path(g, "duration")
    return {
        "nodes": graph.number_of_nodes(),
        "edges": graph.number_of_edges(),
        "depth": depth(graph),
        "width": width(graph),
        "levels": levels(graph),
        "parallelism": parallelism(graph),
        "speedup": speedup(graph),
        "dependency_complexity": dependency_complexity(graph),
        "complexity": complexity(graph),
        "connected": is_connected(graph),
        "sinks": sinks(graph),
        "critical_path": path,
        "critical_path_length": length,
        "critical_path_by_duration": dpath,
        "critical_path_duration": dlength,
        "failure_p": p,
        "expected_successes": expected_successes(graph, p),
    }
