"""`Budget`: what a run has spent, and whether `budget_usd` lets anything new start."""

from __future__ import annotations

import sys

from .run_record import RunRecord

__all__ = ["Budget"]


class Budget:
    def __init__(self, record: RunRecord):
        self.record = record

    def spend(self, usd: float, *, unpriced: str | None = None) -> None:
        """Add to what the run cost; `unpriced` names a model whose calls have no known price
        (their cost is unknown, not $0)."""
        record = self.record
        record.spent_usd += usd or 0.0
        if unpriced and unpriced not in record.unpriced:
            record.unpriced.add(unpriced)
            if record.settings.budget_usd is not None:   # said once per model and flow
                print(f"flowmagic: budget_usd cannot count the calls to {unpriced}: no price is "
                      "known for it, so they count as $0; give one with flowmagic.configure("
                      "prices={MODEL: (USD per 1M in, per 1M out)})", file=sys.stderr)

    def reached(self) -> str | None:
        """Why nothing new may start (the budget is spent), or None."""
        budget, spent = self.record.settings.budget_usd, self.record.spent_usd
        if budget is not None and spent >= float(budget):
            return (f"budget of ${float(budget):.4f} reached (spent ${spent:.4f}); "
                    "nothing new starts, finished nodes are kept; raise budget_usd and run() again")
        return None
