"""The control panel of a Flow (ipywidgets): every button is one public `Flow` method.

Run -> `flow.run()`, Step -> `flow.step()`, Pause/Resume -> `flow.pause()` / `flow.resume()`,
Stop -> `flow.stop()`, Prune -> `flow.prune(node)`, Unprune -> `flow.unprune(node)`,
Downgrade -> `flow.downgrade(node, model)`, Rerun -> `flow.rerun(node)`, Use plan ->
`flow.use_candidate(i)`; −, Fit and + change only the view (`panel.zoom`, a view.zoom.Zoom:
`zoom_out()`, `fit()`, `zoom_in()`; the drawing fits the panel's width by default). Show
output reads `node.output` (while a node runs, the text it streamed so far,
`flow.partial_output(node)`: the panel turns `flow.streaming` on); with a probe set attached,
Importance -> `flow.aimportance()` and Slim -> `flow.aslim(cheaper=...)`
(flowmagic.jupyter.slimpanel). When the run ends the result and the deliverable files show.
The node, model and plan dropdowns and the buttons acting on them are anywidgets
(flowmagic.jupyter.controls) whose click carries the choices the page shows, so a click made
while the kernel is busy acts on the node the user saw chosen.
`show()` also displays a static copy (the drawing as SVG and PNG, the status as text) that
the live panel hides while it is there: a reopened or shared notebook still shows the flow.
The panel follows the Flow through `flow.subscribe`, so a change made from code, a magic
or another panel shows here too. In a notebook the run is a task on the kernel's loop, so
these buttons stay live while nodes run. `ChatView` (flowmagic.jupyter.chatview) is the live
view of an orchestration.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, Callable

from .chatview import ChatView
from .._internal.aio import in_loop
from ..errors import FlowError
from ..view.safe import text_html
from .slimpanel import SlimControls
from ..model.status import RunState, Status

__all__ = ["Panel", "ChatView", "SlimControls", "model_choices"]

_RED = "#b00020"


def model_choices() -> list[tuple[str, str]]:
    """(label, model id) for the Downgrade dropdown: each endpoint, then the chat models it
    lists (GET /models); when the default endpoint cannot list them, the priced models from
    the cheapest up (a downgrade is usually to something cheaper)."""
    from ..llm import catalog
    from ..llm.endpoints import PRICES, endpoints, price_of

    def label(value: str, model: str) -> str:
        price = price_of(model)
        return f"{value} (${price[0]:g} / ${price[1]:g} per 1M)" if price else f"{value} (price unknown)"

    out: list[tuple[str, str]] = []
    listed_default = False
    for ep in endpoints():
        if ep.local:
            value = "local"
        elif ep.name == "default":
            value = ep.model or "default"
        else:
            value = f"{ep.name}:{ep.model}" if ep.model else ep.name
        where = "embedded" if ep.local else ep.name
        out.append((f"{value} ({where})", value))
        ids = catalog.listed_models(ep) if catalog.enabled() else None
        if ids is None:
            continue
        listed_default = listed_default or ep.name == "default"
        prefix = "" if ep.name == "default" else f"{ep.name}:"
        out += [(label(prefix + m, m), prefix + m) for m in catalog.chat_models(ids)]
    if not listed_default:
        for name, (p_in, p_out) in sorted(PRICES.items(), key=lambda kv: (kv[1][1], kv[0])):
            if name in catalog.chat_models([name]):   # embedding models cannot run a node
                out.append((f"{name} (${p_in:g} / ${p_out:g} per 1M)", name))
    seen: set[str] = set()
    return [(text, value) for text, value in out if not (value in seen or seen.add(value))]


def _svg_only(content: str) -> str:
    """The <svg> element of graphviz output (an XML prolog means nothing inside HTML)."""
    start = content.find("<svg")
    if start < 0:
        return f"<pre>{text_html(content)}</pre>"
    return content[start:]


def _queue_line(queued: dict[str, int]) -> str:
    """"waiting for the model (N ahead): ..." for the nodes whose call waits for a local
    server, the nearest first; "" when none does."""
    if not queued:
        return ""
    order = sorted(queued.items(), key=lambda item: item[1])
    shown = ", ".join(f"{node} ({ahead} ahead)" for node, ahead in order[:4])
    more = f" and {len(order) - 4} more" if len(order) > 4 else ""
    return f"waiting for the model: {shown}{more}"


def _fmt_int(n: Any) -> str:
    return f"{int(n or 0):,}"


class Panel:
    """Drawing, buttons, node picker, progress, tokens-and-cost meter, update log, warnings.

    `panel.widget` is the ipywidgets box; `display(panel)` shows it (text/plain and the
    static drawing ride along for viewers without widgets). `close()` stops following.
    """

    def __init__(self, flow: Any, *, models: list[tuple[str, str]] | None = None):
        import ipywidgets as w

        from ..view.display import StaticView

        self.flow = flow
        flow.streaming = True               # so Show output can follow a node already running
        self._watching: str | None = None   # the node whose output is shown
        self._queued: dict[str, int] = {}   # node -> requests ahead of its model call
        self._following = False             # a task awaits the current run (see follow())
        self._shown_result: str | None = None
        marker = f"flowmagic-static-{secrets.token_hex(4)}"
        self.static = StaticView(flow, marker)
        self._static_handle = None
        self._drawing_widgets(w, marker)
        self._choice_widgets(flow, models)
        self._info_widgets(w)
        self._lay_out(w)
        self._wire()
        from ..view.render import LiveDrawing
        self._live = LiveDrawing(flow, update=self._set_drawing)
        self._unsubscribe = flow.subscribe(self._on_event)
        self.refresh()

    def _drawing_widgets(self, w, marker: str) -> None:
        """The title, the drawing with its zoom buttons and legend, and the run buttons."""
        from ..view.render import legend_html

        self.title = w.HTML()
        self.drawing = w.HTML(layout=w.Layout(overflow="auto", max_width="100%",
                                              max_height="640px"))
        self.drawing.add_class("flowmagic-drawing")
        from ..view.zoom import Zoom
        self.zoom = Zoom()        # fit to the width by default; the buttons below change it
        self._svg = ""
        self.zoom_out_button = self._button("", "search-minus", "smaller")
        self.fit_button = self._button("Fit", "arrows-h", "fit the drawing to the width")
        self.zoom_in_button = self._button("", "search-plus", "larger")
        self.zoom_label = w.HTML()
        self.zoom_label.add_class("flowmagic-zoom")
        # While this widget is on the page its style hides the static copy; when the
        # widget is gone (a restarted kernel, a shared file) the copy shows.
        self.legend = w.HTML(f"<style>.{marker}{{display:none}}</style>{legend_html()}")
        self.run_button = self._button("Run", "play", "run every node that can run")
        self.step_button = self._button("Step", "step-forward", "run the nodes that are ready now")
        self.pause_button = self._button("Pause", "pause", "nothing new starts; running nodes finish")
        self.stop_button = self._button("Stop", "stop", "cancel running nodes (they go back to pending)")

    def _choice_widgets(self, flow: Any, models: list[tuple[str, str]] | None) -> None:
        """The pickers (node, model, candidate plan) and the buttons that act on a choice."""
        # The node and model dropdowns and the buttons that act on them are one anywidget:
        # a click carries the choices shown at that moment (see controls.py).
        from .controls import Controls
        self.choice_controls = ctl = Controls(rows=[
            ["picker:node", "button:prune", "button:unprune", "button:rerun", "button:output"],
            ["picker:model", "button:downgrade"]])
        self.node_picker = ctl.picker("node", "node", list(flow.workflow.nodes), "260px")
        self.model_picker = ctl.picker("model", "model", models or model_choices(), "340px")
        self.prune_button = ctl.action("prune", "Prune", "cut",
                                       "remove the node; its parents feed its children")
        self.unprune_button = ctl.action("unprune", "Unprune", "undo",
                                         "bring the pruned node back with its edges")
        self.downgrade_button = ctl.action("downgrade", "Downgrade", "arrow-down",
                                           "run the node on the chosen model")
        self.rerun_button = ctl.action("rerun", "Rerun", "redo",
                                       "run the node again; descendants become pending")
        self.output_button = ctl.action("output", "Show output", "file-text",
                                        "the node's output as Markdown")
        self.plan_controls = Controls(rows=[["picker:plan", "button:use"]])
        self.candidate_picker = self.plan_controls.picker("plan", "plan", (), "420px")
        self.use_button = self.plan_controls.action(
            "use", "Use plan", "random", "switch to this candidate plan (before anything has run)")
        self.slim = SlimControls(flow, self.model_picker, ctl)   # a row of choice_controls
        self.importance_button = self.slim.importance_button
        self.slim_button = self.slim.slim_button

    def _info_widgets(self, w) -> None:
        """What the panel tells: node info, progress, meter, messages, outputs, log."""
        self.node_info = w.HTML()
        self.progress = w.IntProgress(min=0, max=1, value=0, description="0/0 done",
                                      style={"description_width": "initial"})
        self.meter = w.HTML()
        self.message = w.HTML()
        self.output = w.Output(layout=w.Layout(max_height="320px", overflow="auto"))
        self.output.add_class("flowmagic-output")
        self.result = w.Output(layout=w.Layout(max_height="480px", overflow="auto"))
        self.result.add_class("flowmagic-result")
        self.log = w.HTML()
        self.warnings = w.HTML()
        self.candidates = w.HTML()

    def _lay_out(self, w) -> None:
        self.widget = w.VBox([
            self.title, self.drawing,
            w.HBox([self.zoom_out_button, self.fit_button, self.zoom_in_button, self.zoom_label]),
            self.legend,
            w.HBox([self.run_button, self.step_button, self.pause_button, self.stop_button]),
            self.choice_controls, self.slim.widget,
            self.node_info, w.HBox([self.progress, self.meter]), self.message,
            self.output, self.result, self.warnings,
            self.plan_controls, self.candidates, self.log])
        self.widget.add_class("flowmagic-panel")

    @staticmethod
    def _button(label: str, icon: str, tip: str):
        import ipywidgets as w
        return w.Button(description=label, icon=icon, tooltip=tip,
                        layout=w.Layout(width="auto"))

    def _wire(self) -> None:
        clicks: dict[Any, Callable[[], Any]] = {
            self.run_button: self.flow.run,
            self.step_button: self.flow.step,
            self.pause_button: self._pause_or_resume,
            self.stop_button: self.flow.stop,
            self.prune_button: lambda: self._on_node("pruned", self.flow.prune),
            self.unprune_button: lambda: self._on_node("brought back", self.flow.unprune),
            self.use_button: lambda: self.flow.use_candidate(self.candidate_picker.value),
            self.downgrade_button: lambda: self._on_node(
                f"moved to {self.model_picker.value}:", self.flow.downgrade,
                self.model_picker.value),
            self.rerun_button: lambda: self._on_node("running again:", self.flow.rerun),
            self.output_button: lambda: self.show_output(self.node_picker.value),
        }
        zooms = {self.zoom_in_button: lambda: self.zoom.zoom_in(self._svg),
                 self.zoom_out_button: lambda: self.zoom.zoom_out(self._svg),
                 self.fit_button: self.zoom.fit}
        for button, action in zooms.items():   # the view only: nothing of the flow changes
            button.on_click(lambda _b, action=action: (action(), self._show_zoomed()))
        for button, action in clicks.items():
            button.on_click(lambda _b, action=action: self._act(action))
        self.node_picker.observe(lambda _c: self.refresh(), names="value")
        self.model_picker.observe(lambda _c: self._sync_buttons(), names="value")
        self.candidate_picker.observe(lambda _c: self._sync_buttons(), names="value")

    # -- actions ---------------------------------------------------------------------
    def _act(self, action: Callable[[], Any]) -> None:
        """Run one Flow method; a FlowError is one red line in the panel, never a traceback."""
        self.message.value = ""
        try:
            action()
        except FlowError as exc:
            self._error(exc)
        self.follow()
        self.refresh()

    def _on_node(self, done: str, method: Callable[..., Any], *args: Any) -> None:
        """Act on the chosen node (the one the click carried) and say which one."""
        node = self.node_picker.value
        method(node, *args)
        self.message.value = f"{text_html(done)} <b>{text_html(node)}</b>"

    def _error(self, exc: BaseException) -> None:
        self.message.value = (f'<span style="color:{_RED}">flowmagic: '
                              f"{text_html(str(exc))}</span>")

    def follow(self) -> None:
        """When a run is under way on this loop, show how it ends (a FlowError as one line)."""
        if self.flow.busy and in_loop() and not self._following:
            self._following = True
            asyncio.ensure_future(self._await_run())

    async def _await_run(self) -> None:
        try:
            await self.flow.wait()
        except FlowError as exc:   # e.g. the endpoint failed while consolidating
            self._error(exc)
        except asyncio.CancelledError:
            pass
        finally:
            self._following = False
        self.refresh()

    def _pause_or_resume(self) -> None:
        if self.flow.busy:
            self.flow.pause()
        else:
            self.flow.resume()

    def show_output(self, node_id: str | None) -> None:
        """Show a node's output (its Markdown, sanitized); while it runs, its text as it streams in."""
        self.flow.workflow.node(node_id)  # NodeError for an unknown id
        self._watching = node_id
        self._render_output()

    def _render_output(self) -> None:
        node = self.flow.workflow.nodes.get(self._watching or "")
        if node is None:
            self.output.outputs = ()
            return
        from ..view.safe import model_bundle, streamed_bundle

        waiting = self._queued.get(node.id) if node.status == Status.RUNNING else None
        state = node.status if waiting is None else f"waiting for the model ({waiting} ahead)"
        head = f"**{node.id}** ({node.agent}, {state})\n\n"
        if node.status == Status.RUNNING:   # as it arrives; rendered as Markdown once done
            data = streamed_bundle(self.flow.partial_output(node.id), head=head)
        else:
            data = model_bundle(node.output or f"*{node.id} has no output yet ({node.status})*",
                                head=head)
        self.output.outputs = ({"output_type": "display_data", "metadata": {}, "data": data},
                               *self._figures(node))

    def _figures(self, node) -> list[dict]:
        """The figures the node's code drew (PNG files in the workspace), as images; a line
        for those left out (see ops.codecells.figure_data's caps)."""
        from ..ops.codecells import figure_data, left_out

        names = list((node.execution or {}).get("figures") or []) if node.status != Status.RUNNING else []
        found = figure_data(self.flow.workspace.root, names) if names else {}
        meta = {"run": self.flow.run_id, "node": node.id}
        shown = [{"output_type": "display_data",
                  "metadata": {"flowmagic": {**meta, "figure": name}},
                  "data": {"image/png": data, "text/plain": f"<figure {name}>"}}
                 for name, data in found.items()]
        line = left_out(names, found)
        return shown + ([{"output_type": "display_data", "metadata": {"flowmagic": meta},
                          "data": {"text/plain": line}}] if line else [])

    def _render_result(self) -> None:
        """The result and the files, once the run is over and has them."""
        from ..view.display import result_bundle

        shown = None if self.flow.busy else result_bundle(self.flow)
        if shown == self._shown_result:
            return
        self._shown_result = shown
        self.result.outputs = () if shown is None else (
            {"output_type": "display_data", "metadata": {"flowmagic": {"run": self.flow.run_id}},
             "data": shown},)

    # -- following the flow -------------------------------------------------------------
    def _set_drawing(self, content: str) -> None:
        self._svg = _svg_only(content)
        self._show_zoomed()
        if self._static_handle is not None:
            # The PNG (a second render) only when nothing runs: at the end, after a click.
            self.static.update(content if content.lstrip().startswith("<") else None,
                               png=not self.flow.busy)
            self._static_handle.update(self.static)

    def _show_zoomed(self) -> None:
        self.drawing.value = self.zoom.apply(self._svg)
        self.zoom_label.value = f"<small>{self.zoom.label()}</small>"

    def show(self) -> None:
        """Display the panel and, beside it, the static copy that outlives the widget."""
        from IPython.display import display

        display(self)
        self.static.update(png=True)
        self._static_handle = display(self.static, display_id=True)

    def _on_event(self, event: dict) -> None:
        kind, node_id = event.get("kind"), event.get("node")
        if kind == "slim":   # slimming works on copies: nothing here changes but its progress
            self.slim.progress(event)
            return
        if kind == "probe":  # a probe set attached from code enables Importance and Slim
            self.slim.sync()
            return
        if kind == "text":
            if node_id == self._watching:
                self._render_output()
            return
        if kind == "waiting":   # a model call's place in a local server's queue
            if event.get("ahead") is None:
                self._queued.pop(node_id, None)
            else:
                self._queued[node_id] = event["ahead"]
            line = _queue_line(self._queued)
            if line or "waiting for the model" in self.message.value:   # not another message
                self.message.value = text_html(line)
            if node_id == self._watching:
                self._render_output()
            return
        if kind == "pausing" or kind == "run" and event.get("message"):
            self.message.value = text_html(str(event["message"]))
        elif kind == "run" and self.message.value.startswith("pausing"):
            self.message.value = ""
        if not in_loop():
            # LiveDrawing coalesces with a timer on the running loop; a change made outside
            # any loop (a script's prune()) would wait for the next event, so draw it now.
            from ..view.render import svg
            self._set_drawing(svg(self.flow))
        self.refresh()
        if node_id is not None and node_id == self._watching:
            self._render_output()

    def refresh(self) -> None:
        """Bring every part except the drawing (LiveDrawing owns it) up to date."""
        with self.choice_controls.hold_sync(), self.plan_controls.hold_sync():   # one message each
            self._refresh()

    def _refresh(self) -> None:
        flow, wf = self.flow, self.flow.workflow
        counts = flow.counts()
        done, total = counts.get(Status.DONE, 0), flow.total()
        self.title.value = (f"<b>{text_html(flow.name)}</b> · {text_html(flow.status)} · "
                            f"run {text_html(flow.run_id)}")
        self.progress.max = max(total, 1)
        self.progress.value = done
        self.progress.description = f"{done}/{total} done"
        self.progress.bar_style = ("danger" if counts.get(Status.FAILED) else
                                   "success" if total and done == total else "info")
        self._sync_nodes(list(wf.nodes))
        self.meter.value = self._meter()
        self.node_info.value = self._node_info()
        self.warnings.value = self._list("warnings", wf.warnings)
        self.log.value = self._list("updates", [self._update_line(e) for e in flow.update_log])
        self.candidates.value = self._list("candidate plans", self._candidate_lines())
        self._sync_candidates()
        self._render_result()
        self._sync_buttons()

    def _sync_nodes(self, ids: list[str]) -> None:
        if list(self.node_picker.options) != ids:
            keep = self.node_picker.value
            self.node_picker.options = ids
            if keep in ids:
                self.node_picker.value = keep

    def _sync_candidates(self) -> None:
        from ..engine.planner import candidate_line

        options = [(candidate_line(c, self.flow.chosen).strip()[:110], c.index)
                   for c in self.flow.candidates if getattr(c, "workflow", None) is not None]
        if list(self.candidate_picker.options) != options:
            self.candidate_picker.options = options
            if any(i == self.flow.chosen for _, i in options):
                self.candidate_picker.value = self.flow.chosen
        self.plan_controls.layout.display = "" if len(options) > 1 else "none"

    def _sync_buttons(self) -> None:
        flow = self.flow
        busy, ready = flow.busy, bool(flow.workflow.ready())
        self.run_button.disabled = self.step_button.disabled = busy or not ready
        paused = not busy and flow.status == RunState.PAUSED and ready
        self.pause_button.description, self.pause_button.icon = (
            ("Resume", "play") if paused else ("Pause", "pause"))
        self.pause_button.disabled = not (busy or paused)
        self.stop_button.disabled = not busy
        node = flow.workflow.nodes.get(self.node_picker.value or "")
        fixed = node is None or node.status in (Status.RUNNING, Status.PRUNED)
        self.prune_button.disabled = fixed
        self.unprune_button.disabled = node is None or node.status != Status.PRUNED
        ran = any(n.status in (Status.DONE, Status.RUNNING, Status.FAILED) for n in flow.workflow.nodes.values())
        self.use_button.disabled = (busy or ran or self.candidate_picker.value is None
                                    or self.candidate_picker.value == flow.chosen)
        self.downgrade_button.disabled = (fixed or not self.model_picker.value
                                          or self.model_picker.value == node.model)
        # While a run finishes (consolidating, no node running) a rerun would not be picked
        # up by that run, so it waits until the run is over.
        finishing = busy and not any(n.status == Status.RUNNING for n in flow.workflow.nodes.values())
        self.rerun_button.disabled = fixed or finishing or node.status not in (Status.DONE, Status.FAILED)
        self.output_button.disabled = node is None or not (
            node.output is not None or node.status == Status.RUNNING)
        self.slim.sync()

    def _meter(self) -> str:
        from ..view.render import usd

        total = self.flow.cost_data()["total"]
        reused = (f" ({_fmt_int(total['cached_tokens'])} from the prompt cache)"
                  if total["cached_tokens"] else "")
        line = (f"tokens {_fmt_int(total['input_tokens'])} in{reused} · "
                f"{_fmt_int(total['output_tokens'])} out · "
                f"{usd(total['cost_usd'], total['unpriced'], 4)} "
                f"({total['calls']} calls, {total['cached']} cached)")
        try:
            est = self.flow.estimate()
        except FlowError:
            return line
        if est["output_tokens"]:
            line += (f" · still to run: ~{_fmt_int(est['input_tokens'] + est['output_tokens'])}"
                     f" tokens, ~${est['cost_usd']:.4f}")
        budget = self.flow.settings.budget_usd
        if budget is not None:
            line += f" · budget ${float(budget):.4f}"
        return line

    def _node_info(self) -> str:
        node = self.flow.workflow.nodes.get(self.node_picker.value or "")
        if node is None:
            return ""
        from ..view.render import ran_on_model

        model = node.model or self.flow.settings.model or "default"
        if model == "default":   # say which model that is
            try:
                from ..llm.endpoints import resolve
                endpoint, name = resolve(None)
                where = "embedded" if endpoint.local else "default"
                model = f"{name or 'the endpoint’s first model'} ({where})"
            except FlowError:
                pass
        ran = node.ran_on()
        if node.downgraded_from and ran and not ran_on_model(ran, node.model):
            # history first: a downgrade after the run changes the next run, not this one
            model = f"ran on {ran} · next run: {node.model}"
        elif node.downgraded_from:
            model = f"{node.downgraded_from} → {node.model}"
        bits = [f"<b>{text_html(node.id)}</b> ({text_html(node.agent)}, {node.status}"
                f"{', stale' if node.stale else ''}) · model {text_html(str(model))}",
                text_html(node.requirement)]
        if node.error:
            bits.append(f'<span style="color:{_RED}">{text_html(node.error)}</span>')
        if node.attempts:
            from ..engine.calls import calls_text, node_calls
            from ..engine.numbers import untraced_mark
            bits.append(text_html(calls_text(node_calls(node, self.flow.update_log))))
            loose = node.attempts[-1].get("untraced") if node.attempts[-1].get("passed") else None
            if loose:
                bits.append(f'<span style="color:{_RED}">{text_html(untraced_mark(loose))}</span>')
        return "<br>".join(bits)

    def _candidate_lines(self) -> list[str]:
        from ..engine.planner import candidate_line

        return [candidate_line(c, self.flow.chosen) for c in self.flow.candidates
                if hasattr(c, "ok")]

    @staticmethod
    def _update_line(entry: dict) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(entry.get("time") or 0))
        trigger = ", ".join(entry.get("trigger") or []) or "progress"
        if entry.get("no_change"):
            what = "no change"
        else:
            stats = entry.get("stats") or {}
            what = ", ".join(f"{k} {v}" for k, v in stats.items() if v) or "changed the plan"
        return f"{when} {entry.get('strategy', '')} update after {trigger}: {what}"

    @staticmethod
    def _list(title: str, items: list[str]) -> str:
        if not items:
            return ""
        rows = "".join(f"<li>{text_html(str(i))}</li>" for i in items[-10:])
        return f"<details><summary>{title} ({len(items)})</summary><ul>{rows}</ul></details>"

    @property
    def slimmed(self):
        """The flow the last Slim click produced (also `flow.last_slim[0]`), or None."""
        return self.slim.slimmed

    # -- display --------------------------------------------------------------------
    def close(self) -> None:
        """Stop following the flow and close the widgets."""
        self._unsubscribe()
        self._live.close(redraw=False)
        stack = [self.widget]
        while stack:   # Widget.close_all() would close every widget in the kernel
            widget = stack.pop()
            stack.extend(getattr(widget, "children", ()))
            widget.close()

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..view.render import summary

        data = self.widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        data["text/plain"] = summary(self.flow)
        return data
