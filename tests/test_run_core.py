"""The run core and its recorder below the facade: a whole run written through the recorder's
five-call seam (`RunLog`) to a log that is not the SQLite store, so the loop's writes are the
seam's and nothing else's; the node events of one loop turn are one write, streamed text is
told and never written, and a log that fails holds what it could not write until the next."""

import asyncio

import pytest

from flowmagic.engine.recorder import Recorder
from flowmagic.engine.run_core import RunCore
from flowmagic.engine.run_record import RunRecord
from flowmagic.engine.run_space import RunSpace
from flowmagic.engine.scheduler import Outcome
from flowmagic.engine.tool_choice import ToolChoice
from flowmagic.errors import StoreError
from flowmagic.model.graph import Workflow
from flowmagic.model.status import RunState, Status
from flowmagic.settings import Settings


class MemoryLog:
    """A RunLog in a list: each call as it came; `fail` makes the next writes raise."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.fail = False

    def save_run(self, run_id, **row):
        self.calls.append(("save_run", run_id, row["status"], len(row["workflow"]["nodes"])))

    def write_batch(self, run_id, nodes, events, calls=(), logged=None):
        if self.fail:
            raise StoreError("the disk is full; free some space and run() again")
        self.calls.append(("write_batch", [n["id"] for n in nodes], [e[:2] for e in events]))

    def set_run_status(self, run_id, status, result=None):
        self.calls.append(("set_run_status", str(status)))

    def add_update(self, run_id, data):
        self.calls.append(("add_update", data["kind"]))

    def add_tool_call(self, run_id, node_id, *, tool, **fields):
        self.calls.append(("add_tool_call", node_id, tool))
        return len(self.calls)


def _run(tmp_path, edges, **settings):
    ids = sorted({n for e in edges for n in e})
    workflow = Workflow.from_dict({"nodes": [{"id": i, "requirement": f"do {i}"} for i in ids],
                                   "edges": [list(e) for e in edges]}, task="t")
    record = RunRecord(workflow, Settings(consolidate=False, **settings), "run-1")
    log, told = MemoryLog(), []
    recorder = Recorder(log, record, [told.append])
    # No model door and no store: a run that reached either would fail here.
    core = RunCore(record, llm=None, recorder=recorder, space=RunSpace(tmp_path, record),
                   tools=ToolChoice())
    return record, core, log, told


async def _done(node_id):
    return Outcome(ok=True, output=f"did {node_id}")


def test_a_whole_run_is_written_through_the_seam_alone(tmp_path):
    record, core, log, told = _run(tmp_path, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    state = asyncio.run(core.run(work=_done))
    assert state == RunState.DONE and record.status == RunState.DONE
    assert all(n.status == Status.DONE for n in record.workflow.nodes.values())
    kinds = [c[0] for c in log.calls]
    assert kinds[0] == "set_run_status" and kinds[-1] == "write_batch"
    assert ("set_run_status", "done") in log.calls
    written = [e for c in log.calls if c[0] == "write_batch" for e in c[2]]
    # every node's start and end, each node's state with its end, then how the run ended
    assert sorted(e for e in written if e[0] != "run") == sorted(
        [("started", i) for i in "abcd"] + [("finished", i) for i in "abcd"])
    assert {n for c in log.calls if c[0] == "write_batch" for n in c[1]} == set("abcd")
    assert [e["kind"] for e in told][-1] == "run" and len(told) == len(written)
    # b and c end in one turn, and so are written in one batch
    assert any({("finished", "b"), ("finished", "c")} <= set(c[2])
               for c in log.calls if c[0] == "write_batch")


def test_streamed_text_is_told_and_never_written(tmp_path):
    record, core, log, told = _run(tmp_path, [("a", "b")])
    core.recorder.streaming = True

    async def speaks(node_id):
        sink = core.recorder.text_sink(node_id)
        sink("hel")
        sink("lo")
        await asyncio.sleep(0)
        return Outcome(ok=True, output="hello")

    asyncio.run(core.run(work=speaks))
    assert [e["text"] for e in told if e["kind"] == "text"] == ["hel", "lo", "hel", "lo"]
    assert core.recorder.partial_output("b") == "hello"
    written = [e for c in log.calls if c[0] == "write_batch" for e in c[2]]
    assert written and not [e for e in written if e[0] == "text"]


def test_a_failing_log_stops_the_run_and_its_events_are_written_first_next_time(tmp_path):
    record, core, log, told = _run(tmp_path, [("a", "b"), ("b", "c")])
    log.fail = True
    state = asyncio.run(core.run(work=_done))
    assert state == RunState.ERROR and "the disk is full" in record.message
    assert record.workflow.nodes["a"].status == Status.DONE   # finished, held in the session
    assert record.workflow.nodes["c"].status == Status.PENDING   # nothing new started
    assert not [c for c in log.calls if c[0] == "write_batch"]
    log.fail = False
    assert asyncio.run(core.run(work=_done)) == RunState.DONE
    first = next(c for c in log.calls if c[0] == "write_batch")
    assert ("finished", "a") in first[2]   # what the failed run held, before anything new


def test_outside_a_run_a_failing_log_raises_and_keeps_the_event(tmp_path):
    record, core, log, told = _run(tmp_path, [("a", "b")])
    log.fail = True
    with pytest.raises(StoreError):
        core.recorder.emit("pruned", "a")
    assert [e["kind"] for e in told] == ["pruned"]   # told anyway
    log.fail = False
    core.recorder.emit("edited", "b")
    assert log.calls[-1] == ("write_batch", ["a", "b"], [("pruned", "a"), ("edited", "b")])
