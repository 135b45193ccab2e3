"""The Jupyter front end: the magics, the widget panel, the slimming panel, the chat view.
Every button is one call on a `Flow`; no logic lives here that the Python API lacks.

Importing it registers IPython's display with `flowmagic._internal.outputs`, the door the
layers below use for notebook outputs (they never import IPython themselves)."""

from __future__ import annotations

from .._internal import outputs


def _display(data: dict, metadata: dict, display_id: str | None, update: bool) -> None:
    from IPython.display import display, update_display

    if update:
        update_display(data, raw=True, metadata=metadata, display_id=display_id)
    else:
        display(data, raw=True, metadata=metadata, display_id=display_id)


def _shell() -> object:
    from IPython import get_ipython

    return get_ipython()


outputs.register(_display, _shell)
