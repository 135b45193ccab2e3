"""The control panel: each button, clicked from code, changes the Flow as its method does.

Two identical flows against the same loopback server: one is driven by the panel, the
other by the Flow methods, and their workflows must end up equal (timings aside).
"""

import asyncio
import json
import time

import pytest

import flowmagic
from flowmagic.llm.endpoints import PRICES
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.store import Store
from flowmagic.jupyter.widgets import Panel, model_choices
from flowmagic.view.safe import markdown_html, model_bundle

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
        (lambda: panel.unprune_button.click(), lambda: by_code.unprune("plot")),
        (lambda: panel.prune_button.click(), lambda: by_code.prune("plot")),
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
    assert panel.message.value == "running again: <b>stats</b>"   # no error; the last click
    wf = by_panel.workflow
    # report read plot, which read load: pruning plot links load -> report (it carries data)
    assert wf.nodes["plot"].status == "pruned"
    assert sorted(wf.graph.edges) == [("load", "report"), ("load", "stats"), ("stats", "report")]
    assert wf.nodes["report"].model == "gpt-4o-mini"
    assert wf.nodes["report"].downgraded_from == "default"
    assert len(wf.nodes["stats"].attempts) == 2 and wf.nodes["report"].status == "done"
    panel.close()


def test_a_click_from_the_page_acts_on_the_choices_it_carries(server):
    """The page sends a click with the node and model it shows; the kernel may not have
    those choices yet (ipywidgets holds a dropdown's change back while an earlier one is
    unanswered), and must act on them, not on the choices it had."""
    flow = make_flow()
    panel = Panel(flow)
    pick(panel, "load", "m")
    controls = panel.choice_controls
    controls.receive({"action": "prune", "choices": {"node": "plot"}})
    assert flow.workflow.nodes["plot"].status == "pruned"
    assert flow.workflow.nodes["load"].status == "pending"
    assert panel.message.value == "pruned <b>plot</b>"
    controls.receive({"action": "downgrade", "choices": {"node": "report", "model": "gpt-4o-mini"}})
    assert flow.workflow.nodes["report"].model == "gpt-4o-mini"
    assert flow.workflow.nodes["load"].model is None
    assert panel.node_picker.value == "load"   # the page's own change comes after the click
    # a node the flow no longer has (a stale page): one red line, nothing changes
    controls.receive({"action": "prune", "choices": {"node": "gone"}})
    assert "gone" in panel.message.value and "flowmagic:" in panel.message.value
    assert [n.status for n in flow.workflow.nodes.values()].count("pruned") == 1
    controls.receive({"action": "no such button"})   # ignored, as is anything malformed
    controls.receive(["prune"])
    assert [n.status for n in flow.workflow.nodes.values()].count("pruned") == 1
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
    assert "· model m (default)" in panel.node_info.value   # the name, not just "default"
    panel.step_button.click()
    assert not disabled()["rerun"] and not disabled()["output"]   # load is done now
    assert panel.progress.value == 1 and panel.progress.description == "1/4 done"
    pick(panel, "plot")
    panel.prune_button.click()
    assert panel.message.value == "pruned <b>plot</b>"   # which node the click acted on
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
    output = flow.workflow.nodes["load"].output
    assert shown["data"] == model_bundle(output, head="**load** (coder, done)\n\n")
    assert "<strong>load</strong> (coder, done)" in shown["data"]["text/html"]
    assert "text/markdown" not in shown["data"]   # model text is shown as sanitized HTML only
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
    # every priced chat model; no embedding model (it cannot run a node)
    assert set(priced) == {m for m in PRICES if "embed" not in m} and len(values) == len(set(values))
    assert "text-embedding-3-small" in PRICES and "text-embedding-3-small" not in values
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
            # The panel hears of node events after they are stored (later in the loop turn),
            # so wait for what it shows, not for the flow's own counts.
            while panel.progress.value != 4:
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


# -- slimming from the panel (issue 7) -------------------------------------------------------------
# lookup finds a fact, relay only adds chatter, answer (the sink) lists the facts it is given:
# pruning relay and downgrading lookup keep the score; pruning lookup loses the fact.
SLIM_PLAN = {"nodes": [{"id": "lookup", "requirement": "LOOKUP {{input}}", "model": "big"},
                       {"id": "relay", "requirement": "RELAY the facts", "model": "big"},
                       {"id": "answer", "requirement": "ANSWER with every fact", "model": "small"}],
             "edges": [["lookup", "relay"], ["relay", "answer"]]}
EXAMPLES = [{"input": w, "expected": f"FACT:{w}"} for w in ("paris", "oslo", "lima")]


def fact_found(result, example):
    return float(example["expected"] in (result or ""))


def slim_responder(body):
    import re

    user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
    node, requirement = re.search(r"Your subtask \((\w+)\):\n(.*)", user).groups()
    facts = " ".join(re.findall(r"FACT:\w+", user.split("Your subtask", 1)[1]))
    if node == "lookup":
        return f"FACT:{requirement.split()[-1]}" + " (looked up at length)" * 3
    return f"chatter about the weather; {facts}" if node == "relay" else f"facts: {facts}"


@pytest.fixture
def slim_server():
    with LoopbackServer(responder=slim_responder) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flowmagic.configure(name="big", base_url=srv.base_url, model="big-model")
        flowmagic.configure(name="small", base_url=srv.base_url, model="small-model")
        flowmagic.configure(prices={"big-model": (10.0, 30.0), "small-model": (0.1, 0.3)})
        yield srv


def slim_flow(store=None, **settings):
    llm = LLM(store=Store(store) if store else None, backoff_base=0.01)
    return Flow.from_dict(SLIM_PLAN, task="facts about a city", llm=llm, name="cities",
                          **settings)


def table_cells(markup):
    import html
    import re

    rows = re.findall(r"<tr>(.*?)</tr>", markup.split("<tbody>", 1)[1])
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)] for row in rows]


def test_importance_and_slim_wait_for_a_probe_set(slim_server):
    flow = slim_flow()
    panel = Panel(flow)
    assert panel.importance_button.disabled and panel.slim_button.disabled
    assert "cities.attach_probe(examples, scorer)" in panel.slim.status.value
    assert panel.slim.widget.layout.display == "none"   # no probe set: the row is not shown
    assert panel.choice_controls.hidden == [2]
    flow.attach_probe(EXAMPLES, fact_found)   # from code: the "probe" event enables them
    assert not panel.importance_button.disabled and not panel.slim_button.disabled
    assert panel.slim.widget.layout.display == "" and panel.choice_controls.hidden == []
    assert panel.slim.status.value == ""
    # The cheaper map: typed, else every node's model to the model picked above.
    assert panel.model_picker.value == "m"   # the default endpoint's model comes first
    assert panel.slim.options("slim")["cheaper"] == {"big": "m", "small": "m"}
    panel.model_picker.value = "small:small-model"
    assert panel.slim.options("slim") == {"cheaper": {"big": "small:small-model"},
                                          "tau_prune": 0.95, "tau_downgrade": 0.95}
    panel.slim.cheaper.value = "big = small, x=y"
    assert panel.slim.options("slim")["cheaper"] == {"big": "small", "x": "y"}
    panel.slim.cheaper.value = "big"
    panel.slim_button.click()   # a malformed map is one red line, nothing starts
    assert "cheaper takes model=cheaper-model pairs" in panel.slim.status.value
    assert panel.slimmed is None and flow.last_slim is None
    panel.close()


def test_a_slim_click_from_the_page_acts_on_the_model_and_text_it_carries(slim_server):
    """The page sends Slim's click with the model shown and the cheaper / tau text typed; the
    kernel may not have those yet (ipywidgets holds changes back while the kernel is busy)
    and must slim with them, not with what it had."""
    flow = slim_flow()
    flow.attach_probe(EXAMPLES, fact_found, n=2, seed=1)
    panel = Panel(flow)
    controls = panel.choice_controls
    panel.slim.tau.value = 0.5   # what the kernel was told last
    controls.receive({"action": "slim", "choices": {"model": "m", "cheaper": "", "tau": "x"}})
    assert "flowmagic: tau must be a number in (0, 1], e.g. 0.95, not &#x27;x&#x27;" in (
        panel.slim.status.value) and flow.last_slim is None
    controls.receive({"action": "slim", "choices": {"model": "small:small-model",
                                                    "cheaper": "", "tau": "0.9"}})
    slim, report = flow.last_slim
    assert panel.slimmed is slim
    assert report.settings["tau_prune"] == report.settings["tau_downgrade"] == 0.9
    assert report.settings["cheaper"] == {"big": "small:small-model"}
    controls.receive({"action": "slim", "choices": {"cheaper": "big=small", "tau": "0.8"}})
    assert flow.last_slim[1].settings["cheaper"] == {"big": "small"}
    assert flow.last_slim[1].settings["tau_prune"] == 0.8
    # the page's own changes come after the click: the kernel's copies are untouched
    assert panel.slim.tau.value == "0.5" and panel.slim.cheaper.value == ""
    assert panel.model_picker.value == "m"
    panel.close()


def test_a_failing_slim_is_one_line_in_the_panel(slim_server):
    flow = slim_flow()
    flow.attach_probe(EXAMPLES[:1], lambda result, example: 0.0)
    panel = Panel(flow)
    panel.slim_button.click()   # no loop runs here: it runs to the end, like flow.slim()
    assert "baseline scores 0" in panel.slim.status.value and "\n" not in panel.slim.status.value
    assert not panel.slim_button.disabled and panel.slimmed is None
    panel.close()


def test_importance_button_shows_the_table_of_flow_importance(slim_server):
    from flowmagic.view.display import IMPORTANCE_HEADER, importance_cells

    async def scenario():
        flow = slim_flow()
        flow.attach_probe(EXAMPLES, fact_found)
        panel = Panel(flow)
        try:
            panel.importance_button.click()   # a task on this loop: the click returns at once
            assert panel.importance_button.disabled and panel.slim_button.disabled
            await panel.slim.job
            assert not panel.importance_button.disabled
            return panel.slim.importance, panel.slim.view.value, await flow.aimportance()
        finally:
            panel.close()
            await flow.llm.aclose()

    shown, markup, by_code = asyncio.run(scenario())
    assert shown.to_rows() == by_code.to_rows()
    assert [r["node"] for r in shown.to_rows()][0] == "answer"   # the sink is protected
    heads = [h for h in markup.split("<thead>", 1)[1].split("</thead>")[0].split("<th>")[1:]]
    assert [h.split("</th>")[0] for h in heads] == IMPORTANCE_HEADER
    assert table_cells(markup) == importance_cells(by_code.to_rows())


def test_slim_button_gives_what_flow_slim_gives(slim_server, tmp_path):
    by_panel, by_code = slim_flow(tmp_path / "panel.db"), slim_flow(tmp_path / "code.db")
    for flow in (by_panel, by_code):
        flow.attach_probe(EXAMPLES, fact_found, n=2, seed=1)
    slim_c, report_c = by_code.slim(cheaper={"big": "small"}, tau_prune=0.9, tau_downgrade=0.9)
    progress = []

    async def scenario():
        panel = Panel(by_panel)
        by_panel.subscribe(lambda e: e["kind"] == "slim"
                           and progress.append(panel.slim.status.value))
        try:
            panel.slim.cheaper.value = "big=small"
            panel.slim.tau.value = 0.9
            panel.slim_button.click()
            assert panel.slim_button.disabled and panel.importance_button.disabled
            await panel.slim.job
            assert not panel.slim_button.disabled
            return panel, panel.slim.view.value
        finally:
            panel.close()
            await by_panel.llm.aclose()

    panel, view = asyncio.run(scenario())
    steps = lambda r: [(s["action"], s["node"], s["accepted"], s["score_after"],  # noqa: E731
                        round(s["cost_after"], 12)) for s in r.steps]
    assert steps(panel.slim.report) == steps(report_c) and steps(report_c)
    assert ("prune", "relay", True, 1.0) in [s[:4] for s in steps(report_c)]
    assert panel.slim.report.final == report_c.final
    assert by_panel.last_slim == (panel.slimmed, panel.slim.report)
    assert by_code.last_slim == (slim_c, report_c)
    assert state(panel.slimmed)["nodes"] == state(slim_c)["nodes"]
    assert by_panel.workflow.nodes["relay"].status == "pending"   # the original is untouched
    assert progress[0].startswith("slimming: 1 configurations evaluated")
    assert any("steps tried" in p for p in progress) and progress[-1].startswith("slimming:")
    assert "cities.last_slim" in view and "<svg" in view and "rolled back" in view
    assert panel.slim.status.value == ""


# -- the chat view of an orchestration (issue 10) --------------------------------------------------
def _system(body):
    messages = body.get("messages") or []
    return messages[0]["content"] if messages and messages[0]["role"] == "system" else ""


def _call(name, **arguments):
    import json
    return {"function": {"name": name, "arguments": json.dumps(arguments)}}


def chat_responder(body):
    """Orchestrator: ask two agents at once, then submit; workers answer; the forced
    final call answers 'best answer so far'."""
    if "Write only the final answer" in _system(body):
        return "best answer so far"
    if "The orchestrator proposes this final answer" in body["messages"][-1]["content"]:
        return json.dumps({"agree": True, "reason": "it is right"})   # the consensus votes
    if _system(body).startswith("You are the orchestrator"):
        if not any(m["role"] == "tool" for m in body["messages"]):
            return {"tool_calls": [_call("send_message", agent="planner", content="Plan **it**"),
                                   _call("send_message", agent="analyst", content="Which column?")]}
        if "Still working" in body["messages"][-1]["content"]:   # replies arrive one by one
            return {"tool_calls": [_call("wait_for_replies")]}
        return {"tool_calls": [_call("submit_answer", answer="Total: **42**")]}
    return f"{_system(body).split('.')[0]} says: `done`"


def test_chat_view_shows_each_message_once_in_order_and_the_answer():
    from flowmagic.jupyter.chatview import ChatView, message_markdown
    from flowmagic.orchestrator import Orchestrator

    views = []

    async def scenario():
        orch = Orchestrator("Total the sales", ["planner", "analyst"], llm=LLM(backoff_base=0.01),
                            budget_s=30, max_turns=4)
        views.append(ChatView(orch))   # before the start
        # ... and one made in the middle of the run, from inside a message event
        orch.subscribe(lambda e: e["kind"] == "message" and e["message"]["seq"] == 2
                       and views.append(ChatView(orch)))
        orch.start()
        assert not views[0].stop_button.disabled
        outcome = await orch.wait()
        await orch.llm.aclose()
        return outcome

    with LoopbackServer(responder=chat_responder) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        o = asyncio.run(scenario())
    # task, two sends, two replies, two confirms, two verdicts, the submission
    assert o.answer == "Total: **42**" and len(o.transcript) == 10
    seqs = [m.seq for m in o.transcript]
    for view in [*views, ChatView(o)]:   # live from the start, joined mid-run, after the end
        assert view.shown == seqs
        shown = [message_markdown(m.to_dict()) for m in o.transcript]
        assert [c.outputs[0]["data"]["text/html"] for c in view.messages.children] == [
            markdown_html(md) for md in shown]
        (answer,) = view.answer.children
        assert "Total: <strong>42</strong>" in answer.outputs[0]["data"]["text/html"]
        assert "submitted, ended by submit" in answer.outputs[0]["data"]["text/html"]
        assert view.stop_button.disabled
        assert f"10 messages · {o.calls} calls" in view.totals.value
        assert f"${o.cost_usd:.4f}" in view.totals.value
        view.close()
    assert "**orchestrator → planner** · send · turn 1" in shown[1]
    assert shown[1].endswith("Plan **it**")
    assert "tokens" in shown[3]   # a worker's reply carries its usage


def test_chat_view_stop_button_stops_the_orchestration():
    from flowmagic.jupyter.chatview import ChatView
    from flowmagic.orchestrator import Orchestrator

    def never_submits(body):
        if "Write only the final answer" in _system(body):
            return "best answer so far"
        if _system(body).startswith("You are the orchestrator"):
            return {"tool_calls": [_call("send_message", agent="analyst", content="look again")]}
        return "still looking"

    def latency(body):   # workers are slow; the orchestrator is not
        return 0.0 if _system(body).startswith("You are the orchestrator") else 10.0

    async def scenario():
        orch = Orchestrator("t", ["analyst"], llm=LLM(backoff_base=0.01), budget_s=None,
                            max_turns=50)
        view = ChatView(orch)
        orch.start()
        while "analyst" not in view.activity.value:
            await asyncio.sleep(0.02)
        view.stop_button.click()
        assert view.stop_button.disabled and "stopping" in view.title.value
        o = await orch.wait()
        await orch.llm.aclose()
        return view, o

    with LoopbackServer(responder=never_submits, latency=latency) as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        started = time.perf_counter()
        view, o = asyncio.run(scenario())
    assert time.perf_counter() - started < 5
    assert o.ended_by == "stopped" and o.answer == "best answer so far"
    (answer,) = view.answer.children
    assert "ended by stopped" in answer.outputs[0]["data"]["text/html"]
    assert view.shown == [m.seq for m in o.transcript] and "· forced ·" in view.title.value
    view.close()


def test_candidate_plans_and_why_the_chosen_one_won_are_shown(server):
    from flowmagic.engine.planner import Candidate, score, select

    flow = make_flow()
    flat = Flow.from_dict({"subtasks": [{"id": n, "requirement": n} for n in "abc"]}).workflow
    flow.candidates = [Candidate(0, 0, workflow=flat, scores=score(flat, flow.task)),
                       Candidate(1, 1, workflow=flow.workflow.copy(),
                                 scores=score(flow.workflow, flow.task)),
                       Candidate(2, 2, error="ModelOutputError: no JSON")]
    flow.chosen = select(flow.candidates, "load sales.csv, summarise it, plot and report")
    panel = Panel(flow)
    shown = panel.candidates.value
    assert flow.chosen == 1 and "candidate plans (3)" in shown
    assert "* candidate 1 (seed 1): 4 nodes, 4 edges, speed-up 1.33" in shown
    assert "chosen: P_avg 0.33, C_dependency" in shown
    assert "lost to candidate 1: connected, one final subtask; candidate 0: no dependencies" in shown
    assert "candidate 2 (seed 2): failed: ModelOutputError: no JSON" in shown
    # Every usable candidate can be picked and used with a click: flow.use_candidate(i).
    assert [i for _, i in panel.candidate_picker.options] == [0, 1]
    assert panel.candidate_picker.value == 1 and panel.use_button.disabled
    panel.candidate_picker.value = 0
    assert not panel.use_button.disabled
    panel.use_button.click()
    assert flow.chosen == 0 and list(flow.workflow.nodes) == ["a", "b", "c"]
    assert list(panel.node_picker.options) == ["a", "b", "c"] and panel.message.value == ""
    panel.step_button.click()   # once a node has run, the plan can no longer change
    panel.candidate_picker.value = 1
    assert panel.use_button.disabled
    panel.close()


def test_pause_says_at_once_what_it_waits_for_and_output_streams_from_where_it_is(slow_server):
    async def scenario():
        flow = make_flow()
        panel = Panel(flow)
        try:
            panel.run_button.click()
            await asyncio.sleep(0.15)   # load is running, and streaming before anyone looked
            assert flow.workflow.nodes["load"].status == "running"
            panel.pause_button.click()
            assert panel.message.value == "pausing: waiting for 1 running node to finish"
            assert flow.message == panel.message.value
            panel.show_output("load")   # clicked after load started: its text so far shows
            while flow.workflow.nodes["load"].status == "running":
                await asyncio.sleep(0.01)
            await flow.wait()
            assert flow.status == "paused" and panel.message.value == ""
            shown = panel.output.outputs[0]["data"]["text/plain"]
            assert shown == flow.workflow.nodes["load"].output
        finally:
            flow.stop()
            await flow.wait()
            panel.close()
            await flow.llm.aclose()

    asyncio.run(scenario())


def test_a_running_node_shows_its_text_so_far(server):
    flow = make_flow()
    panel = Panel(flow)   # the panel turns streaming on, so every node streams
    seen = []
    flow.subscribe(lambda e: e["kind"] == "text" and not seen and seen.append(
        (panel.show_output("load"), panel.output.outputs[0]["data"]["text/plain"])))
    flow.step()
    assert seen and seen[0][1] and "has no output yet" not in seen[0][1]
    panel.close()


def test_the_result_shows_when_the_run_ends_with_model_html_as_text():
    with LoopbackServer(responder=lambda body: "<img src=x onerror=alert(1)> **done**, $3") as srv:
        flowmagic.configure(base_url=srv.base_url, model="m")
        flow = make_flow(consolidate=True)
        panel = Panel(flow)
        assert panel.result.outputs == ()
        flow.run()
        shown = panel.result.outputs[0]["data"]
        assert flow.result == "<img src=x onerror=alert(1)> **done**, $3"
        assert "text/markdown" not in shown and "<img" not in shown["text/html"]
        assert ("&lt;img src=x onerror=alert(1)&gt; <strong>done</strong>, $3"
                in shown["text/html"])
        assert 'class="flowmagic-model-text tex2jax_ignore mathjax_ignore"' in shown["text/html"]
        assert shown["text/plain"] == f"Result of flow\n\n{flow.result}"
        panel.close()


def test_the_static_copy_has_the_drawing_and_the_status(server):
    from flowmagic.view.display import StaticView

    flow = make_flow()
    flow.run()
    view = StaticView(flow, "flowmagic-static-x")
    view.update(png=True)
    data, meta = view._repr_mimebundle_()
    assert data["image/svg+xml"].startswith("<svg") and data["image/png"]
    assert data["text/plain"].startswith("flow 'flow' (done): 4/4 done")
    assert "  report: done" in data["text/plain"]
    assert data["text/html"].startswith('<div class="flowmagic-static flowmagic-static-x"><svg')
    assert meta["flowmagic"]["run"] == flow.run_id
    panel = Panel(flow)   # the live panel hides that copy while it is on the page
    assert "<style>.flowmagic-static-" in panel.legend.value
    assert panel.static.css_class in panel.legend.value
    panel.close()
