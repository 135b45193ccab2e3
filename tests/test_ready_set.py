"""The ready set alone, as plain data (no event loop): which nodes can start, in what order,
after which are done, and what an edit of the graph does to that."""

import pytest

from flowmagic.engine.ready_set import ReadySet
from flowmagic.model.graph import Workflow
from flowmagic.model.status import Status


def workflow(edges, nodes=()):
    ids = sorted({n for e in edges for n in e} | set(nodes))
    return Workflow.from_dict({"nodes": [{"id": i, "requirement": f"do {i}"} for i in ids],
                               "edges": [list(e) for e in edges]}, task="t")


def drain(ready, wf):
    out = []
    while (node_id := ready.get_ready(wf)) is not None:
        out.append(node_id)
    return out


@pytest.mark.parametrize("edges, nodes, finish, expected", [
    # (edges, lone nodes, nodes finished in this order, what get_ready hands out after each)
    ([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], (), ["a", "b", "c", "d"],
     [["a"], ["b", "c"], [], ["d"], []]),
    ([("a", "c"), ("b", "c")], (), ["b", "a", "c"], [["a", "b"], [], ["c"], []]),
    ([], ("x", "y", "z"), ["y"], [["x", "y", "z"], []]),
    ([("a", "b"), ("b", "c"), ("a", "c")], (), ["a", "b"], [["a"], ["b"], ["c"]]),
], ids=["diamond", "join", "flat", "chain-with-shortcut"])
def test_a_node_is_handed_out_once_its_last_parent_is_done(edges, nodes, finish, expected):
    wf = workflow(edges, nodes)
    ready = ReadySet()
    ready.prepare(wf)
    got = [drain(ready, wf)]
    for node_id in finish:
        wf.nodes[node_id].status = Status.DONE
        ready.done(wf, node_id)
        got.append(drain(ready, wf))
    assert got == expected


def test_prepare_again_after_an_edit_counts_from_the_graph():
    """A node finished, then reset by a rerun: its child waits again; a pruned node is
    never handed out; a node marked ready but not running goes back to pending."""
    wf = workflow([("a", "b"), ("b", "c")], ("p",))
    wf.nodes["a"].status = Status.DONE
    wf.nodes["p"].status = Status.PRUNED
    wf.nodes["c"].status = Status.READY
    ready = ReadySet()
    ready.prepare(wf)
    assert ready.waiting == {"a": 0, "b": 0, "c": 1}
    assert wf.nodes["c"].status == Status.PENDING
    assert drain(ready, wf) == ["b"]
    wf.nodes["a"].status = Status.PENDING   # a rerun of a
    ready.prepare(wf)
    assert drain(ready, wf) == ["a"]


def test_a_running_node_is_not_handed_out_again():
    wf = workflow([], ("a", "b"))
    ready = ReadySet()
    ready.prepare(wf, running=["a"])
    assert drain(ready, wf) == ["b"]


def test_a_queued_node_an_edit_made_unready_is_skipped():
    wf = workflow([], ("a", "b", "c"))
    ready = ReadySet()
    ready.prepare(wf)
    wf.nodes["a"].status = Status.PRUNED
    assert drain(ready, wf) == ["b", "c"]


def test_keep_only_hands_out_the_chosen_ready_nodes_in_their_order():
    wf = workflow([("a", "d")], ("b", "c"))
    ready = ReadySet()
    ready.prepare(wf)
    ready.keep_only(["c", "d", "a"])   # d is not ready: left out
    assert drain(ready, wf) == ["c", "a"]


def test_clone_numbers_are_the_lowest_free_slot():
    ready = ReadySet()
    assert [ready.take_slot(n, "coder") for n in ("a", "b", "c")] == [1, 2, 3]
    ready.free_slot("b")
    ready.free_slot("a")
    assert ready.take_slot("d", "coder") == 1
    assert ready.take_slot("e", "writer") == 1
    assert ready.take_slot("f", "coder") == 2
    ready.free_slot("unknown")   # a node that never took a slot: nothing to free
