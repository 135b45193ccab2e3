"""How big a drawing is shown: fit to the width it is given, or a zoom level.

Graphviz writes the size of an SVG in points (`width="912pt"`). `Zoom.apply` rewrites the
root element so the browser scales it: at "fit" (the default) the drawing takes the width
of its box, never grows past its natural size, and never shrinks below `min_fit` of it, so
a graph of hundreds of nodes scrolls rather than turning into unreadable specks; at a zoom
level it is that many times its natural size, and its box scrolls. The viewBox graphviz
writes keeps the proportions.
"""

from __future__ import annotations

import re

__all__ = ["Zoom", "LEVELS"]

LEVELS = (0.25, 0.33, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
_PX_PER_PT = 96 / 72
FIT_BOX = 900.0   # about the width of a JupyterLab cell's output, in CSS pixels
_ROOT = re.compile(r"<svg\b[^>]*>", re.S)
_SIZE = re.compile(r'\s(width|height)="([\d.]+)(pt|px)?"')


def natural_size(svg: str) -> tuple[float, float] | None:
    """(width, height) in CSS pixels of an SVG's root element, or None when it says none."""
    root = _ROOT.search(svg)
    if root is None:
        return None
    found = {name: float(value) * (_PX_PER_PT if unit == "pt" else 1.0)
             for name, value, unit in _SIZE.findall(root.group(0))}
    if "width" not in found or "height" not in found:
        return None
    return found["width"], found["height"]


class Zoom:
    """The zoom of one panel's drawing: `level` is None at "fit", else a factor (1.0 = natural).

    Every zoom button is one of these methods; `label()` says what is shown."""

    def __init__(self, level: float | None = None, *, min_fit: float = 0.6):
        self.level: float | None = None
        self.min_fit = min_fit
        if level is not None:
            self.set(level)

    def set(self, level: float | None) -> None:
        """A zoom factor from LEVELS' range (0.25 to 3), or None for fit."""
        if level is None:
            self.level = None
            return
        level = float(level)
        if not LEVELS[0] <= level <= LEVELS[-1]:
            from ..errors import ConfigError
            raise ConfigError(f"zoom {level:g} is out of range; use {LEVELS[0]:g} to "
                              f"{LEVELS[-1]:g} (1 is the natural size), or fit()")
        self.level = level

    def fit(self) -> None:
        """Scale the drawing to the width it is shown in (the default)."""
        self.level = None

    def fit_factor(self, svg: str, box: float = FIT_BOX) -> float:
        """About the factor "fit" shows `svg` at in a box `box` pixels wide."""
        size = natural_size(svg)
        if size is None or size[0] <= 0:
            return 1.0
        return min(1.0, max(self.min_fit, box / size[0]))

    def zoom_in(self, svg: str = "") -> None:
        """One step larger (from fit: larger than what fit shows of `svg`)."""
        current = self.level if self.level is not None else self.fit_factor(svg)
        self.level = next((z for z in LEVELS if z > current + 1e-9), LEVELS[-1])

    def zoom_out(self, svg: str = "") -> None:
        """One step smaller (from fit: smaller than what fit shows of `svg`)."""
        current = self.level if self.level is not None else self.fit_factor(svg)
        self.level = next((z for z in reversed(LEVELS) if z < current - 1e-9), LEVELS[0])

    def label(self) -> str:
        return "fit" if self.level is None else f"{round(self.level * 100)}%"

    def apply(self, svg: str) -> str:
        """`svg` with its root element sized for this zoom (unchanged when it has no size)."""
        size = natural_size(svg)
        root = _ROOT.search(svg)
        if size is None or root is None:
            return svg
        width, _height = size
        if self.level is None:
            style = (f"width:100%;max-width:{width:.0f}px;min-width:{width * self.min_fit:.0f}px;"
                     "height:auto")
        else:
            style = f"width:{width * self.level:.0f}px;max-width:none;height:auto"
        head = _SIZE.sub("", root.group(0))
        head = re.sub(r'\sstyle="[^"]*"', "", head)
        head = head[:-1].rstrip("/").rstrip() + f' style="{style}"' + (
            "/>" if head.endswith("/>") else ">")
        return svg[:root.start()] + head + svg[root.end():]
