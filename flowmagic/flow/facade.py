"""`Flow`: the public API every button, magic and CLI command calls.

A Flow is the user's facade over one run: its plan and state are a `RunRecord`, the run
itself (the loop, the budget, the update and repair policy) is the `RunCore`, and every state
change goes through the `Recorder`, which writes it to the store before anyone is told, so
a kernel restart loses nothing (`flowmagic.load(run_id)` resumes); all three are in engine/.

The class is its concerns put together, one module each in this folder: running it
(`running.RunControl`), steering it (`steering.Steering`), reading it (`readings.Readings`),
its tools (`tools.Tools`) and the work ops/ does on it as a whole (`operations.Operations`).
What is left here is what a Flow is: its parts, how it is made, and its record's fields.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ..engine.recorder import Recorder
from ..engine.run_core import RunCore
from ..engine.run_record import RECORD_FIELDS, RunRecord
from ..engine.run_space import RunSpace
from ..engine.tool_choice import ToolChoice
from ..llm.client import LLM, get_llm
from ..model.graph import Workflow
from ..settings import Settings
from ..store import Store
from ..view.frames import Candidates
from .operations import Operations
from .readings import Readings
from .running import RunControl
from .steering import Steering
from .tools import Tools

__all__ = ["Flow", "new_run_id"]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class Flow(RunControl, Steering, Readings, Tools, Operations):
    """A planned workflow with its run: what `flowmagic.plan` returns, and what every button,
    magic and command calls.

    It is its concerns put together, each listed with its methods below in `help(Flow)`:
    running it (`RunControl`: run, step, run_node, wait, pause, resume, stop), steering it
    (`Steering`: prune, unprune, downgrade, rerun, edit, use_candidate), reading it
    (`Readings`: metrics, counts, total, cost, timeline, trace_numbers, estimate, draw), its
    tools (`Tools`) and the work on it as a whole (`Operations`: map, attach_probe,
    importance, slim, to_notebook).

    Its fields (`workflow`, `settings`, `run_id`, `name`, `candidates`, `chosen`, `origin`,
    `status`, `result`, `message`, `update_log`, `spent_usd`, `unpriced`) are those of its
    `record` (engine/run_record.py), which the run core changes as the run goes: reading or
    setting `flow.status` reads or sets `flow.record.status`."""

    workflow: Workflow
    settings: Settings
    run_id: str
    name: str
    status: str
    result: str | None
    message: str | None
    update_log: list[dict]
    spent_usd: float

    def __init__(self, workflow: Workflow, *, name: str = "flow", candidates: list | None = None,
                 chosen: int = 0, run_id: str | None = None, llm: LLM | None = None,
                 store: Store | None = None, save: bool = True, tools: Any = None,
                 origin: str | None = None, inputs: Any = None, **settings: Any):
        # origin "replay": made by an exported notebook's cells (see load())
        self.record = RunRecord(workflow, Settings(**settings), run_id or new_run_id(),
                                name=name, candidates=Candidates(candidates or []),
                                chosen=chosen, origin=origin)
        self.llm = llm or get_llm()
        self.store = store or self.llm.store
        RunControl.__init__(self)   # its listeners and task (LiveRun)
        # every state change is written through the recorder before a listener is told
        self.recorder = Recorder(self.store, self.record, self._subscribers)
        self.space = RunSpace(self.store.path.parent, self.record)   # workspace and session
        self.core = RunCore(self.record, llm=self.llm, recorder=self.recorder, space=self.space,
                            tools=ToolChoice(tools))
        # the engine's own calls, under the names scripts, ops/ and UIs use
        self.emit = self.recorder.emit
        self.partial_output = self.recorder.partial_output
        self.context = self.core.context
        self.executor = self.core.make_executor
        self.session = self.space.session
        self.close = self.space.close
        self.add_inputs = self.space.add
        self.files = self.space.files
        self.probe = None   # a flowmagic.ops.batch.Probe once attach_probe() was called
        self.last_slim = None   # (slimmed Flow, SlimReport) of the last slim(), for UIs
        if inputs is not None:
            self.add_inputs(inputs)
        if save:
            self._save_run()

    def __getattr__(self, name: str) -> Any:
        # only for names not found on the object itself: the record's fields
        record = self.__dict__.get("record")
        if record is not None and name in RECORD_FIELDS:
            return getattr(record, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in RECORD_FIELDS:
            setattr(self.record, name, value)
        else:
            object.__setattr__(self, name, value)

    # -- construction -------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, task: str | None = None, **kwargs: Any) -> "Flow":
        """A Flow from a plan written by hand (plain or paper form), repaired like any plan."""
        workflow = Workflow.from_dict(d, task=task or (d.get("task") if isinstance(d, dict) else ""))
        return cls(workflow, **kwargs)

    @property
    def task(self) -> str:
        """The task, in the words the plan was made for."""
        return self.workflow.task

    def __repr__(self) -> str:
        counts = self.counts()
        return (f"<Flow {self.name!r} run={self.run_id} {self.status}: "
                f"{counts.get('done', 0)}/{self.total()} done, ${self.spent_usd:.4f}>")

    def _save_run(self) -> None:
        self.recorder.save_run()

    @property
    def workspace(self):
        """The folder of this run's inputs and files (made when first needed)."""
        return self.space.workspace

    def derive(self, workflow: Workflow, *, name: str, **settings: Any) -> "Flow":
        """A new Flow on `workflow` with this flow's settings (`settings` override them), its
        model door, store and tool choice: a batch item, a slimmed copy."""
        child = Flow(workflow, name=name, llm=self.llm, store=self.store,
                     **{**self.settings, **settings})
        child.core.tools.chosen = self.core.tools.chosen
        return child
