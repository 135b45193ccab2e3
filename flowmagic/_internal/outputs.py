"""Where the layers below `jupyter/` send a notebook output, without importing IPython.

Only `jupyter/` imports IPython: `flowmagic.jupyter` registers how an output is
displayed when it is imported (`%load_ext flowmagic` does). This module never imports the
layer above: the package's `__init__` registers how to load that front end (`on_demand`),
for a flow used under IPython before `%load_ext`. The cells of an exported notebook, the
replay and the live drawing call `show()`; in a plain script nothing is registered and the
output's text is printed.
"""

from __future__ import annotations

import sys
from typing import Callable

__all__ = ["register", "on_demand", "show", "available", "in_kernel"]

_display: Callable[[dict, dict, str | None, bool], None] | None = None
_shell: Callable[[], object] = lambda: None
_load_front_end: Callable[[], None] | None = None


def register(display: Callable[[dict, dict, str | None, bool], None],
             shell: Callable[[], object]) -> None:
    """`display(data, metadata, display_id, update)` shows a MIME bundle as it is; `shell()`
    is the running IPython shell, or None."""
    global _display, _shell
    _display, _shell = display, shell


def on_demand(load: Callable[[], None]) -> None:
    """`load()` registers the front end (by importing it): called when an output is shown
    while IPython is loaded and nothing is registered yet."""
    global _load_front_end
    _load_front_end = load


def available() -> bool:
    """Whether an IPython shell runs (and `flowmagic.jupyter` registered how to display)."""
    if _display is None and _load_front_end is not None and "IPython" in sys.modules:
        _load_front_end()   # registers
    return _display is not None and _shell() is not None


def show(data: dict, metadata: dict | None = None, *, display_id: str | None = None,
         update: bool = False) -> None:
    """Display a MIME bundle (`update`: replace the output shown under `display_id`)."""
    if available():
        _display(data, metadata or {}, display_id, update)
    elif not update:
        print(data.get("text/plain", ""))


def in_kernel() -> bool:
    """Whether a Jupyter kernel (not a terminal IPython) runs this code."""
    return available() and getattr(_shell(), "kernel", None) is not None
