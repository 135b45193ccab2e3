"""What the magics and the panel show: tables and reports as text, Markdown, HTML and SVG.

Pure formatting over the Flow API's return values (no IPython, no ipywidgets), so a
terminal, a notebook and a test read the same cells. `Report` is the display object of
the `%flow` subcommands: text in a terminal, Markdown or SVG in a notebook, and the run
it came from in the output metadata.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from ..errors import FlowError
from .safe import NO_MATH, markdown_html, text_html
from ..model.status import Status

__all__ = ["Report", "table", "no_math", "html_table", "describe", "list_report", "cost_report",
           "timeline_report", "models_report", "log_report", "IMPORTANCE_HEADER",
           "importance_cells", "importance_report", "importance_html", "slim_report",
           "slim_html", "slim_line", "deliverables", "result_bundle", "status_text", "StaticView",
           "PlanningLine"]

IMPORTANCE_HEADER = ["node", "model", "degree", "betweenness", "loo", "saved_usd", "rrf",
                     "ranks", "protected"]


class Report:
    """A display object: a text table in a terminal, SVG or HTML in a notebook. No Markdown:
    HTML here is built from escaped or sanitized parts (view/safe.py); Markdown would hand
    any model text in it to the front end's own renderer."""

    def __init__(self, text: str, *, svg: str | None = None, run: str | None = None,
                 html: str | None = None):
        self.text, self.svg, self.run, self.html = text, svg, run, html

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = {"text/plain": self.text}
        if self.svg:
            data["image/svg+xml"] = self.svg
        if self.html:   # front ends prefer Markdown to SVG; HTML shows text and plot together
            data["text/html"] = self.html
        return data, {"flowmagic": {"run": self.run}}


# Dollar amounts between two `$` would be typeset as maths by JupyterLab (Markdown goes through
# MathJax across whole rows); tables are HTML, inside a block MathJax is told to skip.
_NO_MATH = f"flowmagic-table {NO_MATH}"


def table(header: list[str], rows: list[list[Any]]) -> tuple[str, str]:
    """(aligned text, HTML) of the same table; the HTML survives MathJax (see _NO_MATH)."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
    return text, no_math(html_table(header, rows))


def no_math(*parts: str) -> str:
    """HTML parts in one block that MathJax leaves alone."""
    return f'<div class="{_NO_MATH}">{"".join(parts)}</div>'


def html_table(header: list[str], rows: list[list[Any]], css_class: str = "") -> str:
    """The same cells as an HTML table (every cell escaped)."""
    head = "".join(f"<th>{text_html(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{text_html(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    cls = f' class="{css_class}"' if css_class else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# -- a flow and the notebook's flows ---------------------------------------------------------------
MAX_NODE_LINES = 60   # a plan printout stays readable (and fast) for any size of plan


def node_lines(wf, ids: list[str], line: Callable[[str, Any, list[str]], str],
               limit: int = MAX_NODE_LINES) -> list[str]:
    """`line(id, node, parents)` for the first `limit` of `ids`, then one line saying how many
    more there are; linear in the plan's size (the parents are sorted with one index)."""
    pos = {k: i for i, k in enumerate(wf.nodes)}
    out = [line(i, wf.nodes[i], sorted(wf.graph.predecessors(i), key=pos.__getitem__))
           for i in ids[:limit]]
    if len(ids) > limit:
        out.append(f"  … and {len(ids) - limit:,} more subtasks (all of them: "
                   "flow.workflow.to_dict(), or flowmagic plan --json)")
    return out


def describe(flow) -> str:
    """A few lines for a terminal: the summary, each node, the estimate, the warnings."""
    from .render import summary

    wf = flow.workflow

    def line(node_id, node, parents):
        after = ", ".join(parents) if node.status != Status.PRUNED else ""
        return (f"  {node_id} [{node.agent}, {node.status}]"
                f"{' after ' + after if after else ''}: {node.requirement}")

    lines = [summary(flow), *node_lines(wf, list(wf.nodes), line)]
    est = flow.estimate()
    lines.append(f"estimate of a run: {est['calls']} calls, ~{est['input_tokens']:,} tokens in, "
                 f"~{est['output_tokens']:,} out, ~${est['cost_usd']:.4f}")
    lines += [f"warning: {w}" for w in wf.warnings[:MAX_NODE_LINES]]
    return "\n".join(lines)


def list_report(flows: dict, runs: list[dict]) -> Report:
    rows = [[name, f.run_id, f.status, f"{f.counts().get(Status.DONE, 0)}/{f.total()}",
             f"${f.spent_usd:.4f}", f.task.splitlines()[0][:50] if f.task else ""]
            for name, f in flows.items()]
    text, flows_html = table(["flow", "run", "status", "done", "cost", "task"], rows)
    stored = [[r["id"], r["name"] or "", r["status"],
               time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated"])),
               (r["task"] or "").splitlines()[0][:50] if r["task"] else ""] for r in runs]
    s_text, s_html = table(["run", "name", "status", "updated", "task"], stored)
    none = "no flows in this notebook yet (make one with a %%flow NAME cell)"
    text = (text if rows else none) + "\n\nrecent runs (flowmagic.load(RUN)):\n" + s_text
    page = ((flows_html if rows else f"<p>{text_html(none)}</p>")
            + "<p><b>recent runs</b> (<code>flowmagic.load(RUN)</code>)</p>" + s_html)
    return Report(text, html=page)


def cost_report(flow) -> Report:
    from .render import usd

    cost = flow.cost_data()
    rows = [[r["purpose"] or "", r["node_id"] or "", r["model"], r["calls"], r["cached"] or 0,
             r["input_tokens"] or 0, r["cached_tokens"] or 0, r["output_tokens"] or 0,
             usd(r["cost_usd"], r["unpriced"])]
            for r in cost["rows"]]
    t = cost["total"]
    rows.append(["total", "", "", t["calls"], t["cached"], t["input_tokens"], t["cached_tokens"],
                 t["output_tokens"], usd(t["cost_usd"], t["unpriced"])])
    text, page = table(["purpose", "node", "model", "calls", "cached", "tokens in",
                        "of them prompt-cached", "tokens out", "USD"], rows)
    unpriced = sorted({r["model"] for r in cost["rows"] if r["unpriced"]})
    if unpriced:
        note = (f"unknown: no price is known for {', '.join(unpriced)}; give one with "
                "flowmagic.configure(prices={MODEL: (USD per 1M in, per 1M out)})")
        text, page = f"{text}\n{note}", page + no_math(f"<p>{text_html(note)}</p>")
    return Report(text, html=page, run=flow.run_id)


def timeline_report(flow) -> Report:
    from .render import timeline_svg

    rows = flow.timeline_rows()
    if not rows:
        return Report(f"flow {flow.name!r}: nothing has run yet", run=flow.run_id)
    t0 = rows[0]["start"]
    cells = [[r["node"], r["clone"] or r["agent"], r["status"], f"{r['start'] - t0:.2f}",
              f"{r['duration_s']:.2f}" if r["duration_s"] is not None else "",
              r["tokens_out"], f"${r['cost_usd']:.6f}", r.get("calls", "")] for r in rows]
    text, _ = table(["node", "agent", "status", "start s", "took s", "tokens out", "USD",
                     "calls"], cells)
    # why each call was made, for the nodes that needed more than their one attempt
    why = [f"{r['node']}: " + " · ".join(r["calls_why"]) for r in rows
           if len(r.get("calls_why") or ()) > 1]
    if why:
        text += "\nmodel calls beyond one attempt:\n" + "\n".join(why)
    idle = _idle_lines(rows)
    return Report(f"{text}\n{idle}" if idle else text, svg=timeline_svg(flow), run=flow.run_id)


def _idle_lines(rows: list[dict]) -> str:
    """The idle stretches the chart skips, one line each, so the text table does not hide
    them either."""
    import time

    from .timescale import of_rows, skipped_text

    scale, _, _ = of_rows(rows, 600, time.time())
    return "\n".join(f"idle: nothing ran for {skipped_text(b.seconds)} from {b.start:.2f} s "
                     "(the chart skips it)" for b in scale.breaks)


def models_report(key_vars: tuple[str, ...]) -> Report:
    import os

    from ..llm.endpoints import PRICES, endpoints

    rows = []
    for ep in endpoints():
        d = ep.describe()
        key = "not needed" if ep.local else d["key"]
        tick = "✓" if d["key_set"] else "✗"
        rows.append([tick, d["name"], d["base_url"], d["model"] or "(first listed)", key])
    text, page = table(["key", "endpoint", "base URL", "model", "key from"], rows)
    env = [[("✓" if os.environ.get(v) else "✗"), v] for v in key_vars]
    e_text, e_html = table(["set", "environment variable"], env)
    prices = [[name, f"{p[0]:g}", f"{p[1]:g}"] for name, p in
              sorted(PRICES.items(), key=lambda kv: (kv[1][1], kv[0]))]
    p_text, p_html = table(["model", "USD/1M in", "USD/1M out"], prices)
    s_text, s_html = _servers_table()
    return Report(f"{text}\n\n{s_text}\n\n{e_text}\n\n{p_text}",
                  html=page + s_html + e_html + p_html)


def _servers_table() -> tuple[str, str]:
    from ..llm import discovery

    if not discovery.enabled():
        line = "local servers: not looked for (FLOWMAGIC_DISCOVER=0)"
        return line, no_math(f"<p>{text_html(line)}</p>")
    servers = discovery.found()
    if not servers:
        line = ("local servers: none found on 127.0.0.1 ports "
                + ", ".join(f"{p} ({k})" for p, k in discovery.ports()))
        return line, no_math(f"<p>{text_html(line)}</p>")
    rows = [[s.kind, s.base_url, s.model or "(no chat model)",
             ", ".join(s.models[:6]) + (" ..." if len(s.models) > 6 else "")] for s in servers]
    return table(["local server", "base URL", "chat model used", "models listed"], rows)


def log_report(calls: list[dict]) -> Report:
    from .render import usd

    rows = [[c["id"], time.strftime("%H:%M:%S", time.localtime(c["ts"])), c["model"],
             c["purpose"] or "", c["node_id"] or "", c["input_tokens"] or 0,
             c["output_tokens"] or 0, f"{c['latency_s'] or 0:.2f}",
             usd(c["cost_usd"], c["cost_usd"] is None and not c["cached"] and not c["error"]),
             "yes" if c["cached"] else "",
             (c["error"] or "")[:60]] for c in calls]
    text, page = table(["id", "time", "model", "purpose", "node", "in", "out", "s", "USD",
                        "cached", "error"], rows)
    return Report(text if rows else "no model calls yet", html=page if rows else None)


# -- slimming ------------------------------------------------------------------------------------
def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def importance_cells(rows: list[dict]) -> list[list[str]]:
    """Importance.to_rows() as cells under IMPORTANCE_HEADER, most important first."""
    return [[r["node"], r["model"] or "(flow's)", _num(r["degree"], 2), _num(r["betweenness"], 2),
             _num(r["loo"], 3), _num(r["saved_usd"], 6), _num(r["rrf"], 4),
             f"deg {r['rank_degree']} · bet {r['rank_betweenness']} · loo {r['rank_loo']} · "
             f"cost {r['rank_cost']}", r["protected"] or ""] for r in rows]


def _importance_head(imp) -> str:
    b = imp.baseline
    return (f"importance ({imp.stage}; baseline S={b.score:.3f}, C=${b.cost_usd:.6f}/example, "
            f"kappa={imp.kappa}); ranks count from the least important (1); "
            "the largest RRF, the least important, comes last and is tried first")


def importance_report(imp, run: str | None = None) -> Report:
    text, _ = table(IMPORTANCE_HEADER, importance_cells(imp.to_rows()))
    return Report(f"{_importance_head(imp)}\n{text}", html=importance_html(imp), run=run)


def importance_html(imp) -> str:
    return no_math(f"<div><b>{text_html(_importance_head(imp))}</b></div>",
                   html_table(IMPORTANCE_HEADER, importance_cells(imp.to_rows()),
                              "flowmagic-importance"))


def slim_line(report, name: str) -> str:
    """One line: what slimming kept, and how to get the slimmed flow."""
    b, f = report.baseline, report.final
    return (f"slimmed {name!r} to [{f['label']}]: S {b['score']:.3f}→{f['score']:.3f}, "
            f"C ${b['cost_usd']:.6f}→${f['cost_usd']:.6f} per example")


def slim_report(report, name: str, bound: str | None = None, run: str | None = None) -> Report:
    line = slim_line(report, name)
    line += (f"; the slimmed flow is {bound} (%flow show {bound})" if bound else
             f"; get it with flow2, report = {name}.last_slim")
    return Report(f"{line}\n{report.text()}", svg=report.svg(), run=run,
                  html=no_math(f"<div><b>{text_html(line)}</b></div>", slim_html(report)))


def slim_html(report) -> str:
    """The report's text and its cost-versus-score plot (SVG needs no escaping: pareto.py
    escapes every label it writes)."""
    return no_math(f"<pre>{text_html(report.text())}</pre>", report.svg())


# -- the end of a run, and what a viewer without the live panel sees -------------------------------
def deliverables(flow) -> list[str]:
    """The files the flow exposes (`flow.files()` or a `files` list), [] when it has none."""
    files = getattr(flow, "files", None)
    try:
        files = files() if callable(files) else files
    except FlowError:   # a workspace that cannot be read is not a reason to hide the result
        return []
    return [str(f) for f in files or []]


def result_bundle(flow) -> dict[str, str] | None:
    """The final result and the deliverable files, once the run produced them: sanitized
    HTML (model text is never markup we trust, see view/safe.py) and the plain text. Each
    part is rendered on its own, so a fence the model left open cannot swallow the next."""
    files = deliverables(flow)
    if flow.result is None and not files:
        return None
    parts = []   # (Markdown, plain text)
    if flow.result is not None:
        parts.append((f"**Result of {flow.name}**\n\n{flow.result}",
                      f"Result of {flow.name}\n\n{flow.result}"))
    if files:
        parts.append(("**Files**\n\n" + "\n".join(f"- `{f}`" for f in files),
                      "Files\n\n" + "\n".join(f"- {f}" for f in files)))
    return {"text/html": "".join(markdown_html(md) for md, _ in parts),
            "text/plain": "\n\n".join(text for _, text in parts)}


def status_text(flow) -> str:
    """The status as a few lines of text: the summary, the flow's message, each node."""
    from .render import summary

    lines = [summary(flow) + f" · run {flow.run_id}"]
    if flow.message:
        lines.append(flow.message)
    lines += [f"  {i}: {n.status}" for i, n in flow.workflow.nodes.items()]
    if flow.result is not None:
        lines.append("result: " + " ".join(flow.result.split())[:300])
    files = deliverables(flow)
    if files:
        lines.append("files: " + ", ".join(files))
    return "\n".join(lines)


class StaticView:
    """The drawing (SVG and PNG) and the status as text, shown beside the live panel: what a
    reopened or shared notebook still shows when the widget is gone. `css_class` marks its
    HTML so the live panel can hide it while the panel itself is there."""

    def __init__(self, flow, css_class: str):
        self.flow, self.css_class = flow, css_class
        self.svg: str | None = None
        self.png: bytes | None = None

    def update(self, svg: str | None = None, *, png: bool = False) -> None:
        """Take the drawing's SVG text (None: draw it now), and render the PNG if asked."""
        from . import render

        self.svg = svg if svg is not None else render.svg(self.flow)
        if png and render.have_dot():
            self.png = render.png(self.flow)

    def _repr_mimebundle_(self, include=None, exclude=None):
        import base64

        if self.svg is None:
            self.update()
        text = status_text(self.flow)
        drawing = self.svg[self.svg.find("<svg"):] if "<svg" in self.svg else ""
        # The live drawing owns the element ids (node-<id>, edge-<a>-<b>): none twice on a page.
        drawing = re.sub(r'(<[^>]*\s)id="', r'\1id="static-', drawing)
        from .zoom import Zoom

        fitted = Zoom().apply(drawing)   # a big graph fits the width, as the live one does
        data = {"text/plain": text,
                "text/html": (f'<div class="flowmagic-static {self.css_class}">{fitted}'
                              f"<pre>{text_html(text)}</pre></div>")}
        if drawing:
            data["image/svg+xml"] = drawing
        if self.png is not None:
            data["image/png"] = base64.b64encode(self.png).decode("ascii")
        return data, {"flowmagic": {"run": self.flow.run_id, "static": True}}


class PlanningLine:
    """One line saying how planning goes: candidates asked, received, the one chosen; on the
    embedded model (one request at a time), roughly how long it takes."""

    def __init__(self, name: str, k: int, embedded: bool):
        self.name, self.k = name, k
        self.wait = (f"; the embedded model answers one plan at a time, ~2-6 s each "
                     f"(~{2 * k}-{6 * k} s)" if embedded else "")
        self.text = f"planning {name!r}: asking for {k} candidate plan{'s' * (k != 1)}{self.wait}"

    def event(self, event: dict) -> str:
        phase = event.get("phase")
        if phase == "received":
            failed = event["done"] - event["ok"]
            self.text = (f"planning {self.name!r}: {event['done']}/{event['k']} candidate plans "
                         f"received{f' ({failed} unusable)' if failed else ''}"
                         f"{self.wait if event['done'] < event['k'] else '; scoring them'}")
        elif phase == "chosen":
            self.text = (f"planned {self.name!r}: {event['usable']} of {event['k']} candidate "
                         f"plans usable; candidate {event['chosen']} chosen (the panel lists "
                         "them all)")
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.text}, {}
