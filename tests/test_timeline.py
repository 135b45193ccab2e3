"""The Gantt timeline of a run stepped by hand: idle waits are cut out of the axis (and
marked with the time skipped), so bars stay readable; tool calls show inside their bars."""

import xml.etree.ElementTree as ET

import pytest

from flowmagic.flow import Flow
from flowmagic.view import render
from flowmagic.view.timescale import TimeScale

SVG_NS = "{http://www.w3.org/2000/svg}"


def bars(root):
    return {r.get("id"): r for r in root.iter(f"{SVG_NS}rect")
            if "bar" in (r.get("class") or "").split()}


def stepped_rows():
    """Step, wait ten minutes, step again: 2 s and 3 s of work 600 s apart."""
    return [{"node": "load", "agent": "coder", "status": "done", "start": 100.0, "end": 102.0},
            {"node": "plot", "agent": "coder", "status": "done", "start": 702.0, "end": 705.0}]


def test_an_idle_wait_is_skipped_and_marked_so_bars_stay_readable():
    root = ET.fromstring(render.timeline_svg(stepped_rows(), critical=[], now=800.0))
    load, plot = bars(root)["bar-load"], bars(root)["bar-plot"]
    width = {k: float(b.get("width")) for k, b in (("load", load), ("plot", plot))}
    # one scale for the work: 5 s of it fill the chart instead of 5 s in 605 (2-3 px slivers)
    assert width["load"] > 200 and width["plot"] == pytest.approx(width["load"] * 1.5, rel=0.02)
    gaps = [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "gap"]
    assert len(gaps) == 1
    labels = [t.text for t in gaps[0].iter(f"{SVG_NS}text")]
    assert labels == ["10.0 min skipped"]
    gap_x = float(next(gaps[0].iter(f"{SVG_NS}rect")).get("x"))
    load_end = float(load.get("x")) + width["load"]
    assert load_end <= gap_x + 4 < float(plot.get("x"))   # the break sits between the bars
    ticks = [t.text for t in root.iter(f"{SVG_NS}text") if t.text.endswith(" s")]
    assert ticks[0] == "0 s" and ticks[-1] == "605 s"   # times stay real after the break


def test_short_pauses_stay_to_scale():
    rows = [{"node": "a", "status": "done", "start": 0.0, "end": 4.0},
            {"node": "b", "status": "done", "start": 4.5, "end": 8.0}]   # 0.5 s between
    root = ET.fromstring(render.timeline_svg(rows, critical=[], now=9.0))
    assert not [g for g in root.iter(f"{SVG_NS}g") if g.get("class") == "gap"]
    a, b = bars(root)["bar-a"], bars(root)["bar-b"]
    per_second = float(a.get("width")) / 4
    assert float(b.get("x")) - float(a.get("x")) == pytest.approx(4.5 * per_second, rel=0.01)


def test_the_scale_maps_times_in_order_across_breaks():
    ts = TimeScale([(0, 2), (600, 603), (3000, 3001)], 600)
    xs = [ts.x(t) for t in (0, 1, 2, 300, 600, 601.5, 603, 1000, 3000, 3001)]
    assert xs == sorted(xs) and xs[-1] == pytest.approx(600, abs=1)
    assert [round(b.seconds) for b in ts.breaks] == [598, 2397]


def test_tool_calls_show_inside_their_node_bar(tmp_path):
    plan = {"nodes": [{"id": "fetch", "requirement": "fetch the prices", "agent": "coder"},
                      {"id": "sum", "requirement": "sum them", "agent": "coder"}],
            "edges": [["fetch", "sum"]]}
    flow = Flow.from_dict(plan, task="prices")
    fetch, total = flow.workflow.nodes["fetch"], flow.workflow.nodes["sum"]
    fetch.status = total.status = "done"
    fetch.start, fetch.end, total.start, total.end = 1000.0, 1010.0, 1010.0, 1012.0
    # what the runner records for each tool call a node makes: its end time and duration
    flow.store.add_tool_call(flow.run_id, "fetch", tool="http_get", arguments={"url": "x"},
                             result="ok", duration_s=3.0, error=None, round=1, protocol="native")
    flow.store._execute("UPDATE tool_calls SET ts = 1006.0")
    root = ET.fromstring(render.timeline_svg(flow))
    tools = [r for r in root.iter(f"{SVG_NS}rect") if r.get("class") == "tool"]
    assert len(tools) == 1 and tools[0].find(f"{SVG_NS}title").text == "tool http_get: 3.00 s"
    bar = bars(root)["bar-fetch"]
    x0, w = float(bar.get("x")), float(bar.get("width"))
    tx, tw = float(tools[0].get("x")), float(tools[0].get("width"))
    assert tx == pytest.approx(x0 + 0.3 * w, abs=1) and tw == pytest.approx(0.3 * w, abs=1)
    assert "1 tool call(s)" in bar.find(f"{SVG_NS}title").text


def test_the_text_table_says_which_idle_stretch_the_chart_skips():
    from flowmagic.view.display import timeline_report

    plan = {"nodes": [{"id": "load", "requirement": "load", "agent": "coder"},
                      {"id": "plot", "requirement": "plot", "agent": "coder"}],
            "edges": [["load", "plot"]]}
    flow = Flow.from_dict(plan, task="stepped by hand")
    for node, (start, end) in zip(flow.workflow.nodes.values(), [(100.0, 102.0), (702.0, 705.0)]):
        node.status, node.start, node.end = "done", start, end
    text = timeline_report(flow).text
    assert "idle: nothing ran for 10.0 min from 2.00 s (the chart skips it)" in text
    assert "plot" in text and "602.00" in text   # the table keeps real times
