"""The notebook's progress bar for a distributed map (`%flow map`): an ipywidgets bar with
the line of `MapProgress` under it (done, failed, rate, cost so far, ETA) and the Dask
dashboard link when the cluster has one."""

from __future__ import annotations

import html
from typing import Any, Callable

__all__ = ["map_progress_bar"]


def map_progress_bar(display: Callable[[Any], Any]) -> Callable[[Any], None]:
    """A `progress=` callback for `Flow.map(engine="dask")` that shows its bar on first use."""
    import ipywidgets as widgets

    bar = widgets.IntProgress(min=0, max=1, value=0, description="map")
    text = widgets.HTML()
    shown: list[bool] = []

    def update(progress: Any) -> None:
        if not shown:
            display(widgets.VBox([bar, text]))
            shown.append(True)
        bar.max, bar.value = max(1, progress.total), progress.finished
        bar.bar_style = "danger" if progress.failed else ("success" if
                                                          progress.finished == progress.total else "")
        link = (f' · <a href="{html.escape(progress.dashboard)}" target="_blank">Dask dashboard</a>'
                if progress.dashboard else "")
        text.value = f"<code>{html.escape(progress.line())}</code>{link}"

    return update
