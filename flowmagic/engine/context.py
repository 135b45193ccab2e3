"""`RunContext`: what running a node needs from its flow, and the only ways back to it.

The engine sits below `flowmagic.flow`, so the node runner is not handed the Flow. The Flow
makes a RunContext (`Flow.context()`); the runner, the node prompt (`node_runner.node_messages`)
and replay's fingerprint read the workflow, settings, model door, store and workspace through
it, and report through callables: `emit` (persist an event, then tell subscribers),
`spend` (add to the run's spending), `text_sink` (where a node's streamed text goes) and
`defer_log` (the log row of a node's model call, written with the node's next state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..settings import Settings

__all__ = ["RunContext"]


@dataclass(frozen=True)
class RunContext:
    """A flow's run as the engine sees it. `workflow` and `workspace` are read through
    getters because a flow may switch candidates or make its workspace late."""

    current_workflow: Callable[[], Any]
    settings: Settings
    llm: Any
    store: Any
    run_id: str
    open_workspace: Callable[[], Any]
    emit: Callable[[str, str | None, dict | None], None]
    spend: Callable[..., None]   # (usd, unpriced=model or None)
    text_sink: Callable[[str], Callable[[str], None] | None]
    offer_tools: Callable[[str], Awaitable[list]]
    has_tools: Callable[[], bool]
    # (log row, attempt record): the flow writes the row in the commit of the node's next
    # state and puts its id in the record; None: the LLM door commits it itself
    defer_log: Callable[[dict, dict], None] | None = None
    # the declared inputs without making the workspace folder (None: the workspace's own)
    list_inputs: Callable[[], list] | None = None
    # where a node hears its model call's place in a local server's queue (None: nowhere)
    wait_sink: Callable[[str], Callable[[int | None], None]] | None = None
    # the flow's sandboxed Python session (flowmagic.engine.session), started when first
    # needed; None: each code run gets an interpreter of its own
    open_session: Callable[[], Any] | None = None

    @property
    def workflow(self):
        return self.current_workflow()

    @property
    def workspace(self):
        return self.open_workspace()

    @property
    def session(self):
        return self.open_session() if self.open_session is not None else None

    @property
    def inputs(self) -> list:
        """The run's declared inputs (a run without any makes no workspace folder here)."""
        return self.list_inputs() if self.list_inputs is not None else self.workspace.inputs
