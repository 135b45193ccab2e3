"""Large graphs in the panel: the drawing fits the width, zooms in and out, long ids wrap."""

import re

import pytest

from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.jupyter.widgets import Panel
from flowmagic.view.render import svg
from flowmagic.view.zoom import Zoom, natural_size


def big_flow(n=200, long_id=None):
    ids = [f"step_{i:03d}" for i in range(n)]
    if long_id:
        ids[-1] = long_id
    nodes = [{"id": i, "requirement": f"part {k}", "agent": "worker"} for k, i in enumerate(ids)]
    edges = [[ids[max(0, k - 2)], ids[k]] for k in range(1, n)]   # two long chains
    return Flow.from_dict({"nodes": nodes, "edges": edges}, task="big", save=False)


def root_style(markup):
    return re.search(r"<svg\b[^>]*>", markup).group(0)


def test_the_drawing_fits_the_width_by_default_and_zooms():
    flow = big_flow()
    panel = Panel(flow)
    drawing = svg(flow)
    width, _ = natural_size(drawing.decode() if isinstance(drawing, bytes) else drawing)
    assert width > 5000   # 200 nodes in 100 steps: far wider than a notebook cell
    root = root_style(panel.drawing.value)
    # fit: the panel's width, never below 60% of the natural size (then it scrolls)
    assert "width:100%" in root and f"min-width:{width * 0.6:.0f}px" in root
    assert ' width="' not in root and "viewBox" in root and panel.zoom_label.value == "<small>fit</small>"
    panel.zoom_in_button.click()      # from fit (0.6 here): the next step up
    assert panel.zoom.level == 0.67 and f"width:{width * 0.67:.0f}px" in root_style(panel.drawing.value)
    panel.zoom_out_button.click()
    assert panel.zoom.level == 0.5 and panel.zoom_label.value == "<small>50%</small>"
    panel.fit_button.click()
    assert panel.zoom.level is None and "width:100%" in root_style(panel.drawing.value)
    flow.prune("step_007")   # a redraw keeps the zoom the user chose
    panel.zoom_in_button.click()
    flow.prune("step_008")
    assert panel.zoom.level == 0.67 and "width:100%" not in root_style(panel.drawing.value)
    panel.close()


def test_zoom_levels_are_bounded_and_a_small_drawing_is_not_blown_up():
    zoom = Zoom()
    for _ in range(20):
        zoom.zoom_in()
    assert zoom.level == 3.0
    for _ in range(20):
        zoom.zoom_out()
    assert zoom.level == 0.25
    with pytest.raises(ConfigError, match="zoom 9 is out of range"):
        zoom.set(9)
    small = '<svg width="120pt" height="40pt" viewBox="0 0 120 40"><g/></svg>'
    fitted = root_style(Zoom().apply(small))
    assert "max-width:160px" in fitted   # never wider than its natural 160 px


def test_a_long_id_is_drawn_whole_on_several_lines():
    long_id = "load_the_quarterly_sales_data_and_clean_it"   # 42 characters: shortened to 40
    flow = big_flow(5, long_id=long_id)
    node_id = [i for i in flow.workflow.nodes if i.startswith("load")][0]
    drawing = svg(flow)
    drawing = drawing.decode() if isinstance(drawing, bytes) else drawing
    group = drawing[drawing.index(f'id="node&#45;{node_id}"'):].split("</g>")[0]
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", group)
    assert "".join(texts[:-1]) == node_id and all(len(t) <= 20 for t in texts[:-1])
