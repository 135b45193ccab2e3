"""`RunContext`: what running a node needs from its run, as the objects that hold it.

The engine sits below `flowmagic.flow`, so the node runner is never handed the Flow. The run
core makes a RunContext (`RunCore.context()`); the node runner, the node prompt
(`node_runner.node_messages`) and replay's fingerprint read the run through it: the
`record` (workflow, settings, run id), the model door (`llm`), the `recorder` (every event
and tool call, a node's streamed text and queue place, a call's deferred log row), the
`space` (workspace and Python session), the `tools` and the `budget`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..settings import Settings
from .budget import Budget
from .recorder import Recorder
from .run_record import RunRecord
from .run_space import RunSpace
from .tool_choice import ToolChoice

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """A run as the engine sees it. The workflow is read through the record each time: an
    update or a switch of candidate replaces it."""

    record: RunRecord
    settings: Settings
    llm: Any
    recorder: Recorder
    space: RunSpace
    tools: ToolChoice
    budget: Budget
    # node id -> (its output, the prompt and answer it passed with) of the node that passed
    # last, in this process only: a one-node flow's summary goes on from it (summary.py)
    conversations: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def workflow(self):
        return self.record.workflow

    @property
    def workspace(self):
        return self.space.workspace

    @property
    def session(self):
        """The run's sandboxed Python session (flowmagic.engine.session), started when first
        needed."""
        return self.space.session()

    @property
    def inputs(self) -> list:
        """The run's declared inputs (a run without any makes no workspace folder here)."""
        return self.space.inputs()

    @property
    def defer_log(self):
        """Where a node's model call puts its log row, written in the commit of the node's
        next state (None: the model door commits it itself, as for a run written to a store
        other than the door's)."""
        return self.recorder.log_later if self.recorder.log is self.llm.store else None
