"""flowmagic.view.render: the graphviz drawing read back as SVG, the fallback without `dot`,
the Gantt timeline, the Flow's rich display and the throttled live drawing."""

import asyncio
import subprocess
import sys
import xml.etree.ElementTree as ET

import graphviz
import pytest

from flowmagic.view import render
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow

SVG_NS = "{http://www.w3.org/2000/svg}"
SHAPES = {f"{SVG_NS}{t}" for t in ("path", "polygon", "ellipse")}


def make_flow(statuses=None, durations=None):
    """A diamond a -> (b, c) -> d plus a lone e, statuses and durations set by hand."""
    plan = {"nodes": [{"id": "a", "requirement": "load the data", "agent": "loader"},
                      {"id": "b", "requirement": "summarise <columns> & \\types",
                       "agent": "analyst"},
                      {"id": "c", "requirement": "plot two relationships", "agent": "plotter"},
                      {"id": "d", "requirement": "write three findings", "agent": "writer"},
                      {"id": "e", "requirement": "an aside", "agent": "writer"}],
            "edges": [["a", "b"], ["a", "c"], ["b", "d"], ["c", "d"]]}
    flow = Flow.from_dict(plan, task="report on a csv")
    for node_id, status in (statuses or {}).items():
        flow.workflow.nodes[node_id].status = status
    clock = 1000.0
    for node_id, seconds in (durations or {}).items():
        node = flow.workflow.nodes[node_id]
        node.start, node.end = clock, clock + seconds
    return flow


def parse(svg_text):
    return ET.fromstring(svg_text.encode("utf-8"))


def groups(root, kind):
    return {g.get("id"): g for g in root.iter(f"{SVG_NS}g")
            if kind in (g.get("class") or "").split()}


def shapes(group):
    return [el for el in group.iter() if el.tag in SHAPES]


def test_svg_has_one_group_per_node_filled_by_status():
    statuses = {"a": "done", "b": "running", "c": "failed", "d": "ready", "e": "pending"}
    flow = make_flow(statuses)
    root = parse(render.svg(flow))
    nodes = groups(root, "node")
    assert set(nodes) == {f"node-{i}" for i in flow.workflow.nodes}
    for node_id, status in statuses.items():
        group = nodes[f"node-{node_id}"]
        assert status in group.get("class").split()
        assert shapes(group)[0].get("fill") == render.STATUS_COLORS[status]
    texts = [t.text for t in nodes["node-b"].iter(f"{SVG_NS}text")]
    assert texts == ["b", "analyst"]


def test_tooltip_keeps_the_requirement_literally():
    root = parse(render.svg(make_flow()))
    link = next(groups(root, "node")["node-b"].iter(f"{SVG_NS}a"))
    title = link.get("{http://www.w3.org/1999/xlink}title")
    assert title.startswith("summarise <columns> & \\types\n")


def test_pruned_node_is_dashed_grey_with_no_edges():
    flow = make_flow({"a": "done"})
    flow.prune("b")
    root = parse(render.svg(flow))
    nodes, edges = groups(root, "node"), groups(root, "edge")
    assert len(nodes) == len(flow.workflow.nodes)
    pruned = shapes(nodes["node-b"])[0]
    assert pruned.get("stroke-dasharray")
    assert pruned.get("fill") == render.STATUS_COLORS["pruned"]
    assert "pruned" in nodes["node-b"].get("class").split()
    assert not [e for e in edges if "b" in e.split("-")[1:]]
    # the bypass a -> d is drawn although a reaches d through c: d reads a's output now
    assert set(edges) == {"edge-a-c", "edge-c-d", "edge-a-d"}
    assert any("cluster" in (g.get("class") or "") for g in root.iter(f"{SVG_NS}g"))


def test_critical_path_by_duration_is_bold():
    flow = make_flow({"a": "done", "b": "done", "c": "done", "d": "done", "e": "done"},
                     durations={"a": 1, "b": 1, "c": 9, "d": 1, "e": 2})
    root = parse(render.svg(flow))
    nodes, edges = groups(root, "node"), groups(root, "edge")
    for node_id, bold in {"a": True, "c": True, "d": True, "b": False, "e": False}.items():
        group = nodes[f"node-{node_id}"]
        assert ("critical" in group.get("class").split()) is bold
        assert (shapes(group)[0].get("stroke-width") == "3") is bold
    for edge_id, bold in {"edge-a-c": True, "edge-c-d": True, "edge-a-b": False,
                          "edge-b-d": False}.items():
        assert (shapes(edges[edge_id])[0].get("stroke-width") == "3") is bold
    plain = parse(render.svg(flow, highlight_critical=False))
    assert not [g for g in groups(plain, "node").values() if "critical" in g.get("class")]


def test_downgraded_and_stale_nodes_are_marked():
    flow = make_flow({"a": "done", "b": "done"})
    node = flow.workflow.nodes["c"]
    node.downgraded_from, node.model = "gpt-4o", "gpt-4o-mini"
    flow.workflow.nodes["b"].stale = True
    flow.workflow.nodes["e"].model = "big:llama"
    nodes = groups(parse(render.svg(flow)), "node")
    c = nodes["node-c"]
    assert "downgraded" in c.get("class").split()
    assert [t.text for t in c.iter(f"{SVG_NS}text")] == ["c", "plotter", "↓ gpt-4o-mini"]
    assert len(shapes(c)) == 2  # a double border
    assert "stale" in nodes["node-b"].get("class").split()
    assert "⚠ stale" in [t.text for t in nodes["node-b"].iter(f"{SVG_NS}text")]
    assert [t.text for t in nodes["node-e"].iter(f"{SVG_NS}text")] == ["e", "writer", "big:llama"]


def test_dot_source_is_deterministic_in_plan_order():
    first, second = make_flow({"a": "done"}), make_flow({"a": "done"})
    source = render.draw(first).source
    assert source == render.draw(second.workflow).source
    declared = [line.split()[0] for line in source.splitlines()
                if line.startswith("\t") and "[label=" in line]
    assert declared == list(first.workflow.nodes)
    assert "rankdir=LR" in source
    assert isinstance(first.draw(), graphviz.Digraph)
    assert "rankdir=TB" in first.draw(rankdir="TB").source


def test_without_dot_svg_falls_back_to_dot_text_and_hint(monkeypatch, tmp_path):
    flow = make_flow({"a": "done"})
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `dot` to find
    assert not render.have_dot()
    text = render.svg(flow)
    hint, source = text.split("\n", 1)
    assert hint == f"// {render.DOT_HINT}"
    assert "apt-get install graphviz" in hint and "brew" in hint and "conda" in hint
    assert source == render.draw(flow).source
    with pytest.raises(ConfigError, match="apt-get install graphviz"):
        render.png(flow)
    data, _ = flow._repr_mimebundle_()
    assert set(data) == {"text/plain"}
    assert data["text/plain"].endswith(render.DOT_HINT)


def test_live_drawing_outside_ipython_says_to_pass_update():
    code = ("import flowmagic.view.render as r, flowmagic.errors as e\n"
            "from flowmagic.model.graph import Workflow, Node\n"
            "wf = Workflow('t'); wf.add_node(Node('a', 'x'))\n"
            "class F: workflow = wf; subscribe = staticmethod(lambda cb: None)\n"
            "try:\n    r.LiveDrawing(F())\nexcept e.ConfigError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pass update=" in out.stdout


def test_png_is_a_png():
    assert render.png(make_flow()).startswith(b"\x89PNG\r\n\x1a\n")


def test_rich_display_has_summary_svg_and_run_metadata():
    flow = make_flow({"a": "done", "c": "failed"})
    data, meta = flow._repr_mimebundle_()
    assert data["text/plain"] == "flow 'flow' (planned): 1/5 done, 1 failed, $0.0000"
    assert len(groups(parse(data["image/svg+xml"]), "node")) == 5
    assert meta == {"flowmagic": {"run": flow.run_id}}
    only_text, _ = flow._repr_mimebundle_(include={"text/plain"})
    assert set(only_text) == {"text/plain"}
    no_svg, _ = flow._repr_mimebundle_(exclude={"image/svg+xml"})
    assert set(no_svg) == {"text/plain"}


def timeline_rows():
    return [{"node": "a", "agent": "loader", "clone": None, "status": "done", "start": 10.0,
             "end": 11.0, "duration_s": 1.0},
            {"node": "b", "agent": "analyst", "clone": "analyst#2", "status": "failed",
             "start": 11.0, "end": 13.5, "duration_s": 2.5},
            {"node": "c<&>", "agent": "plotter", "clone": None, "status": "running",
             "start": 11.0, "end": None, "duration_s": None}]


def test_timeline_svg_is_valid_xml_with_one_bar_per_row():
    root = parse(render.timeline_svg(timeline_rows(), critical=["a", "b"], now=15.0))
    bars = [r for r in root.iter(f"{SVG_NS}rect") if "bar" in r.get("class").split()]
    assert [b.get("id") for b in bars] == ["bar-a", "bar-b", "bar-c<&>"]
    assert [b.get("fill") for b in bars] == [render.STATUS_COLORS[s]
                                             for s in ("done", "failed", "running")]
    assert [b.get("stroke-width") for b in bars] == ["2", "2", "0.5"]
    widths = [float(b.get("width")) for b in bars]
    assert widths[0] * 2.5 == pytest.approx(widths[1], abs=0.2)
    assert widths[2] == pytest.approx(widths[0] * 4, abs=0.2)  # running: ends at `now`
    ticks = [t.text for t in root.iter(f"{SVG_NS}text") if t.text.endswith(" s")]
    assert ticks[0] == "0 s" and ticks[-1] == "5 s"


def test_timeline_svg_of_a_flow_outlines_its_critical_path():
    flow = make_flow({n: "done" for n in "abcde"},
                     durations={"a": 1, "b": 1, "c": 9, "d": 1, "e": 2})
    root = parse(render.timeline_svg(flow))
    critical = {r.get("id") for r in root.iter(f"{SVG_NS}rect")
                if "critical" in r.get("class").split()}
    assert critical == {"bar-a", "bar-c", "bar-d"}
    assert len(list(root.iter(f"{SVG_NS}rect"))) == len(flow.timeline()) == 5


def test_timeline_svg_with_nothing_run_is_valid():
    root = parse(render.timeline_svg(make_flow()))
    assert [t.text for t in root.iter(f"{SVG_NS}text")] == ["nothing has run yet"]


def finish_all(flow, n_events):
    """n_events state changes in a burst; the last one leaves every node done."""
    ids = list(flow.workflow.nodes)
    for i in range(n_events):
        node = flow.workflow.nodes[ids[i % len(ids)]]
        node.status = "running" if i < n_events - len(ids) else "done"
        flow.emit("finished", node.id)


def test_live_drawing_coalesces_a_burst_and_draws_the_last_state():
    flow = make_flow()
    seen = []

    async def main():
        live = render.LiveDrawing(flow, update=seen.append)
        finish_all(flow, 100)
        await asyncio.sleep(live.interval * 2)  # the trailing redraw fires on this loop
        assert not live._dirty
        live.close()
        return live

    live = asyncio.run(main())
    assert 2 <= len(seen) == live.draws <= 5
    nodes = groups(parse(seen[-1]), "node")
    assert all("done" in g.get("class").split() for g in nodes.values())


def test_live_drawing_without_a_loop_draws_the_end_of_a_run():
    flow = make_flow()
    seen = []
    live = render.LiveDrawing(flow, update=seen.append, interval=60.0)
    finish_all(flow, 100)
    flow.emit("text", "a", {"text": "token"})
    assert len(seen) == 1  # everything since the first drawing was coalesced
    flow.emit("run", None, {"state": "done"})
    assert len(seen) == 2
    assert all("done" in g.get("class").split() for g in groups(parse(seen[-1]), "node").values())
    live.close()
    flow.emit("finished", "a")
    assert len(seen) == 2  # closed: no longer subscribed


def test_live_drawing_updates_one_ipython_display(monkeypatch, tmp_path):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.instance(config=config)
    flow = make_flow()
    with capture_output() as captured:
        live = render.LiveDrawing(flow, interval=0.0)
        flow.workflow.nodes["a"].status = "done"
        flow.emit("finished", "a")
        live.close()
    first, second = captured.outputs
    assert first.update is False and second.update is True
    assert first.transient["display_id"] == second.transient["display_id"]
    assert "done" in second.data["image/svg+xml"]


def test_render_imports_neither_ipython_nor_graphviz():
    code = ("import sys, flowmagic.view.render, flowmagic.flow; "
            "print(sorted(m for m in ('IPython', 'graphviz') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
