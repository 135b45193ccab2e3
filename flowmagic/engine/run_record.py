"""`RunRecord`: what one flow's run is, as plain data: its plan, settings and where it stands.

The facade (`flowmagic.flow.Flow`) shows these fields as its own (`flow.workflow`,
`flow.status`, `flow.result`, ...); the run core changes them as the run goes, and the
recorder writes them (`row()`) to the store. Nothing here calls anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..model.graph import Workflow
from ..model.status import RunState
from ..settings import Settings

__all__ = ["RunRecord", "RECORD_FIELDS"]


@dataclass(eq=False)
class RunRecord:
    workflow: Workflow
    settings: Settings
    run_id: str
    name: str = "flow"
    candidates: Any = ()
    chosen: int = 0
    origin: str | None = None   # "replay": made by an exported notebook's cells
    status: Any = RunState.PLANNED
    result: str | None = None
    message: str | None = None   # the one line the run ended with (or is waiting on)
    update_log: list[dict] = field(default_factory=list)
    spent_usd: float = 0.0
    unpriced: set[str] = field(default_factory=set)   # models with no known price

    def row(self) -> dict:
        """The run's row as the store keeps it (Store.save_run's fields)."""
        return {"task": self.workflow.task, "name": self.name, "status": self.status,
                "workflow": self.workflow.to_dict(), "result": self.result,
                "candidates": [c.to_dict() if hasattr(c, "to_dict") else c
                               for c in self.candidates],
                "settings": {**self.settings, "chosen": self.chosen,
                             **({"origin": self.origin} if self.origin else {})}}


RECORD_FIELDS = frozenset(f.name for f in fields(RunRecord))
