"""`Flow`: the public API every button, magic and CLI command calls.

A Flow is the user's facade over one run: its plan and state are a `RunRecord`, the run
itself (the loop, the budget, the update and repair policy) is the `RunCore`, and every state
change goes through the `Recorder`, which writes it to the store before anyone is told, so
a kernel restart loses nothing (`flowmagic.load(run_id)` resumes); all three are in engine/.
In a notebook (a running event loop) `run()` starts an asyncio task on the kernel's loop and
returns at once; in a script it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
import traceback
from functools import partial
from typing import Any, Callable

from . import ops
from ._internal.aio import in_loop, run_blocking
from ._internal.live import LiveRun
from ._internal.bars import progress_bar, ticking
from .view import report
from .view.frames import Candidates, cost_frame, rows_frame
from .model import metrics as _metrics
from .llm.endpoints import check_model
from .errors import ConfigError, FlowError, NodeError, StoreError
from .engine.recorder import Recorder
from .engine.run_core import RunCore
from .engine.run_record import RECORD_FIELDS, RunRecord
from .engine.run_space import RunSpace
from .engine.tool_choice import ToolChoice
from .engine.prompt_start import flow_start
from .model.graph import Workflow
from .llm.client import LLM, get_llm
from .store import Store, get_store
from .model import status as transition
from .settings import DEFAULTS, Settings
from .model.status import RunState, Status

__all__ = ["Flow", "plan", "aplan", "load", "flow_from_plan", "DEFAULTS", "Settings"]

def _new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class Flow(LiveRun):
    """A planned workflow with its run; see the module docstring.

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
        self.record = RunRecord(workflow, Settings(**settings), run_id or _new_run_id(),
                                name=name, candidates=Candidates(candidates or []),
                                chosen=chosen, origin=origin)
        self.llm = llm or get_llm()
        self.store = store or self.llm.store
        LiveRun.__init__(self)
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

    # -- running ----------------------------------------------------------------------
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

    @property
    def tools(self) -> list:
        """The functions nodes may call: those set here, else every @flowmagic.tool."""
        return self.core.tools.all()

    @tools.setter
    def tools(self, value: Any) -> None:
        self.core.tools.set(value)

    @property
    def chosen_tools(self) -> list | None:
        """The tools set on this flow, or None when it offers every @flowmagic.tool (a copy
        of the flow elsewhere, a Dask worker say, then offers that process's tools)."""
        chosen = self.core.tools.chosen
        return None if chosen is None else list(chosen)

    def tools_for(self, node_id: str) -> list:
        """The tools offered to a node: the `tools_top_n` most similar to its requirement."""
        return self.core.tools.for_requirement(self.workflow.node(node_id).requirement,
                                               self.settings)

    def tool_calls(self, node_id: str | None = None) -> list[dict]:
        """Every tool call of this run (or of one node): tool, arguments, result, duration, error."""
        return self.store.tool_calls(self.run_id, node_id)

    # -- steering (every button is one of these) ----------------------------------------------
    def _not_running(self, node_id: str):
        node = self.workflow.node(node_id)
        if node.status == Status.RUNNING:
            raise NodeError(f"node {node_id!r} is running; stop() the flow first")
        return node

    def prune(self, node_id: str) -> None:
        """Remove a node: every predecessor is linked to every successor; history kept."""
        self._not_running(node_id)
        self.workflow.prune(node_id)
        self.core.changed("pruned", node_id)

    def unprune(self, node_id: str) -> None:
        """Undo prune(): the node and its edges come back, the bypass edges go."""
        self.workflow.unprune(node_id)
        self.result = None
        self.core.changed("unpruned", node_id)

    def downgrade(self, node_id: str, model: str) -> None:
        """Run this node on another (cheaper) model from now on."""
        node = self._not_running(node_id)
        # a malformed endpoint, or a model the endpoint does not list: a ConfigError now
        check_model(model)
        node.downgraded_from = node.downgraded_from or node.model or self.settings.model or "default"
        node.model = model
        self.core.changed("downgraded", node_id, model=model)

    def rerun(self, node_id: str, *, run: bool = True) -> "Flow":
        """Run a node again; its descendants become pending (their old outputs stay in attempts)."""
        node = self._not_running(node_id)
        if node.status == Status.PRUNED:
            raise NodeError(f"node {node_id!r} is pruned; nothing to rerun")
        descendants = self.workflow.descendants(node_id)
        for i in [node_id, *descendants]:
            if self.workflow.nodes[i].status != Status.RUNNING:
                transition.reset(self.workflow.nodes[i])
        self.core.restart_running(descendants)
        self.result = None
        self.core.changed("rerun", node_id)
        return self.run() if run and self.core.executor is None else self

    def edit(self, node_id: str, requirement: str) -> None:
        """New requirement: the node runs again on the next run(); descendants are marked stale."""
        node = self._not_running(node_id)
        if not isinstance(requirement, str) or not requirement.strip():
            raise NodeError("a requirement must be non-empty text")
        node.requirement = requirement.strip()
        if node.status in (Status.DONE, Status.FAILED):
            transition.reset(node)
            descendants = self.workflow.descendants(node_id)
            for i in descendants:
                if self.workflow.nodes[i].status == Status.DONE:
                    self.workflow.nodes[i].stale = True
            self.core.restart_running(descendants)
        self.result = None
        self.core.changed("edited", node_id)

    def use_candidate(self, index: int) -> None:
        """Switch to another candidate plan (before anything has run)."""
        if any(n.status in (Status.DONE, Status.RUNNING, Status.FAILED) for n in self.workflow.nodes.values()):
            raise NodeError("this flow has already run nodes; plan again to switch candidates")
        if not 0 <= index < len(self.candidates) or self.candidates[index].workflow is None:
            usable = [c.index for c in self.candidates if c.workflow is not None]
            raise NodeError(f"no usable candidate {index}; usable: {usable}")
        self.workflow = self.candidates[index].workflow.copy()
        self.chosen = index
        self.core.changed("candidate", None, index=index)

    def to_notebook(self, path, **options: Any):
        """Write the executed workflow as a notebook whose cells replay it (flowmagic.ops.export)."""
        return ops.export_notebook(self, path, **options)

    # -- reading -------------------------------------------------------------------------
    def metrics(self) -> dict:
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
        from .view import render
        return render.draw(self, **options)

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .view import render
        return render.mimebundle(self, include=include, exclude=exclude)

    def estimate(self) -> dict:
        """A rough estimate of a full run: calls, tokens and USD (4 characters a token)."""
        return report.estimate(self.workflow, self.settings)

    # -- batch runs and slimming (flowmagic.ops.batch, flowmagic.ops.slimming) --------------
    def map(self, inputs, concurrency: int | None = 4, scorer: Any = None,
            engine: Any = "inprocess", **options: Any):
        """This workflow once per input ({{input}}/{{field}} filled in); a BatchRun in input order.

        `engine="dask"` (or a dask.distributed.Client) runs the inputs on Dask and returns a
        pandas DataFrame in input order, resumable, with `budget_usd`, `progress`, `rpm` and
        `requests_at_once` options (see flowmagic.ops.distributed.dask_map)."""
        if engine != "inprocess":
            if scorer is not None:
                raise ConfigError("map(engine='dask') does not score yet; use the in-process "
                                  "engine (engine='inprocess') with a scorer")
            return ops.dask_map(self, inputs, engine=engine, concurrency=concurrency,
                                **options)
        if options:
            raise ConfigError(f"map() options {sorted(options)} are for engine='dask'; "
                              "drop them or pass engine='dask'")
        size = len(inputs) if hasattr(inputs, "__len__") else None
        with progress_bar(f"{self.name}: map", size, "input") as bar:
            return ops.run_sync(self, lambda: ops.amap(
                self, inputs, concurrency=concurrency, scorer=scorer,
                progress=ticking(bar, None)), "map")

    def map_file(self, path, engine: Any = "dask", **options: Any):
        """`map` over the rows of a .csv, .parquet or .jsonl file (columns as {{field}});
        a DataFrame in row order (`flowmagic map` and `%flow map` call this)."""
        return ops.map_file(self, path, engine=engine, **options)

    async def amap(self, inputs, concurrency: int | None = 4, scorer: Any = None):
        return await ops.amap(self, inputs, concurrency=concurrency, scorer=scorer)

    def attach_probe(self, examples, scorer: Any, n: int | None = None, seed: int = 0):
        """Keep a probe set (a seeded shuffle of `examples`, first n) for importance() and slim()."""
        self.probe = ops.probe_set(examples, scorer, n=n, seed=seed)
        self.emit("probe", None, {"size": len(self.probe), "seed": seed})
        return self.probe

    def importance(self, probe: Any = None, scorer: Any = None, **options: Any):
        """The node importance table (see flowmagic.ops.slimming.aimportance for the options)."""
        with progress_bar(f"{self.name}: importance", unit="configuration") as bar:
            told = options.get("progress") or partial(self.emit, "slim", None)
            options["progress"] = ticking(bar, told, _evaluated)
            return ops.run_sync(self, lambda: self.aimportance(probe, scorer, **options),
                                "importance")

    async def aimportance(self, probe: Any = None, scorer: Any = None, **options: Any):
        options.setdefault("progress", partial(self.emit, "slim", None))
        return await ops.aimportance(self, ops.resolve_probe(self, probe, scorer), **options)

    def slim(self, probe: Any = None, scorer: Any = None, **options: Any):
        """(slimmed Flow, SlimReport), also kept as `last_slim`; this flow's workflow is
        untouched (see flowmagic.ops.slimming.aslim)."""
        with progress_bar(f"{self.name}: slim", unit="configuration") as bar:
            told = options.get("progress") or partial(self.emit, "slim", None)
            options["progress"] = ticking(bar, told, _evaluated)
            return ops.run_sync(self, lambda: self.aslim(probe, scorer, **options), "slim")

    async def aslim(self, probe: Any = None, scorer: Any = None, **options: Any):
        options.setdefault("progress", partial(self.emit, "slim", None))
        self.last_slim = await ops.aslim(self, ops.resolve_probe(self, probe, scorer), **options)
        return self.last_slim


def _evaluated(event: Any) -> bool:
    """A step of slim's and importance's bars: one configuration scored on the probe set."""
    return isinstance(event, dict) and event.get("phase") == "evaluated"


async def aplan(task: str, k: int | None = None, model: str | None = None,
                strategy: str = "balanced",
                *, name: str = "flow", llm: LLM | None = None, tools: Any = None,
                progress: Callable[[dict], Any] | None = None, inputs: Any = None,
                **settings: Any) -> Flow:
    """Plan `task` as K candidate graphs and keep the best by `planner.RULE` (connected and
    covering first, then the most parallel, then the least tangled); K left out is
    `planner.default_k` (3, or a server you run's slots when fewer); `progress(event)` hears
    each step (see planner.plan_candidates). `inputs` (file paths, or {name: DataFrame / value
    / path}) are saved in the run's workspace; the planner and every agent are told what they
    hold."""
    from .engine import planner

    if not isinstance(task, str) or not task.strip():
        raise ConfigError("the task is empty; write what you want done in words")
    llm = llm or get_llm()
    if k is None:
        k = await asyncio.to_thread(planner.default_k, model)
    settings = Settings(**{**settings, "k": k, "model": model, "strategy": strategy})
    check_model(model)   # before any paid call: a model the endpoint does not list is refused
    say_where_code_cannot_run(settings)
    run_id = _new_run_id()
    context = start = None
    if inputs is not None:
        from .engine.workspace import Workspace
        store_home = llm.store.path.parent
        workspace = Workspace.for_run(store_home, run_id, settings.workdir,
                                      settings.workdir_writes)
        await asyncio.to_thread(workspace.add, inputs)   # the inputs are read off the loop
        context = workspace.describe()
        if settings.execute != "off" and workspace.inputs:   # its nodes' prompts open alike
            start = flow_start(task.strip(), workspace, int(settings.context_chars),
                               working_start=False)
    candidates, chosen = await planner.plan(
        task.strip(), k=k, model=model, strategy=strategy, llm=llm, seed=settings.seed,
        max_subtasks=settings.max_subtasks, max_agents=settings.max_agents, run_id=run_id,
        progress=progress, context=context, start=start, method=settings.plan_method,
        time_limit_s=settings.plan_time_s)
    workflow = candidates[chosen].workflow.copy()
    flow = Flow(workflow, name=name, candidates=candidates, chosen=chosen, run_id=run_id,
                llm=llm, tools=tools, **settings)
    flow.spent_usd = sum(c.cost_usd for c in candidates)
    return flow


def say_where_code_cannot_run(settings: Settings) -> None:
    """One line, before any paid call, when this machine cannot run model-written code (no
    bubblewrap, no user namespaces, not Linux) and the flow would try: what to do, and that
    text-only nodes still run."""
    if settings.execute == "off" or settings.sandbox != "bwrap":
        return
    from .engine.sandbox import sandbox_status
    try:
        status = sandbox_status()
    except OSError:   # no temporary folder to try one in: a node that runs code will say so
        return
    if not status.available:
        print(f"flowmagic: code that models write cannot run here: {status.reason}. Nodes that "
              "answer in text still run; sandbox=\"none\" runs the code with your rights, only "
              "on a machine you accept that on", file=sys.stderr)


def plan(task: str, k: int | None = None, model: str | None = None, strategy: str = "balanced",
         **kwargs: Any) -> Flow:
    """`aplan` to its end, in a script or a notebook cell (the cell waits, as `%%flow` does;
    `await flowmagic.aplan(...)` leaves it free)."""
    llm = kwargs.pop("llm", None) or get_llm()
    return run_blocking(lambda: aplan(task, k, model, strategy, llm=llm, **kwargs),
                        close=llm.aclose, name="flowmagic-plan")


def flow_from_plan(plan: dict, name: str, namespace: dict | None = None, **kwargs: Any) -> Flow:
    """The Flow a `%%flow_plan` cell makes from its plan (see ops.replay.plan_parts): nodes
    pending, validators named "function:NAME" taken from `namespace`, origin "replay"."""
    from .ops.replay import plan_parts

    workflow, settings = plan_parts(plan, namespace)
    kwargs.setdefault("origin", "replay")
    return Flow(workflow, name=name, **kwargs, **settings)


def load(run: str, *, llm: LLM | None = None, store: Store | None = None) -> Flow:
    """A Flow from the store (by run id, or the latest real run of a name: not one an
    exported notebook's replay made); nodes that were running become pending."""
    store = store or (llm.store if llm else get_store())
    data = store.load_run(run, skip_origin="replay")
    workflow = Workflow.from_dict(data["workflow"], task=data["task"])
    for node in workflow.nodes.values():
        if node.status in (Status.RUNNING, Status.READY):
            transition.requeue(node)
    settings = dict(data.get("settings") or {})
    chosen = settings.pop("chosen", 0)
    origin = settings.pop("origin", None)
    candidates = []
    if data.get("candidates"):
        from .engine.planner import Candidate
        candidates = [Candidate.from_dict(c) for c in data["candidates"]]
    flow = Flow(workflow, name=data.get("name") or "flow", candidates=candidates, chosen=chosen,
                run_id=data["id"], llm=llm, store=store, save=False, origin=origin,
                **{k: v for k, v in settings.items() if k in DEFAULTS})
    flow.update_log = data.get("updates") or []
    flow.unpriced.update(a["model"] for n in workflow.nodes.values() for a in n.attempts
                         if a.get("unpriced") and a.get("model"))
    flow.result = data.get("result")
    status = data.get("status")
    flow.status = (RunState.INTERRUPTED if status == RunState.RUNNING
                   else RunState(status) if status in tuple(RunState) else status)
    return flow
