"""Metrics pinned on the paper's examples and on small graphs worked out by hand."""

from __future__ import annotations

import json
import math

import networkx as nx
import pytest

from flowmagic.model import metrics
from flowmagic.errors import ConfigError
from flowmagic.model.graph import Node, Workflow

W1 = "a>c b>c a>d b>d c>d"   # Flow's workflow 1
W2 = "a>c b>c c>d"           # Flow's workflow 2: same levels, fewer edges
CHAIN = "a>b b>c c>d"
DIAMOND = "a>b a>c a>d b>e c>e d>e"  # 1 -> 3 -> 1


def make(edges: str, nodes: str = "") -> Workflow:
    wf = Workflow("metrics")
    pairs = [e.split(">") for e in edges.split()]
    for name in [n for p in pairs for n in p] + nodes.split():
        if name not in wf:
            wf.add_node(Node(name, f"do {name}"))
    for a, b in pairs:
        wf.add_edge(a, b)
    return wf


# name, edges, isolated nodes, level sizes, P_avg, dependency complexity, |V|, |E|
TABLE = [
    ("empty", "", "", [], 0.0, 0.0, 0, 0),
    ("single", "", "a", [1], 1.0, 0.0, 1, 0),
    ("three independent", "", "a b c", [3], 1.0, 0.0, 3, 0),
    ("workflow 1", W1, "", [2, 1, 1], 1 / 3, 0.5, 4, 5),
    ("workflow 2", W2, "", [2, 1, 1], 1 / 3, math.sqrt(0.75), 4, 3),
    ("chain of 4", CHAIN, "", [1, 1, 1, 1], 1 / 4, 0.5, 4, 3),
    ("diamond 1-3-1", DIAMOND, "", [1, 3, 1], 1 / 3, math.sqrt(0.24), 5, 6),
    ("shortcut edge", "a>b b>c a>c", "", [1, 1, 1], 1 / 3, 0.0, 3, 3),
    ("two chains", "a>b c>d", "e", [3, 2], 1 / 2, 0.4, 5, 2),
]


@pytest.mark.parametrize("name, edges, extra, sizes, p_avg, dep_c, n, m", TABLE,
                         ids=[row[0] for row in TABLE])
def test_metric_table(name, edges, extra, sizes, p_avg, dep_c, n, m):
    wf = make(edges, extra)
    assert [len(s) for s in metrics.levels(wf)] == sizes
    assert metrics.parallelism(wf) == pytest.approx(p_avg)
    assert metrics.dependency_complexity(wf) == pytest.approx(dep_c)
    assert metrics.depth(wf) == len(sizes)
    assert metrics.width(wf) == max(sizes, default=0)
    assert (metrics.num_nodes(wf), metrics.num_edges(wf)) == (n, m)
    assert metrics.complexity(wf) == n + m
    # The same numbers from a bare DiGraph of the active nodes.
    assert metrics.parallelism(wf.active()) == pytest.approx(p_avg)
    assert metrics.levels(wf.active()) == metrics.levels(wf)


def test_paper_example_ties_on_parallelism_and_workflow_2_is_smaller():
    w1, w2, chain = make(W1), make(W2), make(CHAIN)
    assert metrics.parallelism(w1) == pytest.approx(metrics.parallelism(w2))
    assert metrics.complexity(w2) < metrics.complexity(w1)
    assert metrics.parallelism(chain) < metrics.parallelism(w2)
    # Degree spread is a different measure: w2's one hub makes it the more uneven graph.
    assert metrics.dependency_complexity(w2) > metrics.dependency_complexity(w1)


def test_diamond_uses_longest_path_levels_not_a_per_parent_bfs():
    wf = make(DIAMOND)
    assert metrics.levels(wf) == [["a"], ["b", "c", "d"], ["e"]]
    assert metrics.parallelism(wf) == pytest.approx((1 / 5 + 3 / 5 + 1 / 5) / 3)
    # Flow's walk counts e once per parent (levels 1, 3, 3): 7/3 per level, 7/15 normalised.
    assert metrics.parallelism(wf) != pytest.approx((1 / 5 + 3 / 5 + 3 / 5) / 3)


def test_metrics_ignore_pruned_nodes():
    wf = make(DIAMOND)
    wf.prune("c")
    # the bypass a -> e is there although a reaches e through b and d: e read c, c read a
    assert metrics.num_nodes(wf) == 4 and metrics.num_edges(wf) == 5
    assert metrics.levels(wf) == [["a"], ["b", "d"], ["e"]]
    assert metrics.summary(wf)["nodes"] == 4


# -- Theorem 1 ---------------------------------------------------------------------------

def test_theorem_1_by_hand():
    wf = make(W2)  # a, b roots; c after both; d after c
    probs = metrics.success_probabilities(wf, 0.1)
    assert probs == pytest.approx({"a": 0.9, "b": 0.9, "c": 0.9 * 0.9 * 0.9, "d": 0.9 * 0.729})
    assert metrics.expected_successes(wf, 0.1) == pytest.approx(0.9 + 0.9 + 0.729 + 0.6561)
    # Workflow 1's extra edges into d cost expected successes: d needs a, b and c.
    assert metrics.expected_successes(make(W1), 0.1) == pytest.approx(0.9 + 0.9 + 0.729 + 0.9 * 0.9 * 0.9 * 0.729)
    assert metrics.expected_successes(make(W1), 0.1) < metrics.expected_successes(wf, 0.1)


@pytest.mark.parametrize("p, expected", [(0.0, 5.0), (1.0, 0.0), (0.5, 0.5 + 3 * 0.25 + 0.5 * 0.25 ** 3)])
def test_expected_successes_edges_of_the_range(p, expected):
    assert metrics.expected_successes(make(DIAMOND), p) == pytest.approx(expected)


@pytest.mark.parametrize("p", [-0.1, 1.5, "0.1", None, True, float("nan")])
def test_bad_failure_probability_is_a_config_error(p):
    with pytest.raises(ConfigError, match="failure probability"):
        metrics.expected_successes(make(CHAIN), p)


# -- critical path -----------------------------------------------------------------------

def durations_example() -> Workflow:
    """a -> b -> d and a -> c -> e -> d; b is slow, the other branch is long."""
    wf = make("a>b a>c b>d c>e e>d")
    wf.nodes["a"].start, wf.nodes["a"].end = 100.0, 102.0   # measured 2 s
    wf.nodes["b"].estimate_s = 5.0                            # estimate only
    wf.nodes["d"].start, wf.nodes["d"].end = 0.0, 1.0         # measured 1 s
    wf.nodes["d"].estimate_s = 50.0                           # a measurement beats the estimate
    return wf                                                 # c and e: 1.0 each by default


def test_critical_path_by_count_and_by_duration():
    wf = durations_example()
    assert metrics.critical_path(wf) == (["a", "c", "e", "d"], 4.0)
    assert metrics.critical_path(wf, "duration") == (["a", "b", "d"], 8.0)


def test_critical_path_ties_follow_plan_order_and_empty_is_empty():
    assert metrics.critical_path(make("a>b a>c b>d c>d")) == (["a", "b", "d"], 3.0)
    assert metrics.critical_path(make("", "x y")) == (["x"], 1.0)
    assert metrics.critical_path(Workflow()) == ([], 0.0)
    assert metrics.critical_path(Workflow(), "duration") == ([], 0.0)


def test_critical_path_on_a_bare_digraph_reads_node_attributes():
    g = nx.DiGraph()
    g.add_node("a", duration=1.0)
    g.add_node("b", estimate_s=10.0)
    g.add_node("c")
    g.add_edges_from([("a", "b"), ("a", "c")])
    assert metrics.critical_path(g, "duration") == (["a", "b"], 11.0)


def test_unknown_weight_is_a_config_error():
    with pytest.raises(ConfigError, match="'count' or 'duration'"):
        metrics.critical_path(make(CHAIN), "tokens")


# -- summary -----------------------------------------------------------------------------

def test_summary_has_everything_and_is_json():
    s = metrics.summary(durations_example(), p=0.2)
    assert json.loads(json.dumps(s)) == s
    assert s["nodes"] == 5 and s["edges"] == 5 and s["complexity"] == 10
    assert s["depth"] == 4 and s["width"] == 2
    assert s["parallelism"] == pytest.approx(1 / 4)
    assert s["critical_path"] == ["a", "c", "e", "d"] and s["critical_path_length"] == 4.0
    assert s["critical_path_by_duration"] == ["a", "b", "d"] and s["critical_path_duration"] == 8.0
    assert s["failure_p"] == 0.2
    assert s["expected_successes"] == pytest.approx(metrics.expected_successes(durations_example(), 0.2))


def test_summary_of_an_empty_workflow_is_zeros():
    s = metrics.summary(Workflow())
    assert s == {"nodes": 0, "edges": 0, "depth": 0, "width": 0, "levels": [], "parallelism": 0.0,
                 "dependency_complexity": 0.0, "complexity": 0, "critical_path": [],
                 "critical_path_length": 0.0, "critical_path_by_duration": [],
                 "critical_path_duration": 0.0, "failure_p": 0.1, "expected_successes": 0.0,
                 "speedup": 0.0, "connected": False, "sinks": []}


@pytest.mark.parametrize("name, edges, extra, speedup, sinks, connected", [
    ("empty", "", "", 0.0, 0, False),
    ("single", "", "a", 1.0, 1, True),
    ("three independent", "", "a b c", 3.0, 3, False),
    ("workflow 1", W1, "", 4 / 3, 1, True),
    ("workflow 2", W2, "", 4 / 3, 1, True),
    ("chain of 4", CHAIN, "", 1.0, 1, True),
    ("diamond 1-3-1", DIAMOND, "", 5 / 3, 1, True),
    ("two chains", "a>b c>d", "e", 2.5, 3, False),
])
def test_width_aware_shape(name, edges, extra, speedup, sinks, connected):
    wf = make(edges, extra)
    shape = metrics.shape(wf)
    assert shape["speedup"] == pytest.approx(speedup) == pytest.approx(metrics.speedup(wf))
    assert shape["sinks"] == sinks == len(metrics.sinks(wf))
    assert shape["connected"] is connected is metrics.is_connected(wf)
    n = shape["nodes"]
    assert shape["success_share"] == pytest.approx(shape["expected_successes"] / n if n else 0)
    json.dumps(shape)
