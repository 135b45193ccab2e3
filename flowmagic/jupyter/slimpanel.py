"""The panel's slimming controls: Importance -> `flow.aimportance()`, Slim -> `flow.aslim()`.

Both need a probe set (`flow.attach_probe(examples, scorer)`); until one is attached the
row is hidden (most flows never have one), and an attach made later from code shows it
(the flow's "probe" event). In a notebook the work is a task on the kernel's loop, so the panel
stays live while it runs; "slim" events (every configuration evaluated, every step tried)
are the progress line. A slimmed flow is kept on the flow (`flow.last_slim`), on the
controls (`slimmed`, `report`) and, in IPython, bound to NAME_slim unless that name holds
something else.

The buttons and the `cheaper` / `tau` fields are one row of a `Controls` (controls.py), the
panel's own beside the model dropdown: a click carries the model shown and the text typed at
that moment, so Slim never runs on values the kernel has not been told of yet.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from typing import Any

from .._internal.aio import in_loop
from ..errors import ConfigError, FlowError
from ..view.safe import text_html
from ..model.status import Status

__all__ = ["SlimControls", "derive_cheaper", "bind_slimmed"]

_RED = "#b00020"
_NO_PROBE = ("attach a probe set to rank the nodes and slim the flow: "
             "<code>{name}.attach_probe(examples, scorer)</code>")


def derive_cheaper(flow: Any, target: str | None) -> dict[str, str]:
    """{model of an active node: target} for every model that is not the target already
    (the flow's own model is named "default" when it has none)."""
    from ..llm.endpoints import resolve

    if not target:
        return {}
    goal = resolve(target)
    out: dict[str, str] = {}
    for node in flow.workflow.nodes.values():
        model = node.model or flow.settings.model or "default"
        if node.status != Status.PRUNED and model not in out and resolve(model) != goal:
            out[model] = target
    return out


def bind_slimmed(ns: dict | None, base: str, slim: Any) -> str | None:
    """Bind `slim` to BASE_slim in `ns` when that name is free or holds an earlier Flow."""
    from ..flow import Flow
    from ..magic_grammar import is_flow_name

    name = f"{base}_slim"
    if ns is None or not is_flow_name(name):
        return None
    if name in ns and not isinstance(ns[name], Flow):
        return None
    ns[name] = slim
    return name


def _tau(text: str) -> float:
    """The tau field: a number in (0, 1]."""
    try:
        tau = float(text)
    except ValueError:
        tau = float("nan")
    if not 0 < tau <= 1:
        raise ConfigError(f"tau must be a number in (0, 1], e.g. 0.95, not {text.strip()!r}")
    return tau


def _user_ns() -> dict | None:
    """The notebook's namespace when IPython runs (imported only if already loaded)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "user_ns", None)


class SlimControls:
    """Importance and Slim buttons, the cheaper-model map and tau, progress and results.

    The buttons and fields go in a row of `controls` (a new Controls when none is given);
    `widget` holds the progress line and the results."""

    def __init__(self, flow: Any, model_picker: Any = None, controls: Any = None):
        import ipywidgets as w

        from .controls import Controls

        self.flow = flow
        self._model_picker = model_picker
        self.controls = ctl = controls if controls is not None else Controls()
        self._row = len(ctl.rows)
        ctl.rows = [*ctl.rows, ["button:importance", "button:slim", "field:cheaper", "field:tau"]]
        self.importance_button = ctl.action("importance", "Importance", "sort-amount-desc")
        self.slim_button = ctl.action("slim", "Slim", "compress")
        self.cheaper = ctl.field("cheaper", "cheaper", "", "340px",
                                 "big=small, gpt-4o=gpt-4o-mini (empty: the model above)")
        self.tau = ctl.field("tau", "tau", "0.95", "130px")
        self.status = w.HTML()
        self.view = w.HTML(layout=w.Layout(overflow="auto", max_width="100%"))
        parts = [self.status, self.view] if controls is not None else [ctl, self.status,
                                                                       self.view]
        self.widget = w.VBox(parts)
        self.widget.add_class("flowmagic-slim")
        self.importance = None   # the last Importance shown
        self.slimmed = None      # the last slimmed Flow
        self.report = None       # its SlimReport
        self.bound: str | None = None   # the notebook name the slimmed flow was bound to
        self.job: asyncio.Task | None = None
        self._running: str | None = None   # "importance" | "slim" while one is under way
        self._seen = {"evaluated": 0, "tried": 0, "kept": 0}
        self.importance_button.on_click(lambda _b: self.start("importance"))
        self.slim_button.on_click(lambda _b: self.start("slim"))
        self.sync()

    # -- actions ------------------------------------------------------------------------------
    def cheaper_map(self) -> dict[str, str]:
        """The text field's map, else every node's model to the model picked above."""
        from ..magic_grammar import parse_cheaper

        if self.cheaper.value.strip():
            return parse_cheaper(self.cheaper.value)
        return derive_cheaper(self.flow, getattr(self._model_picker, "value", None))

    def options(self, what: str) -> dict:
        if what == "importance":
            return {}
        tau = _tau(self.tau.value)
        return {"cheaper": self.cheaper_map(), "tau_prune": tau, "tau_downgrade": tau}

    def start(self, what: str) -> None:
        """Run `flow.aimportance()` / `flow.aslim(...)`: a task on the running loop (a
        notebook), else to the end here (a script)."""
        if self._running is not None:   # one at a time: the buttons are disabled meanwhile
            return
        self.status.value = ""
        self._seen = dict.fromkeys(self._seen, 0)
        try:
            options = self.options(what)
        except FlowError as exc:   # a malformed cheaper map
            self._error(exc)
            return
        self._running = what
        if in_loop():
            self.job = asyncio.ensure_future(self._run(what, options))
            self.sync()
            return
        try:
            call = self.flow.importance if what == "importance" else self.flow.slim
            self.show(what, call(**options))
        except FlowError as exc:
            self._error(exc)
        finally:
            self._running = None
            self.sync()

    async def _run(self, what: str, options: dict) -> None:
        call = self.flow.aimportance if what == "importance" else self.flow.aslim
        try:
            self.show(what, await call(**options))
        except FlowError as exc:
            self._error(exc)
        except Exception as exc:   # a bug in flowmagic: nobody awaits this task, so say it here
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            self._error(f"{what} failed with {type(exc).__name__}: {exc} (a bug in flowmagic; "
                        "the traceback went to stderr)")
        finally:
            self._running = None
            self.sync()

    def show(self, what: str, result: Any) -> None:
        from ..view.display import importance_html, no_math, slim_html, slim_line

        self.status.value = ""
        if what == "importance":
            self.importance = result
            self.view.value = importance_html(result)
            return
        self.slimmed, self.report = result
        self.bound = bind_slimmed(_user_ns(), self.flow.name, self.slimmed)
        name = self.flow.name
        where = (f"bound to <code>{text_html(self.bound)}</code> (<code>%flow show "
                 f"{text_html(self.bound)}</code>); also " if self.bound else "get it with ")
        self.view.value = no_math(
            f"<div><b>{text_html(slim_line(self.report, name))}</b>; {where}"
            f"<code>flow2, report = {text_html(name)}.last_slim</code></div>",
            slim_html(self.report))

    def _error(self, exc: Any) -> None:
        self.status.value = (f'<span style="color:{_RED}">flowmagic: '
                             f"{text_html(str(exc))}</span>")

    # -- following the flow ---------------------------------------------------------------------
    def progress(self, event: dict) -> None:
        """One "slim" event: a configuration evaluated, a step tried, or the end."""
        phase, seen = event.get("phase"), self._seen
        if phase == "evaluated":
            seen["evaluated"] += 1
            last = (f"last {event.get('label')}: S={event.get('score', 0):.3f}, "
                    f"C=${event.get('cost_usd', 0):.6f}")
        elif phase == "step":
            seen["tried"] += 1
            seen["kept"] += bool(event.get("accepted"))
            last = (f"{event.get('action')} {event.get('node')} "
                    f"{'kept' if event.get('accepted') else 'rolled back'}")
        elif phase == "done":
            last = f"done: {(event.get('final') or {}).get('label', '')}"
        else:
            return
        doing = "ranking" if self._running == "importance" else "slimming"
        steps = f", {seen['tried']} steps tried, {seen['kept']} kept" if seen["tried"] else ""
        self.status.value = text_html(f"{doing}: {seen['evaluated']} configurations "
                                        f"evaluated{steps}; {last}")

    def sync(self) -> None:
        """Shown only once a probe set is attached; enabled while nothing else runs."""
        no_probe = getattr(self.flow, "probe", None) is None
        self.widget.layout.display = "none" if no_probe else ""
        hidden = [i for i in self.controls.hidden if i != self._row] + [self._row] * no_probe
        if hidden != self.controls.hidden:
            self.controls.hidden = hidden
        busy = self._running is not None or self.flow.busy
        for button in (self.importance_button, self.slim_button):
            button.disabled = no_probe or busy
        hint = _NO_PROBE.format(name=text_html(self.flow.name))
        if no_probe and not self.status.value:
            self.status.value = hint
        elif not no_probe and self.status.value == hint:
            self.status.value = ""
        self.importance_button.tooltip = (
            "needs a probe set (flow.attach_probe)" if no_probe else
            "rank the nodes: centrality, score drop without each, cost saved (flow.importance)")
        self.slim_button.tooltip = (
            "needs a probe set (flow.attach_probe)" if no_probe else
            "prune, then downgrade, while the score stays >= tau x baseline (flow.slim)")
