"""parse_plan: every shape models emit, a corpus of malformed plans, and fuzzing.

The corpus lives in tests/data/malformed_plans/, one JSON file per plan:
{"source", "note", "input", "expect": {"nodes", "warnings_contain", "error"}}.
Files with "source": "smollm2-135m" are raw answers of the embedded model, captured over
HTTP from llama_cpp.server; for an expected error, warnings_contain is matched against
the PlanError message instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowmagic.errors import PlanError
from flowmagic.model.graph import STATUSES, Workflow, is_slug, parse_plan

CORPUS = sorted((Path(__file__).parent / "data" / "malformed_plans").glob("*.json"))


def assert_valid(wf: Workflow) -> None:
    """A DAG over known slug ids, with consistent derived counts, that survives a round trip."""
    assert isinstance(wf, Workflow) and wf.nodes
    assert nx.is_directed_acyclic_graph(wf.graph)
    assert list(wf.graph.nodes) == list(wf.nodes)
    for a, b in wf.graph.edges:
        assert a != b
        assert "pruned" not in (wf.nodes[a].status, wf.nodes[b].status)
    for node_id, node in wf.nodes.items():
        assert is_slug(node_id) and node.id == node_id
        assert isinstance(node.requirement, str) and node.requirement.strip()
        assert node.status in STATUSES and isinstance(node.agent, str) and node.agent
        waiting = [p for p in wf.graph.predecessors(node_id) if wf.nodes[p].status != "done"]
        assert wf.num_parents_not_completed(node_id) == len(waiting)
    assert all(isinstance(w, str) and w.strip() and "\n" not in w for w in wf.warnings)
    plain = json.loads(json.dumps(wf.to_dict()))
    again = Workflow.from_dict(plain)
    assert list(again.nodes) == list(wf.nodes) and again.edges() == wf.edges()
    assert again.warnings == wf.warnings  # a repaired plan needs no further repair


# -- the corpus ----------------------------------------------------------------------------

def test_corpus_is_big_enough_and_includes_real_model_output():
    cases = [json.loads(p.read_text()) for p in CORPUS]
    assert len(cases) >= 20
    assert sum(c["source"] == "smollm2-135m" for c in cases) >= 5


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus(path):
    case = json.loads(path.read_text())
    expect = case["expect"]
    if expect["error"]:
        with pytest.raises(PlanError) as err:
            parse_plan(case["input"])
        message = str(err.value)
        assert message and "\n" not in message
        for part in expect["warnings_contain"]:
            assert part in message
        return
    wf = parse_plan(case["input"])
    assert_valid(wf)
    if expect["nodes"] is not None:
        assert len(wf.nodes) == expect["nodes"]
    for part in expect["warnings_contain"]:
        assert any(part in w for w in wf.warnings), (part, wf.warnings)
    if not expect["warnings_contain"] and case["source"] == "hand":
        assert wf.warnings == []


# -- the shapes models emit, with their exact result ----------------------------------------

SHAPES = [
    ("subtasks/id/requirement/dependencies",
     {"subtasks": [{"id": "a", "requirement": "A", "dependencies": []},
                   {"id": "b", "requirement": "B", "dependencies": ["a"], "agent": "coder"}]},
     ["a", "b"], [("a", "b")]),
    ("tasks/name/description/depends_on",
     {"tasks": [{"name": "fetch", "description": "F"}, {"name": "sum", "description": "S", "depends_on": "fetch"}]},
     ["fetch", "sum"], [("fetch", "sum")]),
    ("steps/title/task/deps by index",
     {"steps": [{"title": "one", "task": "1"}, {"title": "two", "task": "2", "deps": [1]},
                {"title": "three", "task": "3", "deps": [1, 2]}]},
     ["one", "two", "three"], [("one", "two"), ("one", "three"), ("two", "three")]),
    ("nodes/text/prev and next that agree",
     {"nodes": [{"id": "x", "text": "X", "next": ["y"], "prev": []}, {"id": "y", "text": "Y", "next": [], "prev": ["x"]}]},
     ["x", "y"], [("x", "y")]),
    ("plan/label/after/children",
     {"plan": [{"id": "p", "label": "P", "children": ["q"]}, {"id": "q", "label": "Q", "after": []}, {"id": "r", "label": "R", "after": ["p"]}]},
     ["p", "q", "r"], [("p", "q"), ("p", "r")]),
    ("bare list with parents and requires",
     [{"id": "s", "content": "S"}, {"id": "t", "content": "T", "parents": ["s"]}, {"id": "u", "content": "U", "requires": ["s", "t"]}],
     ["s", "t", "u"], [("s", "t"), ("s", "u"), ("t", "u")]),
    ("paper form",
     {"t1": {"requirement": "A", "status": "pending", "data": "", "agent": "a", "child": ["t2"], "num_parents_not_completed": 0},
      "t2": {"requirement": "B", "status": "pending", "data": "", "agent": "b", "child": [], "num_parents_not_completed": 1}},
     ["t1", "t2"], [("t1", "t2")]),
    ("nodes and edges as pairs",
     {"nodes": [{"id": "a", "requirement": "A"}, {"id": "b", "requirement": "B"}], "edges": [["a", "b"]]},
     ["a", "b"], [("a", "b")]),
    ("nodes and edges as from/to and source/target",
     {"nodes": [{"id": "a", "requirement": "A"}, {"id": "b", "requirement": "B"}, {"id": "c", "requirement": "C"}],
      "edges": [{"from": "a", "to": "b"}, {"source": "b", "target": "c"}]},
     ["a", "b", "c"], [("a", "b"), ("b", "c")]),
    ("dependencies named by requirement text and by 'step N'",
     {"subtasks": [{"requirement": "Load the data"}, {"requirement": "Plot", "dependencies": ["load the data"]},
                   {"requirement": "Report", "dependencies": ["Step 2"]}]},
     ["task_1", "task_2", "task_3"], [("task_1", "task_2"), ("task_2", "task_3")]),
    ("numeric ids are ids first, indexes second",
     {"subtasks": [{"id": 2, "requirement": "first"}, {"id": 1, "requirement": "second", "dependencies": [2]},
                   {"id": 3, "requirement": "third", "dependencies": [1, "2"]}]},
     ["2", "1", "3"], [("2", "1"), ("2", "3"), ("1", "3")]),
]


@pytest.mark.parametrize("name, plan, ids, edges", SHAPES, ids=[s[0] for s in SHAPES])
def test_shapes(name, plan, ids, edges):
    wf = parse_plan(plan)
    assert_valid(wf)
    assert list(wf.nodes) == ids
    assert sorted(wf.edges()) == sorted(edges)
    # The same plan as text, wrapped the way chat models wrap it, gives the same workflow.
    text = parse_plan(f"Here you go:\n```json\n{json.dumps(plan)}\n```\nDone.")
    assert list(text.nodes) == ids and text.edges() == wf.edges()


def test_agents_statuses_and_task_are_carried_over():
    wf = parse_plan({"task": "Write it", "subtasks": [
        {"id": "a", "requirement": "A", "role": "researcher", "status": "completed", "data": {"k": 1}},
        {"id": "b", "requirement": "B", "assignee": "writer", "dependencies": ["a"]}]})
    assert wf.task == "Write it"
    assert (wf.nodes["a"].agent, wf.nodes["a"].status, wf.nodes["a"].output) == ("researcher", "done", '{"k": 1}')
    assert wf.nodes["b"].agent == "writer" and wf.ready() == ["b"]
    assert parse_plan({"task": "ignored", "subtasks": ["x"]}, task="given").task == "given"


@pytest.mark.parametrize("agent, requirement, expected", [
    ("writer,", "Write the post.", "writer"),             # the demo's agent, from SmolLM2
    ("  Data Analyst ", "Summarise it.", "data_analyst"),
    ("", "Plot sales by month.", "designer"),
    ("<role>", "Load sales.csv with pandas.", "coder"),   # a copied placeholder
    ("agent", "Write three findings.", "writer"),
    ("123", "Do something nice.", "assistant"),
])
def test_agent_names_are_cleaned_like_ids_and_junk_gets_a_role(agent, requirement, expected):
    wf = parse_plan({"subtasks": [{"id": "a", "requirement": requirement, "agent": agent}]})
    assert wf.nodes["a"].agent == expected


@pytest.mark.parametrize("order, dropped", [
    # The one edge against the written order is the one that goes.
    (["a", "b", "c"], "dropped the edge c -> a: it closed a cycle (a already leads to c)"),
    (["c", "a", "b"], "dropped the edge b -> c: it closed a cycle (c already leads to b)"),
])
def test_cycle_breaking_removes_the_edge_that_closes_it(order, dropped):
    deps = {"a": ["c"], "b": ["a"], "c": ["b"]}
    plan = [{"id": i, "requirement": i.upper(), "dependencies": deps[i]} for i in order]
    wf = parse_plan(plan)
    assert wf.graph.number_of_edges() == 2
    assert [w for w in wf.warnings if "cycle" in w] == [dropped]
    assert parse_plan(plan).to_dict() == wf.to_dict()  # deterministic


def test_without_the_extract_module_text_must_be_plain_json(monkeypatch):
    monkeypatch.setitem(sys.modules, "flowmagic.json_extract", None)
    assert list(parse_plan('["a", "b"]').nodes) == ["task_1", "task_2"]
    with pytest.raises(PlanError, match="no JSON plan could be read"):
        parse_plan('Here: ["a", "b"]')


@pytest.mark.parametrize("bad", ["", "   ", b"", "[]", "{}", "null", "42", '"text"', [], {}, 3.5, None, True,
                                 [None, 1, []], {"subtasks": [{"id": "a"}]}, "[" * 5000 + "]" * 5000])
def test_unusable_plans_raise_one_line_plan_errors(bad):
    with pytest.raises(PlanError) as err:
        parse_plan(bad)
    assert "\n" not in str(err.value) and ";" in str(err.value)  # what was wrong; what to do


# -- fuzzing ---------------------------------------------------------------------------------

PLAN_KEYS = ["subtasks", "tasks", "steps", "nodes", "edges", "plan", "id", "name", "title", "requirement",
             "description", "task", "text", "dependencies", "depends_on", "deps", "after", "prev", "next",
             "child", "children", "agent", "role", "status", "data", "from", "to", "source", "target",
             "num_parents_not_completed", "attempts", "tokens_in", "start", "end", "warnings", "Task_A"]
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(max_size=12) | st.sampled_from(PLAN_KEYS + ["a", "b", "1", "none", "a, b", "step 2"]))
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.sampled_from(PLAN_KEYS) | st.text(max_size=8), inner, max_size=5),
    max_leaves=25,
)


def check(obj) -> None:
    try:
        wf = parse_plan(obj)
    except PlanError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert_valid(wf)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSONISH)
@example({"subtasks": "0", "  ": None})   # a warning quoting white space read back folded
def test_any_json_like_input_is_a_valid_dag_or_a_plan_error(obj):
    check(obj)


WEIRD_TEXT = st.sampled_from(["", " ", "x" * 5000, "Ünïcödé ☃ 名前", "a\nb", "Task 1", "1", "-", "none", "\x00"]) | st.text(max_size=20)


@st.composite
def mutated_plans(draw):
    """A valid plan, then the damage small models do: cycles, unknown refs, odd strings, dups."""
    n = draw(st.integers(1, 7))
    ids = [draw(WEIRD_TEXT | st.sampled_from([f"t{i}" for i in range(n)])) for _ in range(n)]
    plan = []
    for i in range(n):
        deps = draw(st.lists(st.sampled_from(ids) | st.integers(-1, n + 2) | WEIRD_TEXT, max_size=3))
        item = {draw(st.sampled_from(["id", "name", "title"])): ids[i],
                draw(st.sampled_from(["requirement", "description", "task", "text"])): draw(WEIRD_TEXT | SCALARS),
                draw(st.sampled_from(["dependencies", "deps", "prev", "next", "children"])): deps}
        if draw(st.booleans()):
            item["agent"] = draw(SCALARS)
        plan.append(item)
    if draw(st.booleans()):
        plan.append(dict(draw(st.sampled_from(plan))))  # an exact duplicate
    wrap = draw(st.sampled_from(["bare", "subtasks", "steps", "paper", "nodes_edges", "text"]))
    if wrap == "paper":
        return {str(item.get("id", item.get("name", item.get("title")))): item for item in plan}
    if wrap == "nodes_edges":
        return {"nodes": plan, "edges": draw(st.lists(st.lists(st.sampled_from(ids) | SCALARS, max_size=3), max_size=6))}
    if wrap == "text":
        return "Sure, here it is:\n```json\n" + json.dumps({"subtasks": plan}) + "\n```"
    return plan if wrap == "bare" else {wrap: plan}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_plans())
def test_mutated_plans_are_repaired_or_refused(obj):
    check(obj)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | st.builds(lambda p, o, s: p + json.dumps(o) + s, st.text(max_size=20), JSONISH, st.text(max_size=20)))
def test_any_text_is_a_valid_dag_or_a_plan_error(text):
    check(text)
