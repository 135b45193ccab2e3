"""A slow local server is not a dead one (issue 34): calls to a server the user runs are
queued on our side to its slots, timed on progress, closed when abandoned, and fail with
a line that says what happened. The loopback plays the local server: slots, a slow but
steady stream, a stalled one, and the seconds it spent on answers nobody read."""

import asyncio
import json
import io
import socket
import time

import pytest

import flowmagic
from flowmagic.cli.progress import Progress
from flowmagic.errors import EndpointError
from flowmagic.flow import Flow
from flowmagic.llm import queue as server_queue
from flowmagic.llm.endpoints import Endpoint
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

WORDS = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(autouse=True)
def local_by_address(monkeypatch):
    """The loopback is a local server again, by its address (conftest makes it hosted)."""
    monkeypatch.delenv("FLOWMAGIC_SELF_HOSTED", raising=False)
    server_queue.forget()
    yield
    server_queue.forget()


def eight_wide():
    return {"nodes": [{"id": f"w{i}", "requirement": f"summarise part {i} of the notes"}
                      for i in range(8)], "edges": []}


def chat_requests(server):
    return [r for r in server.requests if r["path"].endswith("/chat/completions")]


@pytest.mark.parametrize("url, local", [
    ("http://127.0.0.1:8080/v1", True), ("http://localhost:11434/v1", True),
    ("http://[::1]:8000/v1", True), ("http://192.168.1.20:8000/v1", True),
    ("http://10.0.0.7/v1", True), ("http://gpu-box.local:1234/v1", True),
    ("https://api.openai.com/v1", False), ("http://8.8.8.8:8000/v1", False),
    ("https://my-vllm.example.com/v1", False)])
def test_what_counts_as_local(url, local, monkeypatch):
    assert Endpoint("x", url, "m").self_hosted is local
    assert Endpoint("x", url, "m", hosting="hosted").self_hosted is False
    assert Endpoint("x", url, "m", hosting="local").self_hosted is True
    monkeypatch.setenv("FLOWMAGIC_SELF_HOSTED", "1")
    assert Endpoint("x", url, "m").self_hosted is True
    monkeypatch.setenv("FLOWMAGIC_SELF_HOSTED", "0")
    assert Endpoint("x", url, "m").self_hosted is False
    assert Endpoint("local", "embedded", "m", local=True).self_hosted is True


def test_eight_parallel_nodes_on_a_one_slot_slow_server_each_get_one_attempt():
    # ~0.5 s of steady writing per answer: the last of 8 sent at once would wait ~4 s on
    # the server, past the 2 s bound, and be sent again while its first copy still runs.
    with LoopbackServer(slots=1, latency=0.05, stream_s=0.05) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm(timeout=2.0)
        llm.first_token_s, llm.stall_s = 2.0, 1.0
        flow = Flow.from_dict(eight_wide(), task="summarise the notes", llm=llm,
                              consolidate=False, concurrency=8)
        events = []
        flow.subscribe(events.append)
        run(flow.arun, llm)
        stats = server.stats()
    assert [n.status for n in flow.workflow.nodes.values()] == ["done"] * 8
    assert [r["attempt"] for r in chat_requests(server)] == [0] * 8   # each asked once
    assert stats["max_in_flight"] == 1 and stats["slots"] == 1
    assert stats["abandoned"] == 0
    ahead = [e["ahead"] for e in events if e["kind"] == "waiting" and e["ahead"] is not None]
    assert max(ahead) == 7 and min(ahead) == 1   # the progress line's "(N ahead)"


def test_the_slots_a_server_reports_are_used_all_and_no_more():
    with LoopbackServer(slots=3, latency=0.05, stream_s=0.02) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()

        async def eight():
            await asyncio.gather(*(llm.complete(f"question {i}") for i in range(8)))
        run(eight, llm)
        assert server.max_in_flight == 3 and server.calls == 8


def test_a_stalled_stream_fails_after_the_stall_bound_and_is_not_sent_again():
    with LoopbackServer(faults={"stall": 1.0}, hang_s=30) as server:
        url = server.base_url
        flowmagic.configure(base_url=url, model="m")
        llm = fast_llm(timeout=2.0)
        llm.first_token_s, llm.stall_s = 5.0, 1.0
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            run(lambda: llm.complete(WORDS), llm)
        took = time.monotonic() - started
        assert len(chat_requests(server)) == 1
    line = str(caught.value)
    assert "\n" not in line and f"the server at {url} stalled" in line
    assert "no token for 1 s" in line and "server is up" not in line
    assert 0.9 < took < 4


def test_no_first_token_fails_with_the_busy_line():
    with LoopbackServer(faults={"hang": 1.0}, hang_s=30) as server:
        url = server.base_url
        flowmagic.configure(base_url=url, model="m")
        llm = fast_llm(timeout=2.0)
        llm.first_token_s, llm.stall_s = 1.0, 1.0
        with pytest.raises(EndpointError) as caught:
            run(lambda: llm.complete("hello"), llm)
        assert len(chat_requests(server)) == 1
    assert f"the server at {url} is busy" in str(caught.value)
    assert "no token for 1 s" in str(caught.value)


def test_a_dead_port_fails_at_once_with_the_connection_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]   # nothing listens on it once closed
    flowmagic.configure(base_url=f"http://127.0.0.1:{port}/v1", model="m", concurrency=1)
    llm = flowmagic.LLM()   # the default backoff: retries would take seconds
    started = time.monotonic()
    with pytest.raises(EndpointError) as caught:
        run(lambda: llm.complete("hello"), llm)
    assert time.monotonic() - started < 1.5
    assert str(caught.value).startswith(
        f"cannot connect to the server at http://127.0.0.1:{port}/v1 (connection refused)")


def test_an_abandoned_call_stops_the_server_generating():
    # 40 words at 0.1 s each: ~4 s of work; the caller leaves after 1 s.
    with LoopbackServer(latency=0.1, stream_s=0.1, responder=lambda body: WORDS) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()

        async def leave_early():
            call = asyncio.ensure_future(llm.complete("write forty words"))
            await asyncio.sleep(1.0)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.6)   # the server notices at its next piece
        run(leave_early, llm)
        stats = server.stats()
    assert stats["abandoned"] == 1
    assert stats["abandoned_s"] < 1.5   # not the ~4 s the whole answer takes


def test_the_progress_line_says_how_many_are_ahead():
    out = io.StringIO()
    progress = Progress(stream=out)
    progress.event({"kind": "started", "node": "b", "agent": "writer"})
    progress.event({"kind": "waiting", "node": "b", "ahead": 3})
    progress.event({"kind": "waiting", "node": "b", "ahead": 2})
    assert progress._busy("b") == "b (waiting for the model, 2 ahead)"
    progress.event({"kind": "waiting", "node": "b", "ahead": None})
    assert progress._busy("b") == "b"
    assert "b waiting for the model (3 ahead)" in out.getvalue()
    assert out.getvalue().count("waiting for the model") == 1


def test_the_panel_says_which_nodes_wait_for_the_model():
    from flowmagic.jupyter.widgets import Panel

    with LoopbackServer(slots=1, latency=0.05, stream_s=0.02) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        flow = Flow.from_dict(eight_wide(), task="summarise the notes", llm=llm,
                              consolidate=False, concurrency=8)
        panel = Panel(flow)
        panel.show_output("w7")
        said = []
        flow.subscribe(lambda e: e["kind"] == "waiting" and said.append(
            (panel.message.value, panel.output.outputs[0]["data"]["text/html"])))
        run(flow.arun, llm)
        panel.close()
    lines = [line for line, _ in said if line]
    assert any(line.startswith("waiting for the model: ") and "(1 ahead)" in line
               for line in lines)
    assert any("w7" in head and "waiting for the model (" in head for _, head in said)
    assert "waiting for the model" not in panel.message.value   # all answered


PLAN = json.dumps({"subtasks": [
    {"id": "brew", "requirement": "Say how to brew green tea.", "agent": "writer", "depends_on": []},
    {"id": "serve", "requirement": "Say how to serve it.", "agent": "writer",
     "depends_on": ["brew"]}]})


@pytest.mark.parametrize("slots, hosting, asked", [
    (1, None, 1),     # a server you run with one slot: one plan, not three queued
    (2, None, 2),     # as many as it answers at once
    (8, None, 3),     # never more than the papers' 3 unless asked
    (1, "hosted", 3),  # a hosted API answers them side by side
])
def test_k_left_out_follows_the_slots_of_a_server_you_run(slots, hosting, asked, monkeypatch):
    if hosting:
        monkeypatch.setenv("FLOWMAGIC_SELF_HOSTED", "0")
    with LoopbackServer(slots=slots, latency=0.01, responder=lambda body: PLAN) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        flow = run(lambda: flowmagic.aplan("Write a short guide to green tea", llm=llm), llm)
        plans = chat_requests(server)
    assert len(plans) == asked and len(flow.candidates) == asked
    assert flow.settings.k == asked   # what the run and its export record
    with LoopbackServer(slots=1, latency=0.01, responder=lambda body: PLAN) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        run(lambda: flowmagic.aplan("Write a short guide to green tea", k=3, llm=llm), llm)
        assert len(chat_requests(server)) == 3   # k given: asked for as given
