"""Tables a data scientist reads as pandas DataFrames: `flow.cost()`, `flow.timeline()` and
`flow.candidates.to_frame()`, when pandas is installed; the plain rows otherwise."""

from __future__ import annotations

from typing import Any

__all__ = ["has_pandas", "cost_frame", "rows_frame", "Candidates"]


def has_pandas() -> bool:
    try:
        import pandas  # noqa: F401  (about to be used: the import is not wasted)
    except ImportError:
        return False
    return True


def rows_frame(rows: list[dict]) -> Any:
    """A DataFrame of `rows` (one column per key), or the rows themselves without pandas."""
    if not has_pandas():
        return rows
    import pandas as pd
    return pd.DataFrame(rows)


def cost_frame(usage: dict) -> Any:
    """`{"total": {...}, "rows": [...]}` as a DataFrame of the rows (purpose, node, model,
    calls, tokens, USD) whose `total` attribute is the total; `frame["total"]` and
    `frame["rows"]` still give the plain forms. Without pandas: the dict as it is."""
    if not has_pandas():
        return usage
    import pandas as pd

    class CostFrame(pd.DataFrame):
        """One row per purpose, node and model; `.total`: the run's totals (a dict)."""
        _metadata = ["total", "rows"]

        def __getitem__(self, key):
            if isinstance(key, str) and key in ("total", "rows") and key not in self.columns:
                return getattr(self, key)
            return super().__getitem__(key)

    frame = CostFrame(usage["rows"], columns=list(usage["rows"][0]) if usage["rows"] else None)
    frame.total, frame.rows = usage["total"], usage["rows"]
    return frame


class Candidates(list):
    """The candidate plans (a list, as before); `to_frame()` is one row per candidate with
    its scores and why it won or lost, and a notebook shows that table."""

    def rows(self) -> list[dict]:
        out = []
        for i, c in enumerate(self):
            row = c.to_dict() if hasattr(c, "to_dict") else dict(c)
            out.append({"candidate": i, **{k: v for k, v in row.items()
                                           if not isinstance(v, (dict, list))}})
        return out

    def to_frame(self) -> Any:
        return rows_frame(self.rows())

    def _repr_html_(self) -> str | None:
        frame = self.to_frame()
        return frame._repr_html_() if hasattr(frame, "_repr_html_") else None
