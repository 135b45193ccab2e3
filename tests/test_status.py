"""Node and run states are enums that read as the strings they were; each node state
transition is one function (flowmagic.model.status)."""

import json
import sqlite3

import pytest

import flowmagic
from flowmagic.model import status as transition
from flowmagic.model.graph import Node, Workflow
from flowmagic.model.status import RunState, Status
from flowmagic.store import Store


def test_a_store_written_with_plain_strings_loads_as_enums_and_is_written_back_plain(tmp_path):
    """A run saved before the enums (plain strings in its rows) loads with typed states; a
    node that was running when the kernel died comes back pending, the run interrupted."""
    store = Store(tmp_path / "s.db")
    workflow = {"task": "t", "nodes": [{"id": "a", "requirement": "do a", "status": "done",
                                        "output": "A"},
                                       {"id": "b", "requirement": "do b", "status": "running",
                                        "start": 1.0, "clone": "assistant#2"},
                                       {"id": "c", "requirement": "do c", "status": "pruned"}],
                "edges": [["a", "b"]]}
    store.save_run("r1", task="t", name="old", workflow=workflow, status="running")
    flow = flowmagic.load("r1", store=store)
    states = {i: n.status for i, n in flow.workflow.nodes.items()}
    assert states == {"a": Status.DONE, "b": Status.PENDING, "c": Status.PRUNED}
    assert all(type(s) is Status for s in states.values())
    b = flow.workflow.nodes["b"]
    assert (b.start, b.clone) == (None, None)
    assert flow.status is RunState.INTERRUPTED
    flow._save_run()
    con = sqlite3.connect(tmp_path / "s.db")
    status, saved = con.execute("SELECT status, workflow FROM runs WHERE id = 'r1'").fetchone()
    assert status == "interrupted"
    assert '"status": "done"' in saved and "Status." not in saved
    assert [n["status"] for n in json.loads(saved)["nodes"]] == ["done", "pending", "pruned"]


def test_states_print_and_serialise_as_their_strings():
    node = Node("a", "do a", status="done")
    assert node.status is Status.DONE and node.status == "done"
    assert repr(node.to_dict()["status"]) == "'done'" and f"{node.status}" == "done"
    assert json.dumps({"counts": {Status.DONE: 1}}) == '{"counts": {"done": 1}}'
    assert str(RunState.BUDGET) == "budget"


def test_an_unknown_status_is_one_line():
    wf = Workflow()
    with pytest.raises(flowmagic.NodeError, match="unknown status 'weird'"):
        wf.add_node(Node("a", "x", status="weird"))


def _node(**fields) -> Node:
    node = Node("a", "do a")
    for key, value in fields.items():
        setattr(node, key, value)
    return node


# transition, arguments, node before, the fields after
TRANSITIONS = [
    (transition.start, ("assistant#2",), {},
     {"status": Status.RUNNING, "clone": "assistant#2", "end": None, "error": None}),
    (transition.finish, ("out", {"ran": True}), {"status": Status.RUNNING, "stale": True,
                                                  "error": "old"},
     {"status": Status.DONE, "output": "out", "execution": {"ran": True}, "stale": False,
      "error": None}),
    (transition.fail, ("boom",), {"status": Status.RUNNING, "output": "partial"},
     {"status": Status.FAILED, "error": "boom", "output": "partial"}),
    (transition.requeue, (), {"status": Status.RUNNING, "start": 1.0, "end": 2.0,
                              "clone": "x#2", "output": "kept"},
     {"status": Status.PENDING, "start": None, "end": None, "clone": None, "output": "kept"}),
    (transition.reset, (), {"status": Status.DONE, "output": "o", "error": "e", "start": 1.0,
                            "end": 2.0, "stale": True, "execution": {"ran": True}},
     {"status": Status.PENDING, "output": None, "error": None, "start": None, "end": None,
      "stale": False, "execution": None}),
    (transition.mark_stale, (), {"status": Status.FAILED, "error": "e"},
     {"status": Status.PENDING, "error": None, "stale": True}),
    (transition.prune, ({"parents": ["p"]},), {"status": Status.DONE},
     {"status": Status.PRUNED, "pruned_from": {"status": Status.DONE, "parents": ["p"]}}),
    (transition.unprune, (), {"status": Status.PRUNED, "pruned_from": {"status": "failed"}},
     {"status": Status.FAILED, "pruned_from": None}),
    (transition.unprune, (), {"status": Status.PRUNED, "pruned_from": {"status": "running"}},
     {"status": Status.PENDING, "pruned_from": None}),
    (transition.unprune, (), {"status": Status.PRUNED, "pruned_from": None},
     {"status": Status.PENDING}),
]


@pytest.mark.parametrize("move, args, before, after", TRANSITIONS,
                         ids=[f"{t[0].__name__}-{i}" for i, t in enumerate(TRANSITIONS)])
def test_each_transition_sets_what_it_says(move, args, before, after):
    node = _node(**before)
    move(node, *args)
    assert {k: getattr(node, k) for k in after} == after
    assert type(node.status) is Status


def test_start_stamps_the_time_and_clears_the_last_end():
    node = _node(end=5.0)
    transition.start(node)
    assert node.start is not None and node.start > 5.0 and node.end is None
