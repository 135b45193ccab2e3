"""Dropdowns, text fields and the buttons that act on their choices, as one anywidget.

ipywidgets sends a button's click to the kernel at once, but holds a dropdown's change back
while an earlier change of that dropdown is unanswered: a user who picks node B and clicks
Prune while the kernel is busy gets the node chosen before pruned. Here a click is one
custom message, `{"action": name, "choices": {picker: value, ...}}`, holding what every
dropdown and text field of the widget showed at the click, and the kernel acts on those
choices. The front end is `controls.js` beside this file (shipped in the package, no fetch
at render time); it shows option texts and field texts as text, never as markup.

`Controls.picker(...)`, `Controls.field(...)` and `Controls.action(...)` hand back small
objects shaped like an ipywidgets Dropdown (`value`, `options`, `observe`), Text (`value`) and
Button (`on_click`, `click()`, `disabled`, `description`, `icon`, `tooltip`), so the panel and
its tests use them as before. `hidden` lists the rows not shown.
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import anywidget
import traitlets

__all__ = ["Controls", "Picker", "Field", "Action"]


class Controls(anywidget.AnyWidget):
    """Rows of pickers, text fields and buttons; `rows` names them, e.g.
    [["picker:node", "button:prune"], ["button:slim", "field:tau"]]."""

    _esm = pathlib.Path(__file__).with_name("controls.js")
    _css = pathlib.Path(__file__).with_name("controls.css")
    rows = traitlets.List().tag(sync=True)
    # name -> {"label": str, "width": str, "options": [[text, value], ...]}
    pickers = traitlets.Dict().tag(sync=True)
    # name -> {"label": str, "width": str, "placeholder": str}
    fields = traitlets.Dict().tag(sync=True)
    # picker or field name -> the value chosen or typed (the front end writes it)
    choices = traitlets.Dict().tag(sync=True)
    hidden = traitlets.List().tag(sync=True)   # indices of rows not shown
    # name -> {"label", "icon", "tip", "disabled"}
    buttons = traitlets.Dict().tag(sync=True)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._clicked: dict[str, Any] = {}   # the choices a click carried, while it is handled
        self._handlers: dict[str, list[Callable[[Any], Any]]] = {}
        self._pickers: dict[str, Picker] = {}
        self._fields: dict[str, Field] = {}
        self._actions: dict[str, Action] = {}
        self.on_msg(lambda _widget, content, _buffers: self.receive(content))
        self.observe(self._on_choices, names="choices")

    def picker(self, name: str, label: str, options: Any = (), width: str = "260px") -> "Picker":
        self.pickers = {**self.pickers, name: {"label": label, "width": width, "options": []}}
        self._pickers[name] = Picker(self, name)
        self._pickers[name].options = options
        return self._pickers[name]

    def field(self, name: str, label: str, value: str = "", width: str = "200px",
              placeholder: str = "") -> "Field":
        self.fields = {**self.fields, name: {"label": label, "width": width,
                                             "placeholder": placeholder}}
        self._fields[name] = Field(self, name)
        self._fields[name].value = value
        return self._fields[name]

    def action(self, name: str, label: str, icon: str = "", tip: str = "") -> "Action":
        self.buttons = {**self.buttons, name: {"label": label, "icon": icon, "tip": tip,
                                               "disabled": False}}
        self._actions[name] = Action(self, name)
        return self._actions[name]

    def on_click(self, name: str, handler: Callable[[Any], Any]) -> None:
        """`handler(action)` on each click of button `name`."""
        self._handlers.setdefault(name, []).append(handler)

    def chosen(self, name: str) -> Any:
        """The choice of picker or field `name`: the one a click carried while that click is
        handled."""
        return self._clicked[name] if name in self._clicked else self.choices.get(name)

    def click(self, name: str, choices: dict | None = None) -> None:
        """Run the handlers of button `name` on `choices` (default: the kernel's own)."""
        self._clicked = {k: v for k, v in (choices or {}).items()
                         if k in self._pickers or (k in self._fields and isinstance(v, str))}
        try:
            for handler in list(self._handlers.get(name, ())):
                handler(self._actions[name])
        finally:
            self._clicked = {}

    def receive(self, content: Any) -> None:
        """A message from the front end: `{"action": button, "choices": {picker: value}}`;
        anything else is ignored."""
        if isinstance(content, dict) and content.get("action") in self._actions:
            choices = content.get("choices")
            self.click(content["action"], choices if isinstance(choices, dict) else None)

    def _on_choices(self, change: dict) -> None:
        old, new = change["old"] or {}, change["new"] or {}
        for name, picker in self._pickers.items():
            if old.get(name) != new.get(name):
                picker.changed(old.get(name), new.get(name))


class Picker:
    """One dropdown of a Controls, used as an ipywidgets Dropdown is."""

    def __init__(self, controls: Controls, name: str):
        self._controls, self.name = controls, name
        self._options: tuple = ()
        self._observers: list[Callable[[dict], Any]] = []

    @property
    def options(self) -> tuple:
        """As given: plain values, or (text, value) pairs."""
        return self._options

    @options.setter
    def options(self, options: Any) -> None:
        self._options = tuple(options)
        c = self._controls
        spec = dict(c.pickers[self.name])
        spec["options"] = [[str(o[0]), o[1]] if isinstance(o, (tuple, list)) else [str(o), o]
                           for o in self._options]
        values = [v for _, v in spec["options"]]
        with c.hold_sync():
            c.pickers = {**c.pickers, self.name: spec}
            if self.value not in values:   # as a Dropdown does: the first option, or none
                c.choices = {**c.choices, self.name: values[0] if values else None}

    def values(self) -> list:
        return [v for _, v in self._controls.pickers[self.name]["options"]]

    @property
    def value(self) -> Any:
        return self._controls.chosen(self.name)

    @value.setter
    def value(self, value: Any) -> None:
        if value not in self.values():
            raise traitlets.TraitError(f"invalid choice for {self.name}: {value!r}")
        self._controls.choices = {**self._controls.choices, self.name: value}

    def observe(self, handler: Callable[[dict], Any], names: str = "value") -> None:
        """`handler({"old", "new", "owner", "name"})` when the choice changes."""
        self._observers.append(handler)

    def changed(self, old: Any, new: Any) -> None:
        for handler in list(self._observers):
            handler({"name": "value", "old": old, "new": new, "owner": self})


class Field:
    """One text field of a Controls, used as an ipywidgets Text is: `value` is a str."""

    def __init__(self, controls: Controls, name: str):
        self._controls, self.name = controls, name

    @property
    def value(self) -> str:
        value = self._controls.chosen(self.name)
        return value if isinstance(value, str) else ""

    @value.setter
    def value(self, value: Any) -> None:
        self._controls.choices = {**self._controls.choices, self.name: str(value)}


class Action:
    """One button of a Controls, used as an ipywidgets Button is."""

    def __init__(self, controls: Controls, name: str):
        self._controls, self.name = controls, name

    def on_click(self, handler: Callable[[Any], Any]) -> None:
        self._controls.on_click(self.name, handler)

    def click(self) -> None:
        """A click from code: the kernel's own choices."""
        self._controls.click(self.name)

    def _get(self, key: str) -> Any:
        return self._controls.buttons[self.name][key]

    def _set(self, key: str, value: Any) -> None:
        c = self._controls
        if c.buttons[self.name][key] != value:
            c.buttons = {**c.buttons, self.name: {**c.buttons[self.name], key: value}}

    disabled = property(lambda self: self._get("disabled"),
                        lambda self, v: self._set("disabled", bool(v)))
    description = property(lambda self: self._get("label"), lambda self, v: self._set("label", v))
    icon = property(lambda self: self._get("icon"), lambda self, v: self._set("icon", v))
    tooltip = property(lambda self: self._get("tip"), lambda self, v: self._set("tip", v))
