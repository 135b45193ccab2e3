"""A time axis that skips long idle stretches (a broken axis) for the Gantt timeline.

A run stepped by hand waits minutes between clicks for seconds of work; drawn to one scale,
the bars become slivers. `TimeScale` keeps the time when something ran (and short pauses)
to scale, and squeezes each idle stretch longer than `min_gap` seconds into `gap_px`
pixels, where the chart draws a break labelled with the time skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TimeScale", "Break", "skipped_text", "of_rows"]


@dataclass
class Break:
    start: float      # seconds since t0 where the idle stretch begins
    seconds: float    # how long it was
    x: float          # pixels from the chart's left edge where it is drawn (gap_px wide)


def skipped_text(seconds: float) -> str:
    """"12 s", "4.5 min", "2.1 h": the time a break skips."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class TimeScale:
    """Maps seconds since `t0` to pixels over `width`, skipping idle stretches.

    `intervals` are (start, end) pairs in seconds since t0 (the bars)."""

    def __init__(self, intervals: list[tuple[float, float]], width: float, *,
                 min_gap: float | None = None, gap_px: float = 28.0):
        spans = sorted((max(0.0, s), max(s, e)) for s, e in intervals)
        merged: list[list[float]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        self.span = max((e for _s, e in merged), default=0.0)
        busy = sum(e - s for s, e in merged)
        # a wait longer than a fifth of the work (and than a second) is "idle"
        self.min_gap = max(1.0, 0.2 * busy) if min_gap is None else min_gap
        idle = [(a[1], b[0]) for a, b in zip(merged, merged[1:]) if b[0] - a[1] > self.min_gap]
        kept = max(self.span - sum(e - s for s, e in idle), 1e-3)
        self.gap_px = gap_px
        self.scale = max(width - gap_px * len(idle), width * 0.5) / kept   # pixels per second
        self._idle = idle
        self.breaks = [Break(s, e - s, self._x_before(s)) for s, e in idle]
        self.width = self.x(self.span)

    def _x_before(self, t: float) -> float:
        """x of `t` counting only the breaks that end before it."""
        x, last = 0.0, 0.0
        for s, e in self._idle:
            if e > t:
                break
            x += (s - last) * self.scale + self.gap_px
            last = e
        return x + (min(t, self._next_idle_start(t)) - last) * self.scale

    def _next_idle_start(self, t: float) -> float:
        return next((s for s, e in self._idle if e > t), t)

    def x(self, t: float) -> float:
        """Pixels from the left edge for `t` seconds since t0 (inside a break: its start)."""
        for s, e in self._idle:
            if s <= t < e:   # a moment inside a skipped stretch sits inside its break
                return self._x_before(s) + self.gap_px * (t - s) / (e - s)
        return self._x_before(t)

    def kept(self) -> list[tuple[float, float]]:
        """The stretches drawn to scale, in seconds since t0."""
        out, last = [], 0.0
        for s, e in self._idle:
            out.append((last, s))
            last = e
        out.append((last, self.span))
        return out


def of_rows(rows: list[dict], width: float, now: float) -> tuple[TimeScale, float, list[float]]:
    """(the scale, t0, each row's end) for timeline rows that have a start: the chart and
    the text table skip the same idle stretches. A row still running ends at `now`."""
    t0 = min(r["start"] for r in rows)
    ends = [(r["end"] if r.get("end") is not None else max(now, r["start"])) for r in rows]
    return TimeScale([(r["start"] - t0, end - t0) for r, end in zip(rows, ends)], width), t0, ends
