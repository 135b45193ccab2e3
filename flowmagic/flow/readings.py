"""`Readings`: what a flow and its run so far read as: its graph's metrics, node counts, cost,
timeline, the numbers its result states, an estimate, its drawing.

Each is one call into view/ (`report`, `frames`, `render`) or model/ (`metrics`), handed the
flow's parts; nothing is computed here.
"""

from __future__ import annotations

from typing import Any

from ..model import metrics as _metrics
from ..view import report
from ..view.frames import cost_frame, rows_frame

__all__ = ["Readings"]


class Readings:
    """A Flow's readings: `metrics`, `counts`, `total`, `cost`, `cost_data`, `trace_numbers`,
    `timeline`, `timeline_rows`, `estimate`, `draw` (and its notebook display). Mixed into
    `Flow`: it reads the flow's `workflow`, `result`, `update_log`, `settings` and `store`."""

    def metrics(self) -> dict:
        """The plan's graph metrics in one dict: nodes, edges, depth, width, parallelism,
        dependency complexity, critical path, expected successes (flowmagic.model.metrics)."""
        return _metrics.summary(self.workflow)

    def counts(self) -> dict:
        """How many nodes are in each state."""
        return report.counts(self.workflow)

    def total(self) -> int:
        """The nodes that count (every one not pruned)."""
        return report.total(self.workflow)

    def cost(self):
        """Tokens and USD of this run so far, by purpose, node and model: a DataFrame with
        pandas (`.total`: the totals; `["total"]` and `["rows"]` still work), else
        {"total": ..., "rows": [...]} (see cost_data)."""
        return cost_frame(self.cost_data())

    def cost_data(self) -> dict:
        """Tokens and USD of this run so far, by node and in total (planning and checks too).
        `cached` counts calls answered by flowmagic's response cache; `cached_tokens` the
        input tokens the endpoint served from its own prompt cache (priced at its cached rate)."""
        return report.cost_data(self.store, self.run_id)

    def trace_numbers(self, node_id: str | None = None):
        """Each number the result states (or, given a node, its answer's text) with the node
        and printed output line it came from, or None where it traces nowhere: a DataFrame
        (number, value, node, line) when pandas is installed, else a list of dicts. The rule
        is flowmagic.engine.numbers' (rounding allowed; years, ordinals, list markers, single
        digits and numbers the task or requirements give are not listed)."""
        return report.trace_numbers(self.workflow, self.result, node_id)

    def timeline(self):
        """`timeline_rows()` as a DataFrame with pandas (one row per node that ran), else
        the rows."""
        return rows_frame(self.timeline_rows())

    def timeline_rows(self) -> list[dict]:
        """One row per node that ran: start, end, duration, tokens, cost, attempts, and the
        model calls made for it with why each was made (flowmagic.engine.calls)."""
        return report.timeline_rows(self.workflow, self.update_log)

    def draw(self, **options: Any):
        """The workflow as a graphviz.Digraph (see flowmagic.view.render.draw for the options)."""
        from ..view import render
        return render.draw(self, **options)

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..view import render
        return render.mimebundle(self, include=include, exclude=exclude)

    def estimate(self) -> dict:
        """A rough estimate of a full run: calls, tokens and USD (4 characters a token)."""
        return report.estimate(self.workflow, self.settings)
