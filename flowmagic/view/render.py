"""Drawings of a workflow: the graph (graphviz), a Gantt timeline (plain SVG), a live view.

`draw()` builds a `graphviz.Digraph` in plan order, so the same workflow always gives the
same DOT text. Nodes are filled by status; the critical path (by duration, see
`metrics.critical_path`) is drawn bold; pruned nodes keep their place in history inside a
dashed "pruned" cluster, with no edges (the workflow already linked their parents to their
children); a downgraded node shows "↓ model" and a double border; a stale node shows
"⚠ stale" and an orange border. Each node's SVG group has `id="node-<id>"` and the classes
`<status> [critical] [downgraded] [stale]`, so tests and the browser can find it.

Rendering needs graphviz's `dot` program. Without it `svg()` returns the DOT text after a
DOT comment line saying how to install graphviz (the text is still valid DOT), and
`png()` raises a `ConfigError` with that line: bytes that are not a PNG would be worse.
graphviz is imported on first use only; IPython never (a live drawing reaches the notebook
through `flowmagic._internal.outputs`, which `flowmagic.jupyter` fills in).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from typing import Any, Callable, Iterable
from xml.dom import minidom
from xml.sax.saxutils import escape as _xml, quoteattr as _attr

from ..errors import ConfigError
from .._internal import outputs
from .._internal.text import one_line
from ..model.graph import Workflow
from ..model.metrics import critical_path
from ..model.status import Status

__all__ = ["STATUS_COLORS", "DOT_HINT", "draw", "svg", "png", "have_dot", "legend_html", "summary",
           "mimebundle", "timeline_svg", "LiveDrawing", "usd", "ran_on_model"]

STATUS_COLORS = {
    Status.PENDING: "#e0e0e0", Status.READY: "#cfe8ff", Status.RUNNING: "#fff3a8",
    Status.DONE: "#c8eec8", Status.FAILED: "#f6c0c0", Status.PRUNED: "#f5f5f5",
}
DOT_HINT = ("graphviz's `dot` program was not found; install it to see the drawing: "
            "apt-get install graphviz, brew install graphviz or conda install graphviz")
_BORDER, _CRITICAL, _FAINT = "#607d8b", "#000000", "#9e9e9e"
_DOWNGRADED, _STALE = "#7b1fa2", "#e65100"
_TOOLTIP_CHARS = 300
_log = logging.getLogger(__name__)


def _workflow(obj: Any) -> Workflow:
    wf = getattr(obj, "workflow", obj)
    if not isinstance(wf, Workflow):
        raise TypeError(f"draw takes a Flow or a Workflow, not {type(obj).__name__}")  # a bug
    return wf


_CONTROLS = {0: " "}   # dot ends a string at NUL


def _lines(*parts: str) -> str:
    """A DOT label or tooltip of literal lines: backslashes and <...> lose their meaning,
    a NUL (model text may hold one) becomes a space."""
    import graphviz

    return graphviz.nohtml("\\n".join(graphviz.escape(p.translate(_CONTROLS))
                                       for p in parts if p))


def ran_on_model(ran: str, model: str | None) -> bool:
    """Whether an attempt's model id ("endpoint:name") is what `model` names now."""
    from ..errors import FlowError
    from ..llm.endpoints import resolve

    try:
        endpoint, name = resolve(model)
    except FlowError:
        return ran == model
    return ran in (model, f"{endpoint.name}:{name}")


def wrap_id(node_id: str, width: int = 20) -> list[str]:
    """A long id on several lines, broken after '-', '_' or '.' where it can be (never cut:
    the whole id stays readable, and a wide box does not push the drawing sideways)."""
    lines, rest = [], node_id
    while len(rest) > width:
        cut = max(rest.rfind(sep, 0, width) for sep in "-_.") + 1
        cut = cut if cut >= width // 2 else width
        lines.append(rest[:cut])
        rest = rest[cut:]
    return [*lines, rest] if rest else lines


def _node_attrs(node, critical: bool) -> dict[str, str]:
    lines = [*wrap_id(node.id), one_line(node.clone or node.agent, 30)]
    classes = [node.status]
    attrs = {"id": f"node-{node.id}", "fillcolor": STATUS_COLORS.get(node.status, "#ffffff")}
    ran = node.ran_on()
    # a downgrade after a run is for the next run: the drawing keeps the model it ran on
    history = bool(node.downgraded_from and ran and not ran_on_model(ran, node.model))
    if history:
        lines.append(f"ran on {one_line(ran.removeprefix('default:'), 30)}")
    if node.downgraded_from:
        lines.append(f"{'next ' if history else ''}↓ {one_line(node.model or '?', 30)}")
        classes.append("downgraded")
        attrs.update(peripheries="2", color=_DOWNGRADED)
    elif node.model:
        lines.append(one_line(node.model, 30))
    if node.status == Status.FAILED and node.attempts and node.attempts[-1].get("cut"):
        lines.append("✂ cut at the token limit")
        classes.append("cut")
    if node.stale:
        lines.append("⚠ stale")
        classes.append("stale")
        attrs.setdefault("color", _STALE)
    if node.status == Status.PRUNED:
        attrs.update(style="rounded,filled,dashed", color=_FAINT, fontcolor=_FAINT)
    if critical:
        classes.append("critical")
        attrs.update(penwidth="3")
        attrs.setdefault("color", _CRITICAL)
    tip = [one_line(node.requirement, _TOOLTIP_CHARS), f"status: {node.status}"]
    if node.duration is not None:
        tip.append(f"took {node.duration:.2f} s")
    if history:
        tip.append(f"ran on {ran}; next run on {node.model} (downgraded)")
    elif node.downgraded_from:
        tip.append(f"model: {node.downgraded_from} → {node.model}")
    if node.error:
        tip.append(f"error: {one_line(node.error, 200)}")
    attrs.update({"label": _lines(*lines), "tooltip": _lines(*tip), "class": " ".join(classes)})
    return attrs


def draw(workflow_or_flow: Any, *, highlight_critical: bool = True, rankdir: str = "LR"):
    """A `graphviz.Digraph` of the workflow (see the module docstring for the styles)."""
    import graphviz

    wf = _workflow(workflow_or_flow)
    path = critical_path(wf, "duration")[0] if highlight_critical else []
    on_path = set(path)
    g = graphviz.Digraph("flowmagic")
    g.attr(rankdir=rankdir, nodesep="0.25", ranksep="0.45", bgcolor="white")
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10",
           color=_BORDER, penwidth="1")
    g.attr("edge", color=_BORDER, arrowsize="0.7")
    pruned = []
    for node_id, node in wf.nodes.items():
        if node.status == Status.PRUNED:
            pruned.append(node)
        else:
            g.node(node_id, **_node_attrs(node, node_id in on_path))
    critical_edges = set(zip(path, path[1:]))
    for a, b in wf.edges():
        extra = {"penwidth": "3", "color": _CRITICAL, "class": "critical"} \
            if (a, b) in critical_edges else {}
        g.edge(a, b, id=f"edge-{a}-{b}", **extra)
    if pruned:
        # A cluster keeps the removed nodes visible without pretending they still connect.
        with g.subgraph(name="cluster_pruned") as c:
            c.attr(label="pruned", style="dashed", color=_FAINT, fontcolor=_FAINT,
                   fontname="Helvetica", fontsize="10")
            for node in pruned:
                c.node(node.id, **_node_attrs(node, False))
    return g


def _pipe(graph, fmt: str) -> bytes | None:
    """The rendered bytes, or None when graphviz's `dot` program is not installed."""
    import graphviz

    try:
        return graph.pipe(format=fmt, quiet=True)
    except graphviz.ExecutableNotFound:
        return None


def have_dot() -> bool:
    """True when graphviz's `dot` program can be run (looked up on PATH at each call)."""
    import graphviz

    return _pipe(graphviz.Digraph(), "svg") is not None


def svg(workflow_or_flow: Any, **options: Any) -> str:
    """The drawing as SVG text; without `dot`, the DOT text after a comment with DOT_HINT."""
    graph = draw(workflow_or_flow, **options)
    data = _pipe(graph, "svg")
    if data is None:
        return f"// {DOT_HINT}\n{graph.source}"
    return data.decode("utf-8")


def png(workflow_or_flow: Any, **options: Any) -> bytes:
    """The drawing as PNG bytes; ConfigError (with DOT_HINT) when `dot` is missing."""
    data = _pipe(draw(workflow_or_flow, **options), "png")
    if data is None:
        raise ConfigError(DOT_HINT)
    return data


def legend_html() -> str:
    """What the fills and borders of the drawing mean, as one line of HTML."""
    def chip(label: str, style: str) -> str:
        return (f'<span style="display:inline-block;padding:0 6px;margin:1px 4px 1px 0;'
                f'border-radius:4px;{style}">{label}</span>')

    fills = [chip(status, f"background:{color};border:1px solid {_BORDER}")
             for status, color in STATUS_COLORS.items() if status != Status.PRUNED]
    borders = [chip("critical path", f"border:3px solid {_CRITICAL}"),
               chip("↓ downgraded", f"border:3px double {_DOWNGRADED}"),
               chip("⚠ stale", f"border:1px solid {_STALE}"),
               chip("pruned", f"border:1px dashed {_FAINT};color:{_FAINT}")]
    return ('<div class="flowmagic-legend" style="font-size:11px">'
            + "".join(fills + borders) + "</div>")


def usd(cost: float | None, unpriced: Any = 0, digits: int = 6) -> str:
    """A USD amount; calls of a model with no known price make it "unknown" (or "$x +
    unknown" beside priced ones), never a $0 that reads as free."""
    text = f"${cost or 0:.{digits}f}"
    if not unpriced:
        return text
    return f"{text} + unknown" if cost else "unknown"


def summary(flow: Any) -> str:
    """One line: name, status, done/total (and failed), cost."""
    counts = flow.counts()
    failed = f", {counts[Status.FAILED]} failed" if counts.get(Status.FAILED) else ""
    unpriced = sorted(getattr(flow, "unpriced", ()))
    unknown = f" ({', '.join(unpriced)}: no price known)" if unpriced else ""
    return (f"flow {flow.name!r} ({flow.status}): {counts.get(Status.DONE, 0)}/{flow.total()} done"
            f"{failed}, {usd(flow.spent_usd, unpriced, 4)}{unknown}")


def mimebundle(flow: Any, include=None, exclude=None) -> tuple[dict, dict]:
    """Flow._repr_mimebundle_: text/plain always, image/svg+xml when `dot` is installed."""
    text = summary(flow)
    data: dict[str, Any] = {}
    wanted = (lambda m: (include is None or m in include) and not (exclude and m in exclude))
    if wanted("image/svg+xml"):
        drawing = _pipe(draw(flow), "svg")
        if drawing is None:
            text = f"{text}\n{DOT_HINT}"
        else:
            data["image/svg+xml"] = drawing.decode("utf-8")
    if wanted("text/plain"):
        data["text/plain"] = text
    return data, {"flowmagic": {"run": getattr(flow, "run_id", None)}}


# ---------------------------------------------------------------------------------- timeline
_LABEL_W, _CHART_W, _ROW_H, _BAR_H, _TOP, _AXIS_H = 170, 600, 22, 14, 10, 30


def _tick_step(span: float) -> float:
    raw = span / 6
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _axis(ts: Any, y: float) -> list[str]:
    """The time axis: ticks in each stretch drawn to scale, a zig-zag and the time skipped at
    each break."""
    from .timescale import skipped_text

    out = [f'<line class="axis" x1="{_LABEL_W}" y1="{y}" x2="{_LABEL_W + ts.width:.1f}" '
           f'y2="{y}" stroke="#555" stroke-width="1"/>']
    step = _tick_step(max(e - s for s, e in ts.kept()))
    last_x = -math.inf
    for s, e in ts.kept():
        t = math.ceil(s / step - 1e-9) * step
        while t <= e + 1e-9:
            x = _LABEL_W + ts.x(t)
            if x - last_x >= 36:   # ticks of two stretches must not overprint
                out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#555"/>'
                           f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{round(t, 9):g} s</text>')
                last_x = x
            t += step
    for b in ts.breaks:
        x0, x1 = _LABEL_W + b.x + 4, _LABEL_W + b.x + ts.gap_px - 4
        mid = (x0 + x1) / 2
        skipped = f"{skipped_text(b.seconds)} idle"
        out.append(f'<g class="gap"><title>{_xml(skipped)}: nothing ran (not to scale)</title>'
                   f'<rect x="{x0 - 4:.1f}" y="{_TOP - 4}" width="{ts.gap_px:.1f}" '
                   f'height="{y - _TOP + 4}" fill="#f4f4f4"/>'
                   f'<polyline points="{x0:.1f},{y} {mid - 3:.1f},{y - 5} {mid + 3:.1f},{y + 5} '
                   f'{x1:.1f},{y}" fill="#fff" stroke="#555"/>'
                   f'<text x="{mid:.1f}" y="{y + 28}" text-anchor="middle" font-size="10" '
                   f'fill="#555">{_xml(skipped_text(b.seconds))} skipped</text></g>')
    return out


def _tool_marks(calls: list[dict], t0: float, ts: Any, y: float) -> list[str]:
    """One dark strip inside a bar per tool call (its title: the tool and how long it took)."""
    out = []
    for call in calls:
        end = float(call.get("ts") or 0.0) - t0
        took = max(float(call.get("duration_s") or 0.0), 0.0)
        x0, x1 = _LABEL_W + ts.x(max(end - took, 0.0)), _LABEL_W + ts.x(max(end, 0.0))
        tip = f"tool {call.get('tool')}: {took:.2f} s" + (" (failed)" if call.get("error") else "")
        out.append(f'<rect class="tool" x="{x0:.1f}" y="{y + _BAR_H - 5}" '
                   f'width="{max(x1 - x0, 2.0):.1f}" height="5" fill="#37474f">'
                   f'<title>{_xml(tip)}</title></rect>')
    return out


def timeline_svg(flow_or_rows: Any, *, critical: Iterable[str] | None = None,
                 now: float | None = None, tool_calls: list[dict] | None = None) -> str:
    """A Gantt chart (SVG text) with one bar per row of `flow.timeline()`.

    Bars are coloured by status; nodes on the critical path (given, or by duration from
    the Flow's workflow) are outlined. A running row ends at `now` (default: the clock).
    Idle stretches (a wait between clicks) are cut out of the axis and marked with the time
    skipped (see timescale.py); each tool call (given, or the Flow's) is a dark strip inside
    its node's bar.
    """
    from .timescale import of_rows

    if hasattr(flow_or_rows, "timeline"):
        rows = flow_or_rows.timeline_rows()
        if critical is None:
            critical = critical_path(flow_or_rows.workflow, "duration")[0]
        if tool_calls is None and hasattr(flow_or_rows, "tool_calls"):
            tool_calls = flow_or_rows.tool_calls()
    else:
        rows = list(flow_or_rows)
    rows = [r for r in rows if r.get("start") is not None]
    marked = set(critical or ())
    now = time.time() if now is None else now
    height = _TOP + len(rows) * _ROW_H + _AXIS_H + 14 if rows else _TOP + 24
    if not rows:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LABEL_W + _CHART_W + 20}" '
                f'height="{height}" font-family="Helvetica, sans-serif" font-size="11">'
                f'<text x="10" y="{_TOP + 14}">nothing has run yet</text></svg>')
    ts, t0, ends = of_rows(rows, _CHART_W, now)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LABEL_W + _CHART_W + 20}" '
            f'height="{height}" font-family="Helvetica, sans-serif" font-size="11">')
    by_node: dict[str, list[dict]] = {}
    for call in tool_calls or ():
        by_node.setdefault(str(call.get("node_id")), []).append(call)
    body = []
    for i, (row, end) in enumerate(zip(rows, ends)):
        y = _TOP + i * _ROW_H
        node, status = str(row.get("node")), str(row.get("status", Status.PENDING))
        who = row.get("clone") or row.get("agent") or ""
        label = one_line(f"{node} · {who}" if who else node, 28)
        on_path = node in marked
        stroke = (f'stroke="{_CRITICAL}" stroke-width="2"' if on_path
                  else 'stroke="#888" stroke-width="0.5"')
        classes = " ".join(["bar", status] + ["critical"] * on_path)
        x = _LABEL_W + ts.x(row["start"] - t0)
        w = max(_LABEL_W + ts.x(end - t0) - x, 1.0)
        calls = [c for c in by_node.get(node, ()) if c.get("ts") and row["start"] - 1 <= c["ts"] <= end + 1]
        tools = f", {len(calls)} tool call(s)" if calls else ""
        tip = f"{node} ({who}): {status}, {end - row['start']:.2f} s{tools}"
        body.append(
            f'<text x="{_LABEL_W - 6}" y="{y + _BAR_H - 2}" text-anchor="end">{_xml(label)}</text>'
            f'<rect id={_attr("bar-" + node)} class={_attr(classes)} x="{x:.1f}" y="{y}" '
            f'width="{w:.1f}" height="{_BAR_H}" rx="2" fill="{STATUS_COLORS.get(status, "#fff")}" '
            f'{stroke}><title>{_xml(tip)}</title></rect>')
        body += _tool_marks(calls, t0, ts, y)
    return "\n".join([head, *body, *_axis(ts, _TOP + len(rows) * _ROW_H + 4), "</svg>"])


# ---------------------------------------------------------------------------------- live view
class LiveDrawing:
    """A drawing of a Flow that redraws in place as its events arrive, at most ~4 times a second.

    Events inside the interval are coalesced: a trailing redraw (the running asyncio loop's
    `call_later`) makes sure the last state is always drawn, and the end of a run (the "run"
    event) or `close()` redraws at once. Streamed "text" events never redraw. A slow render
    widens the interval to twice the render time, so a big graph cannot hog the kernel.

    `update(content)` receives the SVG text (or, without `dot`, the summary and DOT_HINT);
    by default it updates one notebook output (a display id), in IPython only.
    """

    def __init__(self, flow: Any, *, interval: float = 0.25,
                 update: Callable[[str], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.flow = flow
        self.interval = interval
        self.draws = 0
        self._clock = clock
        self._gap = interval
        self._last = -math.inf
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None
        self._update = update or self._show
        self._handle = None
        self._unsubscribe: Callable[[], Any] = lambda: None
        self._redraw()
        self._unsubscribe = flow.subscribe(self._on_event)

    def _content(self) -> str:
        data = _pipe(draw(self.flow), "svg")
        return data.decode("utf-8") if data is not None else f"{summary(self.flow)}\n{DOT_HINT}"

    def _show(self, content: str) -> None:
        if self._handle is None and not outputs.available():
            raise ConfigError("LiveDrawing updates a notebook output; outside IPython pass "
                              "update=<a function taking the SVG text>")
        if content.lstrip().startswith("<"):   # the <svg> element alone, as IPython's SVG keeps it
            found = minidom.parseString(content).getElementsByTagName("svg")
            shown = {"image/svg+xml": found[0].toxml() if found else content,
                     "text/plain": "<flowmagic drawing>"}
        else:
            shown = {"text/plain": content}
        if self._handle is None:
            self._handle = f"flowmagic-drawing-{secrets.token_hex(8)}"
            outputs.show(shown, display_id=self._handle)
        else:
            outputs.show(shown, display_id=self._handle, update=True)

    def _redraw(self) -> None:
        self._cancel()
        began = self._clock()
        content = self._content()
        self._update(content)
        self.draws += 1
        self._dirty = False
        self._last = self._clock()
        self._gap = max(self.interval, 2 * (self._last - began))

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_event(self, event: dict) -> None:
        if event.get("kind") == "text":
            return
        self._dirty = True
        wait = self._last + self._gap - self._clock()
        if event.get("kind") == "run" or wait <= 0:
            self._safely(self._redraw)
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop to wake us: the next event, the "run" event or close() draws
            self._timer = loop.call_later(wait, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._safely(self._redraw)

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            # A broken drawing must not break the run that feeds it: log the bug and stop.
            _log.exception("flowmagic: the live drawing failed and stopped updating")
            self.close(redraw=False)

    def close(self, *, redraw: bool = True) -> None:
        """Stop following the flow; draw the last state if it changed since the last draw."""
        self._unsubscribe()
        self._cancel()
        if redraw and self._dirty:
            self._redraw()
