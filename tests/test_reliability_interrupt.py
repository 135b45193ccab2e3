"""Reliability, part 3 (issue 9): interrupting a run and resuming it in a new process.

A child process runs a 12-node flow against a loopback server this test started. After two
nodes finished, the run is interrupted one of four ways: `flow.stop()` from an event
callback (a Stop button), SIGINT (Ctrl-C in a terminal), two SIGINTs in quick succession,
or SIGKILL (the kernel dies). Then:

- the store is consistent: every done node has its output; after stop/Ctrl-C no node is
  left "running" and every node that started has a matching end event; after a kill the
  store may hold "running" rows, which `load()` turns back into pending;
- a second process resumes with `flowmagic.load(name).run()`, finishes every node, and
  never asks the model for a node that had already finished.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from flowmagic.testing.loopback import LoopbackServer
from flowmagic.store import Store

from conftest import ROOT

pytestmark = pytest.mark.timeout(180)

PLAN = {"nodes": [{"id": f"n{i}", "requirement": f"write part {i}"} for i in range(12)],
        "edges": [[f"n{i}", f"n{i + 4}"] for i in range(8)] + [["n0", "n5"], ["n6", "n11"]]}

CHILD = r"""
import json, sys
from flowmagic.flow import Flow
from flowmagic.llm import LLM

mode, plan = sys.argv[1], json.loads(sys.argv[2])
flow = Flow.from_dict(plan, task="write a report in twelve parts", name="interrupted",
                      consolidate=False, llm=LLM(backoff_base=0.01))
finished = []

def on_event(event):
    if event["kind"] == "finished":
        finished.append(event["node"])
        print("finished", event["node"], flush=True)
        if mode == "stop" and len(finished) == 2:
            flow.stop()

flow.subscribe(on_event)
try:
    flow.run()
    print("ended", flow.status, flush=True)
except KeyboardInterrupt:
    print("interrupted", flow.status, flush=True)
"""

RESUME = r"""
import flowmagic
flow = flowmagic.load("interrupted")
before = flow.status
flow.run()
print(before, flow.status, sum(n.status == "done" for n in flow.workflow.nodes.values()))
"""


def node_of(body) -> str | None:
    if not isinstance(body, dict):
        return None
    for message in body.get("messages", []):
        found = re.search(r"Your subtask \((\w+)\)", str(message.get("content")))
        if found:
            return found.group(1)
    return None


def asked(server: LoopbackServer, since: int = 0) -> list[str]:
    return [n for n in (node_of(r["body"]) for r in server.requests[since:]) if n]


def latency(body) -> float:
    """0.2-0.9 s by node, so several nodes are in flight whenever the run is interrupted."""
    node = node_of(body)
    return 0.2 + 0.1 * (int(node[1:]) % 8) if node else 0.05


class Child:
    """The interrupted process, with its stdout read line by line."""

    def __init__(self, mode: str, env: dict):
        self.stderr = tempfile.TemporaryFile()   # a file: nobody has to drain it
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, json.dumps(PLAN)],
                                     env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_finished(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(line.startswith("finished") for line in self.out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"the child did not finish {n} nodes: {self.out}"
            try:
                self.out.append(self.lines.get(timeout=left))
            except queue.Empty:
                continue

    def end(self, timeout: float = 60.0) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        self.proc.stdout.close()
        while not self.lines.empty():
            self.out.append(self.lines.get())
        self.stderr.seek(0)
        stderr = self.stderr.read().decode("utf-8", "replace")
        self.stderr.close()
        return self.proc.returncode, stderr


def interrupt(mode: str, env: dict) -> tuple[Child, int, str]:
    child = Child(mode, env)
    try:
        child.wait_finished(2)
        if mode == "sigint":
            child.proc.send_signal(signal.SIGINT)
        elif mode == "double-sigint":
            child.proc.send_signal(signal.SIGINT)
            time.sleep(0.01)
            child.proc.send_signal(signal.SIGINT)
        elif mode == "kill":
            child.proc.kill()
        code, stderr = child.end()
    except BaseException:
        child.proc.kill()
        child.end()
        raise
    return child, code, stderr


def stored_state(home) -> tuple[dict, dict, list]:
    store = Store(home / "flowmagic.db")
    try:
        run = store.load_run("interrupted")
        nodes = {n["id"]: n for n in run["workflow"]["nodes"]}
        return run, nodes, store.events(run["id"])
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["stop", "sigint", "double-sigint", "kill"])
def test_interrupted_run_is_consistent_and_resumes_without_redoing_finished_nodes(
        mode, flowmagic_home):
    with LoopbackServer(latency=latency) as server:
        env = {**os.environ, "FLOWMAGIC_HOME": str(flowmagic_home),
               "FLOWMAGIC_BASE_URL": server.base_url, "FLOWMAGIC_MODEL": "m"}
        child, code, stderr = interrupt(mode, env)
        run, nodes, events = stored_state(flowmagic_home)
        done = {i for i, n in nodes.items() if n["status"] == "done"}
        assert len(done) >= 2 and len(done) < len(PLAN["nodes"]), (mode, done)
        for node_id in done:   # nothing finished was lost on the way to the store
            assert nodes[node_id]["output"].startswith("Loopback reply to:"), node_id
        printed = {line.split()[1] for line in child.out if line.startswith("finished")}
        assert printed <= done   # every node the UI heard of as finished is in the store

        if mode in ("stop", "sigint"):
            assert code == 0 and "Traceback" not in stderr, stderr
            assert child.out[-1] in ("ended stopped", "interrupted stopped"), child.out
            assert run["status"] == "stopped"
            assert "running" not in {n["status"] for n in nodes.values()}
            assert all(n["start"] is None for n in nodes.values() if n["status"] == "pending")
            open_nodes = set()
            for event in events:   # every start has its end: finished, failed or stopped
                if event["kind"] == "started":
                    open_nodes.add(event["node_id"])
                elif event["kind"] in ("finished", "failed", "stopped"):
                    open_nodes.discard(event["node_id"])
            assert not open_nodes, open_nodes
        if mode == "kill":
            assert code == -signal.SIGKILL

        first = asked(server)
        resumed = subprocess.run([sys.executable, "-c", RESUME], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        before, after, count = resumed.stdout.split()
        assert after == "done" and int(count) == len(PLAN["nodes"])
        if mode == "kill":
            assert before == "interrupted"   # the store still said "running"
        again = asked(server)[len(first):]
        assert not done & set(again), done & set(again)
        assert sorted(set(first) | set(again)) == sorted(n["id"] for n in PLAN["nodes"])
        _, final, _ = stored_state(flowmagic_home)
        assert {n["status"] for n in final.values()} == {"done"}
        for node_id in done:   # the outputs from before the interruption were kept as they were
            assert final[node_id]["output"] == nodes[node_id]["output"]
            assert final[node_id]["end"] == nodes[node_id]["end"]
