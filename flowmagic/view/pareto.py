"""The cost-versus-score plot of every configuration slimming evaluated, as hand-written SVG.

No plotting library: a few dozen elements of valid XML that a notebook, a browser or a
test can read. The Pareto front (lowest cost, highest score) is drawn red and joined; the
final configuration is ringed green; every point carries a <title> tooltip.
"""

from __future__ import annotations

from .safe import text_html

__all__ = ["pareto_front", "pareto_svg"]


def pareto_front(points: list[dict]) -> list[int]:
    """Indices of the points no other point beats on both cost (lower) and score (higher)."""
    def beats(q: dict, p: dict) -> bool:
        return (q["cost_usd"] <= p["cost_usd"] and q["score"] >= p["score"]
                and (q["cost_usd"] < p["cost_usd"] or q["score"] > p["score"]))
    front = [i for i, p in enumerate(points) if not any(beats(q, p) for q in points)]
    return sorted(front, key=lambda i: (points[i]["cost_usd"], -points[i]["score"]))


def _frame(width: int, height: int, box: tuple, c_range: tuple, s_range: tuple,
           inset: int) -> list[str]:
    left, right, top, bottom = box
    base = height - bottom
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
            f'<text x="{left}" y="16" font-size="13">cost versus score of every configuration '
            'evaluated</text>',
            f'<text x="{left}" y="32" fill="#d62728">● Pareto front (min cost, max score)</text>',
            f'<text x="{left + 210}" y="32" fill="#2ca02c">◯ final</text>',
            f'<text x="{left + 260}" y="32" fill="#1f77b4">● other configurations</text>',
            f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#444"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{base}" stroke="#444"/>',
            f'<text x="{left + inset}" y="{base + 16}">${c_range[0]:.6f}</text>',
            f'<text x="{width - right - inset}" y="{base + 16}" text-anchor="end">'
            f'${c_range[1]:.6f}</text>',
            f'<text x="{(left + width - right) / 2:.0f}" y="{height - 8}" text-anchor="middle">'
            'cost per example (USD)</text>',
            f'<text x="{left - 6}" y="{base - inset + 4}" text-anchor="end">{s_range[0]:.2f}</text>',
            f'<text x="{left - 6}" y="{top + inset + 4}" text-anchor="end">{s_range[1]:.2f}</text>',
            f'<text x="14" y="{(top + base) / 2:.0f}" transform="rotate(-90 14 {(top + base) / 2:.0f})" '
            'text-anchor="middle">score</text>']


def pareto_svg(points: list[dict], final: str | None = None, width: int = 560,
               height: int = 360) -> str:
    """Every configuration as a point; the Pareto front red and joined, its points labelled;
    the final configuration ringed."""
    box = left, right, top, bottom = 64, 24, 48, 44
    costs = [p["cost_usd"] for p in points] or [0.0]
    scores = [p["score"] for p in points] or [0.0]
    c_range = (min(costs), max(costs))
    s_range = (min(0.0, min(scores)), max(1.0, max(scores)))
    c_span, s_span = (c_range[1] - c_range[0]) or 1.0, (s_range[1] - s_range[0]) or 1.0
    inset = 10   # keeps points at the extremes off the axes and the frame

    def xy(p: dict) -> tuple[float, float]:
        return (left + inset + (p["cost_usd"] - c_range[0]) / c_span * (width - left - right - 2 * inset),
                height - bottom - inset
                - (p["score"] - s_range[0]) / s_span * (height - top - bottom - 2 * inset))

    front = pareto_front(points)
    out = _frame(width, height, box, c_range, s_range, inset)
    if front:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(points[i]) for i in front))
        out.append(f'<polyline class="front" points="{path}" fill="none" stroke="#d62728" '
                   'stroke-width="1.5" stroke-dasharray="4 3"/>')
    for i, p in enumerate(points):
        x, y = xy(p)
        on_front = i in front
        name = text_html(str(p.get("label", "?")))
        tip = f"{name}: S={p['score']:.3f}, C=${p['cost_usd']:.6f}" + (" (Pareto front)" if on_front else "")
        fill = "#d62728" if on_front else "#1f77b4"
        out.append(f'<circle class="{"point front" if on_front else "point"}" cx="{x:.1f}" '
                   f'cy="{y:.1f}" r="4.5" fill="{fill}" fill-opacity="0.8"><title>{tip}</title></circle>')
        if on_front:
            anchor = "end" if x > width / 2 else "start"
            dx = -8 if anchor == "end" else 8
            out.append(f'<text x="{x + dx:.1f}" y="{y - 7:.1f}" text-anchor="{anchor}" '
                       f'fill="#d62728">{name}</text>')
        if final is not None and p.get("label") == final:
            out.append(f'<circle class="final" cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" '
                       'stroke="#2ca02c" stroke-width="2"><title>final configuration</title></circle>')
    out.append("</svg>")
    return "\n".join(out)
