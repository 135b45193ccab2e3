"""Workflow and Node: the graph API, JSON both ways, pruning, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowmagic.errors import FlowError, NodeError, PlanError
from flowmagic.model.graph import STATUSES, Node, Workflow, is_slug, parse_plan, slugify


def make(edges: str, nodes: str = "", statuses: dict | None = None) -> Workflow:
    """Workflow from "a>b b>c" (plus extra isolated nodes in `nodes`), in order of appearance."""
    wf = Workflow("test")
    pairs = [e.split(">") for e in edges.split()]
    for name in [n for p in pairs for n in p] + nodes.split():
        if name not in wf:
            wf.add_node(Node(name, f"do {name}", status=(statuses or {}).get(name, "pending")))
    for a, b in pairs:
        wf.add_edge(a, b)
    return wf


DIAMOND = "a>b a>c a>d b>e c>e d>e"


# -- Node ------------------------------------------------------------------------------

def test_node_round_trip_keeps_every_field():
    node = Node("n1", "write it", agent="writer", model="local", status="done", output="text",
                attempts=[{"output": "x", "passed": False}], tokens_in=3, tokens_out=4,
                cost_usd=0.5, start=10.0, end=12.5, error=None, clone="writer#2",
                estimate_s=3.0, downgraded_from="gpt-4o", stale=True)
    d = node.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert Node.from_dict(d) == node
    assert node.duration == 2.5
    assert Node("x", "y").duration is None


@pytest.mark.parametrize("bad, word", [
    ({"requirement": "r"}, "'id'"),
    ({"id": "a", "requirement": "  "}, "'requirement'"),
    ({"id": "a", "requirement": "r", "tokens_in": "3"}, "tokens_in"),
    ({"id": "a", "requirement": "r", "stale": 1}, "stale"),
    ([1, 2], "JSON object"),
])
def test_node_from_dict_rejects_bad_input_with_one_line(bad, word):
    with pytest.raises(PlanError) as err:
        Node.from_dict(bad)
    assert word in str(err.value) and "\n" not in str(err.value)


# -- building and querying ------------------------------------------------------------

def test_parents_children_ancestors_in_plan_order():
    wf = make("c>d a>d b>d d>e")
    assert wf.parents("d") == ["c", "a", "b"]
    assert wf.children("d") == ["e"]
    assert wf.ancestors("e") == ["c", "d", "a", "b"]
    assert wf.descendants("c") == ["d", "e"]
    assert wf.edges() == [("c", "d"), ("d", "e"), ("a", "d"), ("b", "d")]


def test_plan_order_follows_edits_of_the_node_dict():
    """Parents are ordered by plan position; the positions must follow every change of the
    node dict (a node removed, moved to the end, replaced), not the order first seen."""
    wf = make("c>d a>d b>d d>e")
    assert wf.parents("d") == ["c", "a", "b"]
    wf.nodes["c"] = wf.nodes.pop("c")   # c moves to the end of the plan
    assert wf.parents("d") == ["a", "b", "c"]
    del wf.nodes["a"]
    wf.graph.remove_node("a")
    wf.add_node(Node("a", "do a again"))
    wf.add_edge("a", "d")
    assert wf.parents("d") == ["b", "c", "a"]
    wf.nodes = {k: wf.nodes[k] for k in ("a", "b", "c", "d", "e")}   # a new plain dict
    assert wf.parents("d") == ["a", "b", "c"]
    assert wf.copy().parents("d") == ["a", "b", "c"]


@pytest.mark.parametrize("call, error, words", [
    (lambda wf: wf.node("zz"), NodeError, "unknown node 'zz'; known nodes: a, b"),
    (lambda wf: wf.add_node(Node("a", "again")), NodeError, "already exists"),
    (lambda wf: wf.add_node(Node("Bad Id", "x")), NodeError, "'bad_id'"),
    (lambda wf: wf.add_node(Node("ok", " ")), NodeError, "empty requirement"),
    (lambda wf: wf.add_node(Node("ok", "x", status="weird")), NodeError, "unknown status"),
    (lambda wf: wf.add_edge("a", "a"), PlanError, "cannot depend on itself"),
    (lambda wf: wf.add_edge("c", "a"), PlanError, "would close a cycle"),
    (lambda wf: wf.add_edge("a", "zz"), NodeError, "unknown node"),
    (lambda wf: wf.remove_edge("c", "a"), NodeError, "no edge c -> a"),
    (lambda wf: wf.parents("zz"), NodeError, "unknown node"),
])
def test_misuse_raises_a_flow_error_that_says_what_to_do(call, error, words):
    wf = make("a>b b>c")
    with pytest.raises(error) as err:
        call(wf)
    assert isinstance(err.value, FlowError)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_add_edge_twice_is_one_edge_and_remove_edge_removes_it():
    wf = make("a>b")
    wf.add_edge("a", "b")
    assert wf.graph.number_of_edges() == 1
    wf.remove_edge("a", "b")
    assert wf.edges() == []


def test_edges_to_pruned_nodes_are_refused():
    wf = make("a>b", "c")
    wf.prune("c")
    with pytest.raises(NodeError, match="pruned"):
        wf.add_edge("a", "c")


@pytest.mark.parametrize("edges, extra, order, generations", [
    ("", "a", ["a"], [["a"]]),
    ("a>b b>c c>d", "", ["a", "b", "c", "d"], [["a"], ["b"], ["c"], ["d"]]),
    (DIAMOND, "", ["a", "b", "c", "d", "e"], [["a"], ["b", "c", "d"], ["e"]]),
    # d is a root but plan order puts it after b, and the level ordering follows plan order.
    ("a>b b>c", "d", ["a", "b", "c", "d"], [["a", "d"], ["b"], ["c"]]),
    # Longest-path levels: c waits for b even though a reaches it directly.
    ("a>b b>c a>c", "", ["a", "b", "c"], [["a"], ["b"], ["c"]]),
])
def test_order_and_generations(edges, extra, order, generations):
    wf = make(edges, extra)
    assert wf.order() == order
    assert wf.generations() == generations


@pytest.mark.parametrize("statuses, ready, counts", [
    ({}, ["a"], {"a": 0, "b": 1, "c": 1, "d": 1, "e": 3}),
    ({"a": "done"}, ["b", "c", "d"], {"b": 0, "e": 3}),
    ({"a": "done", "b": "done", "c": "failed", "d": "done"}, [], {"e": 1}),
    ({"a": "done", "b": "done", "c": "done", "d": "running"}, [], {"e": 1}),
    ({"a": "done", "b": "done", "c": "done", "d": "done"}, ["e"], {"e": 0}),
])
def test_ready_and_num_parents_not_completed_are_derived(statuses, ready, counts):
    wf = make(DIAMOND, statuses=statuses)
    assert wf.ready() == ready
    for node_id, n in counts.items():
        assert wf.num_parents_not_completed(node_id) == n


def test_pruning_a_pending_parent_unblocks_its_children():
    wf = make("a>b b>c", statuses={"a": "done"})
    assert wf.ready() == ["b"]
    wf.prune("b")
    assert wf.parents("c") == ["a"]
    assert wf.ready() == ["c"]


# -- prune -----------------------------------------------------------------------------

def test_prune_links_every_predecessor_to_every_successor_once():
    wf = make("a>c b>c c>d c>e a>d")
    wf.prune("c")
    assert wf.nodes["c"].status == "pruned"
    assert "c" in wf.nodes and wf.graph.degree("c") == 0
    assert sorted(wf.edges()) == [("a", "d"), ("a", "e"), ("b", "d"), ("b", "e")]
    assert "c" not in wf.active() and "c" not in wf.order()
    wf.prune("c")  # pruning twice changes nothing
    assert sorted(wf.edges()) == [("a", "d"), ("a", "e"), ("b", "d"), ("b", "e")]


@pytest.mark.parametrize("edges, node, after", [
    # a reaches d through b already, yet d read c, which read a: a -> d carries that data
    ("a>b b>d a>c c>d", "c", [("a", "b"), ("a", "d"), ("b", "d")]),
    # preds a, b with a -> b: c read x, which read both
    ("a>b a>x b>x x>c", "x", [("a", "b"), ("a", "c"), ("b", "c")]),
    ("a>x x>b", "x", [("a", "b")]),
])
def test_prune_links_every_predecessor_to_every_successor_and_unprune_undoes_it(edges, node, after):
    wf = make(edges)
    before = sorted(wf.edges())
    wf.nodes[node].status = "done"
    wf.prune(node)
    assert sorted(wf.edges()) == after
    wf.unprune(node)
    assert sorted(wf.edges()) == before and wf.nodes[node].status == "done"
    with pytest.raises(NodeError, match="not pruned; nothing to undo"):
        wf.unprune(node)
    # the record survives a JSON round trip (the store), so a reloaded flow can unprune
    wf.prune(node)
    again = Workflow.from_dict(json.loads(json.dumps(wf.to_dict())))
    again.unprune(node)
    assert sorted(again.edges()) == before


def test_prune_keeps_history():
    wf = make("a>b")
    wf.nodes["a"].output = "old"
    wf.nodes["a"].attempts.append({"output": "old", "passed": True})
    wf.prune("a")
    assert wf.nodes["a"].output == "old" and wf.nodes["a"].attempts


# Ids that are also plan keys, numbers or index-like words must survive JSON round trips.
TRICKY_IDS = ["task", "plan", "steps", "nodes", "edges", "id", "name", "requirement", "child",
              "status", "data", "warnings", "next", "deps", "1", "2", "0", "task_1", "step_2",
              "t1", "none", "a_b", "__x__", "n" * 40]


@st.composite
def dags(draw, max_nodes=9):
    n = draw(st.integers(1, max_nodes))
    plain = [f"n{i}" for i in range(n)]
    names = draw(st.just(plain) | st.lists(st.sampled_from(TRICKY_IDS), min_size=n, max_size=n, unique=True))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True) if pairs else st.just([]))
    statuses = draw(st.lists(st.sampled_from(STATUSES[:-1]), min_size=n, max_size=n))
    wf = Workflow("dag")
    for name, status in zip(names, statuses):
        wf.add_node(Node(name, f"do {name}", status=status))
    for i, j in chosen:
        wf.add_edge(names[i], names[j])
    return wf


@settings(max_examples=300, deadline=None)
@given(dags(), st.data())
def test_prune_preserves_reachability_between_remaining_nodes(wf, data):
    before = nx.transitive_closure_dag(wf.graph)
    victims = data.draw(st.lists(st.sampled_from(list(wf.nodes)), unique=True))
    for v in victims:
        wf.prune(v)
    rest = [n for n in wf.nodes if n not in victims]
    after = nx.transitive_closure_dag(wf.active())
    for a in rest:
        for b in rest:
            assert before.has_edge(a, b) == after.has_edge(a, b)
    assert nx.is_directed_acyclic_graph(wf.graph)
    assert nx.number_of_selfloops(wf.graph) == 0
    assert all(wf.graph.degree(v) == 0 for v in victims)


# -- JSON both ways --------------------------------------------------------------------

def _shape(wf: Workflow):
    return ([(i, n.requirement, n.agent, n.status) for i, n in wf.nodes.items()], sorted(wf.edges()))


@settings(max_examples=300, deadline=None)
@given(dags(), st.data())
def test_to_dict_and_to_paper_dict_round_trip(wf, data):
    for v in data.draw(st.lists(st.sampled_from(list(wf.nodes)), unique=True, max_size=3)):
        wf.prune(v)
    plain = json.loads(json.dumps(wf.to_dict()))
    back = Workflow.from_dict(plain)
    assert _shape(back) == _shape(wf)
    assert [n.to_dict() for n in back.nodes.values()] == plain["nodes"]
    assert back.warnings == wf.warnings and back.task == wf.task
    paper = json.loads(json.dumps(wf.to_paper_dict()))
    again = Workflow.from_dict(paper, task="dag")
    assert _shape(again) == _shape(wf)
    assert again.warnings == []
    for node_id, entry in paper.items():
        assert entry["num_parents_not_completed"] == wf.num_parents_not_completed(node_id)
        assert entry["child"] == wf.children(node_id)


def test_paper_dict_count_is_derived_not_trusted():
    paper = make(DIAMOND).to_paper_dict()
    paper["e"]["num_parents_not_completed"] = 0
    paper["a"]["num_parents_not_completed"] = 9
    wf = Workflow.from_dict(paper)
    assert wf.num_parents_not_completed("e") == 3 and wf.num_parents_not_completed("a") == 0
    assert wf.to_paper_dict()["e"]["num_parents_not_completed"] == 3


def test_to_paper_dict_shape():
    wf = make("a>b", statuses={"a": "done"})
    wf.nodes["a"].output = "result"
    assert wf.to_paper_dict() == {
        "a": {"requirement": "do a", "status": "done", "data": "result", "agent": "assistant",
              "child": ["b"], "num_parents_not_completed": 0},
        "b": {"requirement": "do b", "status": "pending", "data": None, "agent": "assistant",
              "child": [], "num_parents_not_completed": 0},
    }


def test_copy_is_deep():
    wf = make("a>b")
    twin = wf.copy()
    twin.nodes["a"].status = "done"
    twin.add_edge("a", "b")
    twin.prune("b")
    assert wf.nodes["a"].status == "pending" and wf.edges() == [("a", "b")]
    assert parse_plan(wf) is not wf and _shape(parse_plan(wf)) == _shape(wf)


@pytest.mark.parametrize("text, slug", [
    ("load_data", "load_data"), ("Load Data", "load_data"), ("  --x--  ", "x"),
    ("Données brutes", "donnees_brutes"), ("☃", ""), ("a" * 50, "a" * 40),
    ("a" * 39 + " b", "a" * 39), ("12", "12"), ("__odd__", "__odd__"),
])
def test_slugify(text, slug):
    assert slugify(text) == slug
    assert slugify(slug) == slug
    assert is_slug(slug) or slug == ""


def test_order_does_not_depend_on_the_hash_seed():
    script = (
        "import json; from flowmagic.model.graph import parse_plan; "
        "wf = parse_plan({'subtasks': [{'id': n, 'requirement': n, 'dependencies': d} for n, d in "
        "[('z', []), ('y', []), ('m', ['z', 'y']), ('b', ['m']), ('a', ['m']), ('q', ['a', 'b', 'q'])]]}); "
        "print(json.dumps([wf.order(), wf.generations(), wf.edges(), wf.ready(), wf.warnings]))"
    )
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout)
    assert len(outs) == 1


def test_every_node_field_has_a_json_type_check():
    from dataclasses import fields

    from flowmagic.model.node import FIELD_TYPES

    assert set(FIELD_TYPES) == {f.name for f in fields(Node)} - {"id", "requirement"}


def test_an_id_longer_than_40_characters_is_shortened_with_a_word():
    long_id = "summarise_every_column_of_the_sales_table"   # 41 characters
    wf = Workflow.from_dict({"subtasks": [{"id": long_id, "requirement": "summarise"}]})
    (node_id,) = wf.nodes
    assert len(long_id) == 41 and node_id == long_id[:40]
    assert any(w.startswith(f"shortened the id {long_id!r}") and "at most 40 characters" in w
               for w in wf.warnings), wf.warnings


def test_node_and_execution_dicts_hold_every_field_as_copies():
    """to_dict is hand-rolled for speed: it must match dataclasses.asdict for every field,
    including fields added later, and share no container with the object."""
    from dataclasses import asdict

    from flowmagic.engine.answer_code import Execution
    from flowmagic.model.graph import Node

    node = Node(id="a", requirement="r", attempts=[{"x": [1, {"y": 2}], "t": (1, 2)}],
                pruned_from={"parents": ["b"]}, execution={"files": ["f"]})
    ex = Execution(code="x", ran=True, files=["a.csv"], figures=["p.png"], saved=["s.py"])
    for obj in (node, ex):
        copied = obj.to_dict()
        assert copied == asdict(obj) and list(copied) == list(asdict(obj))
    copied = node.to_dict()
    copied["attempts"][0]["x"][1]["y"] = 3
    copied["pruned_from"]["parents"].append("c")
    assert node.attempts[0]["x"][1]["y"] == 2 and node.pruned_from == {"parents": ["b"]}
    ex.to_dict()["files"].append("b.csv")
    assert ex.files == ["a.csv"]
