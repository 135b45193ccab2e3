"""The control panel: each button, clicked from code, changes the Flow as its method does.

Two identical flows against the same loopback server: one is driven by the panel, the
other by the Flow methods, and their workflows must end up equal (timings aside).
"""

import asyncio

import pytest

import flowmagic
from flowmagic.endpoints import PRICES
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.loopback import LoopbackServer
from flowmagic.store import Store
from flowmagic.widgets import Panel, model_choices

PLAN = {"nodes": [{"id": "load", "requirement": "load the data", "agent": "coder"},
                  {"id": "stats", "requirement": "summarise each column", "agent": "analyst"},
                  {"id": "plot", "requirement": "plot two relationships", "agent": "coder"},
                  {"id": "report", "requirement": "write the report", "agent": "writer"}],
        "edges": [["load", "stats"], ["load", "plot"], ["stats", "report"], ["plot", "report"]]}
_VOLATILE = {"start", "end", "attempts", "clone"}


@pytest.fixture
def server():
    with LoopbackServer(responder=lambda body: "Result with **bold** words and more words") as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        yield srv


@pytest.fixture
def slow_server():
    with LoopbackServer(latency=0.4) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        yield srv


def make_flow(store=None, **settings):
    """A flow on the test's store, or on its own (so one flow's cache cannot serve another)."""
    settings.setdefault("consolidate", False)
    llm = LLM(store=Store(store) if store else None, backoff_base=0.01)
    return Flow.from_dict(PLAN, task="analyse sales.csv", llm=llm, **settings)


def state(flow):
    wf = flow.workflow.to_dict()
    nodes = [{k: v for k, v in n.items() if k not in _VOLATILE} for n in wf["nodes"]]
    return {"nodes": nodes, "edges": sorted(map(tuple, wf["edges"])), "status": flow.status}


def pick(panel, node, model=None):
    panel.node_picker.value = node
    if model is not None:
        panel.model_picker.value = model


def test_buttons_match_methods(server, tmp_path):
    by_panel, by_code = make_flow(tmp_path / "panel.db"), make_flow(tmp_path / "code.db")
    panel = Panel(by_panel)
    steps = [
        (lambda: panel.step_button.click(), lambda: by_code.step()),
        (lambda: (pick(panel, "plot"), panel.prune_button.click()),
         lambda: by_code.prune("plot")),
        (lambda: (pick(panel, "report", "gpt-4o-mini"), panel.downgrade_button.click()),
         lambda: by_code.downgrade("report", "gpt-4o-mini")),
        (lambda: panel.run_button.click(), lambda: by_code.run()),
        (lambda: (pick(panel, "stats"), panel.rerun_button.click()),
         lambda: by_code.rerun("stats")),
    ]
    for via_panel, via_code in steps:
        via_panel()
        via_code()
        assert state(by_panel) == state(by_code)
    assert panel.message.value == ""
    wf = by_panel.workflow
    assert wf.nodes["plot"].status == "pruned" and ("load", "report") in wf.graph.edges
    assert wf.nodes["report"].model == "gpt-4o-mini"
    assert wf.nodes["report"].downgraded_from == "default"
    assert len(wf.nodes["stats"].attempts) == 2 and wf.nodes["report"].status == "done"
    panel.close()


def test_enabled_buttons_follow_the_state(server):
    flow = make_flow()
    panel = Panel(flow)
    disabled = lambda: {n: getattr(panel, f"{n}_button").disabled for n in  # noqa: E731
                        ("run", "step", "pause", "stop", "prune", "downgrade", "rerun", "output")}
    pick(panel, "load", "m")
    assert disabled() == {"run": False, "step": False, "pause": True, "stop": True,
                          "prune": False, "downgrade": False, "rerun": True, "output": True}
    assert panel.progress.description == "0/4 done" and panel.progress.value == 0
    panel.step_button.click()
    assert not disabled()["rerun"] and not disabled()["output"]   # load is done now
    assert panel.progress.value == 1 and panel.progress.description == "1/4 done"
    pick(panel, "plot")
    panel.prune_button.click()
    assert disabled()["prune"] and disabled()["rerun"] and disabled()["downgrade"]
    assert panel.progress.description == "1/3 done"
    pick(panel, "report", "m")   # its model already: nothing to downgrade to
    flow.downgrade("report", "m")
    panel.refresh()
    assert disabled()["downgrade"]
    panel.run_button.click()
    assert disabled()["run"] and disabled()["step"] and panel.progress.bar_style == "success"
    assert "still to run" not in panel.meter.value and "tokens" in panel.meter.value
    panel.close()


def test_drawing_follows_the_flow(server):
    flow = make_flow()
    panel = Panel(flow)
    assert 'id="node&#45;plot"' in panel.drawing.value and panel.drawing.value.startswith("<svg")
    before = panel.drawing.value
    flow.prune("plot")   # from code: the panel follows through subscribe()
    assert panel.drawing.value != before and 'class="node pruned"' in panel.drawing.value
    assert panel.node_picker.options == ("load", "stats", "plot", "report")
    panel.close()
    after_close = panel.drawing.value
    flow.prune("stats")
    assert panel.drawing.value == after_close


def test_show_output_renders_markdown(server):
    flow = make_flow()
    panel = Panel(flow)
    panel.step_button.click()
    pick(panel, "load")
    panel.output_button.click()
    (shown,) = panel.output.outputs
    assert shown["data"]["text/markdown"].endswith(flow.workflow.nodes["load"].output)
    assert "**load** (coder, done)" in shown["data"]["text/markdown"]
    assert flow.streaming
    panel.close()


def test_streamed_text_appears_as_it_arrives(server):
    flow = make_flow()
    panel = Panel(flow)
    panel.show_output("load")
    seen = []
    flow.subscribe(lambda e: e["kind"] == "text" and seen.append(
        panel.output.outputs[0]["data"]["text/plain"]))
    flow.step()
    final = flow.workflow.nodes["load"].output
    assert len(seen) > 3 and seen[0] != final and final.startswith(seen[0])
    assert seen[-1] == final == panel.output.outputs[0]["data"]["text/plain"]
    usage = flow.cost()["rows"]   # usage was requested in the stream
    assert any(r["node_id"] == "load" and r["output_tokens"] > 0 for r in usage)
    panel.close()


def test_pause_resume_stop_while_running(slow_server):
    async def scenario():
        flow = make_flow()
        panel = Panel(flow)
        try:
            await steer(flow, panel)
        finally:
            flow.stop()
            await flow.wait()
            panel.close()
            await flow.llm.aclose()

    async def steer(flow, panel):
        panel.run_button.click()   # a task on this loop: the click returns at once
        assert flow.busy and panel.run_button.disabled and not panel.stop_button.disabled
        await asyncio.sleep(0.1)
        assert flow.workflow.nodes["load"].status == "running"
        # A button clicked when it does not apply is one line in the panel, not a traceback.
        pick(panel, "load")
        assert panel.prune_button.disabled
        panel.prune_button.click()
        assert "is running; stop() the flow first" in panel.message.value
        panel.pause_button.click()
        await flow.wait()
        assert flow.status == "paused" and panel.pause_button.description == "Resume"
        assert flow.workflow.nodes["load"].status == "done"
        panel.pause_button.click()   # Resume
        await asyncio.sleep(0.1)
        assert flow.busy
        panel.stop_button.click()
        await flow.wait()
        assert flow.status == "stopped"
        assert {n.status for n in flow.workflow.nodes.values()} == {"done", "pending"}
        assert panel.stop_button.disabled and not panel.run_button.disabled

    asyncio.run(scenario())


def test_model_choices_lists_endpoints_then_prices(server):
    flowmagic.configure(name="cheap", base_url=server.base_url, model="tiny")
    choices = model_choices()
    values = [v for _, v in choices]
    assert values[:2] == ["m", "cheap:tiny"]
    priced = values[2:]
    assert set(priced) == set(PRICES) and len(values) == len(set(values))
    outs = [PRICES[v][1] for v in priced]
    assert outs == sorted(outs)


def test_warnings_and_update_log_are_shown(server):
    flow = make_flow()
    flow.workflow.warnings.append("dropped a link to <unknown>")
    flow.update_log.append({"time": 0, "strategy": "on-failure", "trigger": ["stats"],
                            "no_change": True})
    panel = Panel(flow)
    assert "dropped a link to &lt;unknown&gt;" in panel.warnings.value
    assert "update after stats: no change" in panel.log.value
    bundle = panel._repr_mimebundle_()
    assert bundle["text/plain"].startswith("flow 'flow' (planned)")
    assert "application/vnd.jupyter.widget-view+json" in bundle
    panel.close()


def test_a_run_that_fails_is_one_line_in_the_panel(server):
    import socket

    with socket.socket() as sock:   # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    flowmagic.configure(name="dead", base_url=f"http://127.0.0.1:{port}/v1", model="x")

    async def scenario():
        # The node runs on the loopback; the final consolidation goes to the dead endpoint.
        plan = {"nodes": [{"id": "only", "requirement": "say hi", "model": "m"}], "edges": []}
        flow = Flow.from_dict(plan, task="t", llm=LLM(backoff_base=0.001, max_retries=1),
                              model="dead")
        panel = Panel(flow)
        try:
            panel.run_button.click()
            for _ in range(500):   # the panel awaits the run and shows how it ended
                if panel.message.value:
                    break
                await asyncio.sleep(0.02)
            assert flow.workflow.nodes["only"].status == "done" and not flow.busy
            # every node is kept; the missing summary is one line that says what to do
            assert "consolidation failed" in panel.message.value
            assert "run() again" in panel.message.value and "\n" not in panel.message.value
            assert panel.stop_button.disabled
        finally:
            panel.close()
            await flow.llm.aclose()

    asyncio.run(scenario())


def test_rerun_waits_while_a_run_consolidates(slow_server):
    async def scenario():
        flow = make_flow(consolidate=True)
        panel = Panel(flow)
        try:
            panel.run_button.click()
            while flow.counts().get("done") != 4:
                await asyncio.sleep(0.02)
            pick(panel, "load")
            assert flow.busy and panel.rerun_button.disabled   # the result is being written
            await flow.wait()
            panel.refresh()
            assert flow.result and not panel.rerun_button.disabled
        finally:
            panel.close()
            await flow.llm.aclose()

    asyncio.run(scenario())
