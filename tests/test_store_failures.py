"""A store that fails during a run (issue 28, finding 9): a full disk, a locked database.

A real SQLite store on a real file system, made to fail after the second node has finished,
under a real Flow on the loopback server. The run stops with one line; what could not be
written is held in memory and said to be; the run is never reported done, in memory or in
the store; an export still has every finished node; and run() again, once the store works,
stores what was held first and pays for no finished node twice.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.store import Store, get_store
from flowmagic.testing.loopback import LoopbackServer

pytestmark = pytest.mark.timeout(120)

N = 12
PLAN = {"nodes": [{"id": f"n{i:02d}", "requirement": f"write part {i}"} for i in range(N)],
        "edges": []}


class FullDisk:
    """The store on a 4 MiB tmpfs of its own, filled up by a file when `fail()` is called."""

    def __init__(self, monkeypatch):
        if os.geteuid() != 0:
            pytest.skip("mounting a small file system takes root (CI runs as root)")
        self.top = tempfile.mkdtemp(prefix="fm-full-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", self.top], check=True)
        monkeypatch.setenv("FLOWMAGIC_HOME", os.path.join(self.top, "home"))
        self.filler = os.path.join(self.top, "filler")
        self.says = "full"

    def fail(self) -> None:
        with open(self.filler, "wb", buffering=0) as fh:
            try:
                while fh.write(b"x" * 65536):
                    pass
            except OSError:   # No space left on device: what the store meets next
                pass

    def mend(self) -> None:
        os.unlink(self.filler)

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.top], check=False)
        os.rmdir(self.top)


class Locked:
    """Another process's connection holds the store's write lock from `fail()` on."""

    def __init__(self, monkeypatch):
        self.db: sqlite3.Connection | None = None
        self.says = "locked"

    def fail(self) -> None:
        self.db = sqlite3.connect(get_store().path, isolation_level=None)
        self.db.execute("BEGIN EXCLUSIVE")

    def mend(self) -> None:
        self.db.execute("ROLLBACK")
        self.db.close()

    def close(self) -> None:
        pass


@pytest.mark.parametrize("trouble", [FullDisk, Locked], ids=["disk full", "locked"])
def test_a_store_failing_mid_run_stops_it_and_loses_no_finished_node(trouble, monkeypatch,
                                                                     capsys, caplog, tmp_path):
    store_trouble = trouble(monkeypatch)
    try:
        with LoopbackServer(latency=0.02, responder=lambda body: "part " * 100) as server:
            flowmagic.configure(base_url=server.base_url, model="m")
            flow = Flow.from_dict(PLAN, task="t", consolidate=False, update="off",
                                  concurrency=2, llm=LLM(backoff_base=0.01))
            finished: list[str] = []

            def on_event(event: dict) -> None:
                if event["kind"] == "finished":
                    finished.append(event["node"])
                    if len(finished) == 2:
                        store_trouble.fail()

            flow.subscribe(on_event)
            flow.run()
            _check_stopped(flow, store_trouble.says, capsys, caplog)
            done = {i for i, n in flow.workflow.nodes.items() if n.status == "done"}
            paid = len(server.requests)
            assert len(done) >= 2 and paid == len(done)   # nothing ran after the failure ended
            stored = Store(get_store().path).load_run(flow.run_id)   # as a restart would see it
            kept = {n["id"] for n in stored["workflow"]["nodes"] if n.get("status") == "done"}
            assert stored["status"] != "done" and kept < done
            for name in done - kept:   # held: named in the line, in memory, in the export
                assert name in flow.message or "more" in flow.message
            assert "flow.to_notebook(path) has them" in flow.message
            notebook = Path(flow.to_notebook(tmp_path / "held.ipynb")).read_text()
            assert all(flow.workflow.nodes[i].output in notebook for i in done)

            store_trouble.mend()
            flow.run()
            assert flow.status == "done" and flow.counts() == {"done": N}, flow.message
            assert len(server.requests) == N   # no finished node was paid for twice
        stored = Store(get_store().path).load_run(flow.run_id)
        assert stored["status"] == "done"
        assert {n["id"]: n["status"] for n in stored["workflow"]["nodes"]} == dict.fromkeys(
            flow.workflow.nodes, "done")
    finally:
        store_trouble.close()


def _check_stopped(flow: Flow, says: str, capsys, caplog) -> None:
    """One line says the run stopped, why, and how many finished nodes are held."""
    assert flow.status == "error", (flow.status, flow.counts())
    assert "\n" not in flow.message and says in flow.message, flow.message
    assert "held in this session only" in flow.message and "run() again" in flow.message
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("flowmagic:")] == [
        f"flowmagic: {flow.message}"], err
    assert "Exception in callback" not in err and "Traceback" not in err, err
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
