"""`RunControl`: a Flow's run started, stepped, waited for, paused, resumed and stopped.

In a notebook (a running event loop) `run()` starts an asyncio task on the kernel's loop and
returns at once, so buttons stay live; in a script it blocks. The run itself is the flow's
`RunCore` (engine/run_core.py); these methods only start it and ask it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import traceback
from typing import Any, Callable

from .._internal.aio import in_loop
from .._internal.live import LiveRun
from ..errors import FlowError, NodeError, StoreError
from ..model import status as transition
from ..model.status import RunState, Status

__all__ = ["RunControl"]

# "Flow" in annotations is flowmagic.flow.facade.Flow, which mixes this class in.


class RunControl(LiveRun):
    """Running a Flow: `run`, `step`, `run_node`, `wait`, `pause`, `resume`, `stop`, `busy`,
    `streaming` (and `subscribe` from `LiveRun`). Mixed into `Flow`: it asks the flow's
    `core` (the run), `recorder` and `llm`."""

    async def arun(self, *, step: bool = False, only: list[str] | None = None) -> str:
        """Run (or step) to completion on the current loop; returns the run state."""
        return await self.core.run(step=step, only=only)

    async def astep(self) -> str:
        """step() awaited in a notebook cell (`await flow.astep()`, tutorial 02)."""
        return await self.arun(step=True)

    def _launch(self, coro_fn: Callable[[], Any]) -> "Flow":
        if in_loop():
            self.in_task(coro_fn()).add_done_callback(self._background_done)
            return self

        async def main():
            try:
                return await coro_fn()
            finally:
                await self.llm.aclose()

        asyncio.run(main())
        return self

    def _background_done(self, task: asyncio.Task) -> None:
        """A run on the kernel's loop has no caller to raise to: say what went wrong."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.status = RunState.ERROR
        self.message = str(exc) if isinstance(exc, FlowError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(StoreError):   # told anyway; the store's own line is below
            self.emit("error", None, {"message": self.message})
        if isinstance(exc, FlowError):
            print(f"flowmagic: {exc}", file=sys.stderr)
        else:   # a bug in flowmagic: keep its traceback
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)

    def run(self) -> "Flow":
        """Run every node that can run. In a notebook it returns at once (see wait())."""
        return self._launch(self.arun)

    def step(self) -> "Flow":
        """Run the nodes that are ready now, and return when they finish."""
        return self._launch(lambda: self.arun(step=True))

    def run_node(self, node_id: str) -> "Flow":
        """Run one node whose parents are done (pending, ready or failed; rerun() runs a
        finished one again)."""
        node = self.workflow.node(node_id)
        waiting = [p for p in self.workflow.parents(node_id)
                   if self.workflow.nodes[p].status != Status.DONE]
        if waiting:
            raise NodeError(f"node {node_id!r} waits for {', '.join(waiting)}; run those first")
        if node.status not in (Status.PENDING, Status.FAILED, Status.READY):
            raise NodeError(f"node {node_id!r} is {node.status}; rerun({node_id!r}) runs it again")
        transition.requeue(node)
        return self._launch(lambda: self.arun(only=[node_id]))

    async def wait(self) -> str:
        """Wait for the run started by run()/step() in a notebook."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self.status

    def pause(self) -> None:
        """Nothing new starts; running nodes finish (`message` says how many it waits for)."""
        self.core.pause()

    def resume(self) -> "Flow":
        """Run again after pause() or stop(): run()."""
        return self.run()

    def stop(self) -> None:
        """Cancel in-flight calls; those nodes go back to pending; nothing finished is lost."""
        self.core.stop()

    @property
    def busy(self) -> bool:
        """A run was started and has not finished (in a notebook it may not have begun yet)."""
        task = self._task
        if self.core.executor is not None:
            return True
        # Seen from inside the run's own task (its last "run" event), the run is over.
        return task is not None and not task.done() and task is not asyncio.current_task()

    @property
    def streaming(self) -> bool:
        """Whether node outputs arrive piece by piece as "text" events (Show output uses it)."""
        return self.recorder.streaming

    @streaming.setter
    def streaming(self, on: bool) -> None:
        self.recorder.streaming = bool(on)
