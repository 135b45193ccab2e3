"""The live chat view of an orchestration (ipywidgets), fed by `Orchestrator.subscribe`.

Each message appears once, when it is stored: sender → recipient, its kind and turn, its
tokens and cost, and its content rendered as Markdown. Above the messages: who is working
now, the running total (calls, tokens, USD) and a Stop button (`orch.stop()`: running
calls are cancelled and the best answer so far is submitted). Below them, once submitted,
the answer, highlighted. A finished `Orchestration` (e.g. from `load_orchestration`) can
be shown the same way, without the live parts.
"""

from __future__ import annotations

from typing import Any

from ..view.safe import text_html
from ..model.status import AnswerState

__all__ = ["ChatView", "message_markdown"]

_ANSWER_STYLE = {"border": "2px solid #2ca02c", "padding": "4px 8px", "margin": "6px 0 0 0"}


def message_markdown(m: dict) -> str:
    """One message as Markdown: a header line, then its content as the model wrote it."""
    bits = [m["kind"], f"turn {m['turn']}"]
    if m.get("tokens_in") or m.get("tokens_out"):
        bits.append(f"{m['tokens_in']:,}+{m['tokens_out']:,} tokens, ${m['cost_usd']:.6f}"
                    + (", cached" if m.get("cached") else ""))
    head = f"**{m['sender']} → {m['recipient']}** · {' · '.join(bits)}"
    content = m["content"] or "*(empty)*"
    if m["kind"] in ("error", "note"):
        content = f"*{content}*"
    return f"{head}\n\n{content}"


def _markdown_output(text: str, plain: str, layout: Any = None):
    """An Output showing `text` (Markdown with model text in it) as sanitized HTML."""
    import ipywidgets as w

    from ..view.safe import markdown_html

    out = w.Output(layout=layout) if layout is not None else w.Output()
    out.outputs = ({"output_type": "display_data", "metadata": {},
                    "data": {"text/html": markdown_html(text), "text/plain": plain}},)
    return out


class ChatView:
    """`ChatView(orchestrator)`: the transcript as it grows; `display(view)` shows it.

    `shown` lists the seq of every message shown, in order; `close()` stops following.
    """

    def __init__(self, orch: Any):
        import ipywidgets as w

        self.orch = orch
        self.result = getattr(orch, "result", orch)   # an Orchestrator, or an Orchestration
        self.live = live = hasattr(orch, "subscribe")
        self.title = w.HTML()
        self.activity = w.HTML()
        self.totals = w.HTML()
        self.stop_button = w.Button(
            description="Stop", icon="stop", layout=w.Layout(width="auto"),
            tooltip="cancel running calls; the best answer so far is submitted")
        self.stop_button.on_click(lambda _b: self.stop())
        self.messages = w.VBox(layout=w.Layout(max_height="480px", overflow="auto"))
        self.answer = w.VBox()
        self.widget = w.VBox([self.title, w.HBox([self.stop_button, self.totals]), self.activity,
                              self.messages, self.answer])
        self.widget.add_class("flowmagic-chat")
        self.shown: list[int] = []
        self._working: list[str] = []
        self._turn = 0
        self._stopping = False
        self._tool = ""   # the last tool call, e.g. "writer called lookup()"
        self._unsubscribe = orch.subscribe(self._on_event) if live else (lambda: None)
        for m in self.result.transcript:   # what happened before the view was made
            self._add(m.to_dict())
        if self.finished or not live:
            self._finish()
        self._refresh()

    @property
    def finished(self) -> bool:
        return self.result.status != AnswerState.RUNNING

    def stop(self) -> None:
        """The Stop button: `orch.stop()`."""
        if self.live and not self.finished:
            self.orch.stop()
            self._stopping = True
            self._refresh()

    # -- events ------------------------------------------------------------------------------
    def _on_event(self, event: dict) -> None:
        kind = event.get("kind")
        if kind == "turn":
            self._turn, self._working = event.get("turn", self._turn), []
        elif kind == "working" and event.get("agent") not in self._working:
            self._working.append(event.get("agent"))
        elif kind == "message":
            self._add(event["message"])
        elif kind == "tool":
            self._tool = f"{event.get('agent')} called {(event.get('call') or {}).get('tool')}()"
        elif kind == "submitted":
            self._working = []
            self._finish()
        self._refresh()

    def _add(self, m: dict) -> None:
        if m["seq"] in self.shown:
            return
        self.shown.append(m["seq"])
        if m["sender"] in self._working:
            self._working.remove(m["sender"])
        text = message_markdown(m)
        self.messages.children = (*self.messages.children, _markdown_output(text, text))

    def _finish(self) -> None:
        o = self.result
        if not o.answer and not self.finished:
            return
        self.stop_button.disabled = True
        how = f"{o.status}, ended by {o.ended_by}" + (f"; {o.note}" if o.note else "")
        text = f"**Answer** ({how})\n\n{o.answer or '*(no answer)*'}"
        box = _markdown_output(text, o.answer or "", _layout())
        box.add_class("flowmagic-answer")
        self.answer.children = (box,)

    def _refresh(self) -> None:
        o = self.result
        state = "stopping" if self._stopping and not self.finished else o.status
        turn = max(self._turn, len(o.turns))
        self.title.value = (f"<b>{text_html(o.name)}</b> · orchestrator · {text_html(state)}"
                            f" · turn {turn} · run {text_html(o.run_id)}")
        self.totals.value = (f"{len(self.shown)} messages · {o.calls} calls ({o.cached_calls} "
                             f"cached) · tokens {o.tokens_in:,} in · {o.tokens_out:,} out · "
                             f"${o.cost_usd:.4f}")
        bits = [f"working: {', '.join(self._working)}"] if self._working else []
        bits += [self._tool] if self._tool and not self.finished else []
        self.activity.value = text_html(" · ".join(bits))
        self.stop_button.disabled = not self.live or self.finished or self._stopping

    # -- display --------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop following and close the widgets of this view."""
        self._unsubscribe()
        stack = [self.widget]
        while stack:
            widget = stack.pop()
            stack.extend(getattr(widget, "children", ()))
            widget.close()

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..orchestrator.protocol import transcript_text

        data = self.widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        data["text/plain"] = transcript_text(self.result)
        return data


def _layout():
    import ipywidgets as w
    return w.Layout(**_ANSWER_STYLE)
