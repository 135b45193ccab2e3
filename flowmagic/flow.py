"""`Flow`: the public API every button, magic and CLI command calls.

A Flow owns one workflow, its candidates, its settings and its run. Every state change
is written to the store before anyone is told, so a kernel restart loses nothing
(`flowmagic.load(run_id)` resumes). In a notebook (a running event loop) `run()` starts
an asyncio task on the kernel's loop and returns at once; in a script it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
import traceback
import weakref
from typing import Any, Callable

from . import ops
from ._internal.aio import in_loop, run_blocking
from ._internal.live import LiveRun
from ._internal.bars import progress_bar, ticking
from .view.frames import Candidates, cost_frame, rows_frame
from .model import metrics as _metrics
from .llm.endpoints import check_model, resolve
from .errors import ConfigError, FlowError, NodeError, StoreError
from .engine import numbers, summary
from .engine.answer_code import made_files
from .engine.scheduler import Executor, Work
from .model.graph import Workflow
from .llm.client import LLM, get_llm
from .engine.context import RunContext
from .engine.recorder import Recorder
from .engine.node_runner import NodeRunner
from .store import Store, get_store
from .model import status as transition
from .settings import DEFAULTS, Settings
from .model.status import RunState, Status

__all__ = ["Flow", "plan", "aplan", "load", "flow_from_plan", "DEFAULTS", "Settings"]

_TOOLS_MODULE = f"{__package__}.engine.tools"


def _new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


class Flow(LiveRun):
    """A planned workflow with its run; see the module docstring."""

    def __init__(self, workflow: Workflow, *, name: str = "flow", candidates: list | None = None,
                 chosen: int = 0, run_id: str | None = None, llm: LLM | None = None,
                 store: Store | None = None, save: bool = True, tools: Any = None,
                 origin: str | None = None, inputs: Any = None, **settings: Any):
        self.workflow = workflow
        self.name = name
        self.candidates = Candidates(candidates or [])
        self.chosen = chosen
        self.settings = Settings(**settings)
        self.run_id = run_id or _new_run_id()
        self.origin = origin   # "replay": made by an exported notebook's cells (see load())
        self.llm = llm or get_llm()
        self.store = store or self.llm.store
        self.update_log: list[dict] = []
        self.result: str | None = None
        self.status = RunState.PLANNED
        self.message: str | None = None
        self.spent_usd = 0.0
        self.unpriced: set[str] = set()   # models used with no known price (cost unknown)
        LiveRun.__init__(self)
        self._executor: Executor | None = None
        # every state change is written through the recorder before anyone is told
        self.recorder = Recorder(self.store, self.run_id, lambda: self.workflow, self.tell)
        self.emit = self.recorder.emit
        self.partial_output = self.recorder.partial_output
        self._tools = None   # None: every @flowmagic.tool; a list: exactly these
        if tools is not None:
            self.tools = tools
        self.probe = None   # a flowmagic.ops.batch.Probe once attach_probe() was called
        self.last_slim = None   # (slimmed Flow, SlimReport) of the last slim(), for UIs
        self._workspace = None
        self._session = None      # the sandboxed Python session of its code (see session())
        self._no_folder = False   # this run has no workspace folder yet (see _inputs)
        if inputs is not None:
            self.add_inputs(inputs)
        self._triggers: list[dict] = []   # what called the next update: [{"node", "why"}]
        self._capped = False              # max_updates already said so in this run
        if save:
            self._save_run()

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

    # -- persistence and events ---------------------------------------------------------
    def _save_run(self) -> None:
        self.recorder.save_run(
            task=self.task, name=self.name, status=self.status,
            workflow=self.workflow.to_dict(), result=self.result,
            candidates=[c.to_dict() if hasattr(c, "to_dict") else c for c in self.candidates],
            settings={**self.settings, "chosen": self.chosen,
                      **({"origin": self.origin} if self.origin else {})})

    def _spend(self, usd: float, *, unpriced: str | None = None) -> None:
        """Add to what the run cost; `unpriced` names a model whose calls have no known price
        (their cost is unknown, not $0)."""
        self.spent_usd += usd or 0.0
        if unpriced and unpriced not in self.unpriced:
            self.unpriced.add(unpriced)
            if self.settings.budget_usd is not None:   # said once per model and Flow
                print(f"flowmagic: budget_usd cannot count the calls to {unpriced}: no price is "
                      "known for it, so they count as $0; give one with flowmagic.configure("
                      "prices={MODEL: (USD per 1M in, per 1M out)})", file=sys.stderr)

    def _budget_left(self) -> str | None:
        budget = self.settings.budget_usd
        if budget is not None and self.spent_usd >= float(budget):
            return (f"budget of ${float(budget):.4f} reached (spent ${self.spent_usd:.4f}); "
                    "nothing new starts, finished nodes are kept; raise budget_usd and run() again")
        return None

    # -- the workspace (flowmagic.workspace) ------------------------------------------------
    @property
    def workspace(self):
        """The folder of this run's inputs and files (made when first needed)."""
        if self._workspace is None:
            from .engine.workspace import Workspace
            self._workspace = Workspace.for_run(self.store.path.parent, self.run_id,
                                                self.settings.workdir,
                                                self.settings.workdir_writes)
        return self._workspace

    def add_inputs(self, inputs: Any) -> list:
        """Declare inputs: file paths, or {name: DataFrame / value / path}; see Workspace.add."""
        return self.workspace.add(inputs)

    def files(self) -> list[str]:
        """The files in the workspace now: inputs, deliverables, what code wrote, figures."""
        made = (self._workspace is not None or self.settings.workdir
                or self._workspace_dir().is_dir())
        return self.workspace.files() if made else []

    def _workspace_dir(self):
        """Where this run's workspace is (or would be) when no workdir is set."""
        return self.store.path.parent / "runs" / self.run_id / "workspace"

    def _inputs(self) -> list:
        """The declared inputs, without making the workspace folder: a run with none (no
        input added, no workdir, no folder left on disk by an earlier session) needs no
        folder for its prompts, and asks for every node."""
        if self._workspace is None and not self.settings.workdir:
            if self._no_folder or not self._workspace_dir().is_dir():
                self._no_folder = True   # (add_inputs makes the workspace, which is seen first)
                return []
        return self.workspace.inputs

    # -- the Python session (flowmagic.engine.session) -----------------------------------
    def session(self):
        """The flow's sandboxed Python session, where its nodes' code runs one cell at a time
        (started when first needed; after a restart it runs the recorded cells again)."""
        if self._session is None:
            from .engine.session import Session, recorded_cells
            me = weakref.ref(self)   # the session must not keep its flow alive

            def history() -> list[dict]:
                flow = me()
                return recorded_cells(flow.workflow) if flow is not None else []

            self._session = Session(self.workspace, sandbox=self.settings.sandbox,
                                    history=history)
            weakref.finalize(self, self._session.close)
        return self._session

    def close(self) -> None:
        """End the flow's Python session and every process it started (a later code run
        starts a new one, which first runs the recorded cells again)."""
        if self._session is not None:
            self._session.close()

    # -- running ----------------------------------------------------------------------
    def context(self) -> RunContext:
        """This flow's run as the engine sees it (the node runner, prompts, fingerprints)."""
        return RunContext(current_workflow=lambda: self.workflow, settings=self.settings,
                          llm=self.llm, store=self.store, run_id=self.run_id,
                          open_workspace=lambda: self.workspace, list_inputs=self._inputs,
                          open_session=self.session,
                          emit=self.emit, spend=self._spend, text_sink=self.recorder.text_sink,
                          wait_sink=self.recorder.wait_sink,
                          offer_tools=self.atools_for, has_tools=self._has_tools,
                          # the door's own commit when the flow writes to another store
                          defer_log=self.recorder.log_later if self.store is self.llm.store else None)

    def derive(self, workflow: Workflow, *, name: str, **settings: Any) -> "Flow":
        """A new Flow on `workflow` with this flow's settings (`settings` override them), its
        model door, store and tool choice: a batch item, a slimmed copy."""
        child = Flow(workflow, name=name, llm=self.llm, store=self.store,
                     **{**self.settings, **settings})
        child._tools = self._tools
        return child

    def executor(self, work: Work | None = None) -> Executor:
        """The executor a run of this flow uses: its hooks persist every state change
        (`emit`), stop starting nodes at the budget and call the updater. `work(node_id) ->
        Outcome` replaces the node runner when given (a benchmark's zero-latency stand-in)."""
        return Executor(lambda: self.workflow, work or NodeRunner(self.context()).run,
                        concurrency=self.settings.concurrency, on_event=self.emit,
                        can_start=self._budget_left, after_node=self._wants_update,
                        update=self._update, concurrent_update=self.settings.update == "concurrent")

    async def arun(self, *, step: bool = False, only: list[str] | None = None) -> str:
        """Run (or step) to completion on the current loop; returns the run state."""
        if self._executor is not None:
            raise NodeError(f"flow {self.name!r} is already running; pause() or stop() it first")
        import openai  # noqa: F401 - loaded before the clock of the first node starts

        self._executor = executor = self.executor()
        self.status, self.message, self._capped = RunState.RUNNING, None, False
        # a failed write stops what the run starts; the nodes running finish and are held
        self.recorder.begin(on_failure=lambda _exc: executor.pause())
        state = RunState.STOPPED
        try:
            self.recorder.set_status(RunState.RUNNING)
            self.recorder.flush()   # what a failed write held in an earlier run, before anything starts
            while self.recorder.error is None:
                state = await self._executor.run(step=step, only=only)
                if self.recorder.error is not None:
                    break
                if state == RunState.BUDGET:
                    self.message = self._executor.stop_reason
                elif (self.message or "").startswith("pausing"):
                    self.message = None
                if state == RunState.DONE and self.settings.consolidate and self.result is None:
                    try:
                        await self._consolidate()
                    except FlowError as exc:   # every node is done and stored; only the summary is missing
                        self.message = f"the final consolidation failed ({exc}); run() again to retry it"
                # A rerun or an edit asked for while the run was finishing joins this run.
                if not (state == RunState.DONE and not step and only is None
                        and self.counts().get(Status.PENDING)):
                    break
        except StoreError as exc:   # a write of its own (the run's status, a tool call, an update)
            self.recorder.error = exc
        finally:
            state = self._end_run(state)
        return state

    def _end_run(self, state: str) -> str:
        """Store and announce how the run ended. A store that failed during it makes the end
        an error, said in one line (also on stderr): a run whose results are not all stored
        is never reported done."""
        try:
            self._executor = None
            self.recorder.flush()   # the run's last node events (a failure lands in recorder.error)
            if self.recorder.error is None:
                try:
                    self.recorder.set_status(state, self.result)
                except StoreError as exc:
                    self.recorder.error = exc
            if self.recorder.error is not None:   # (the store still says "running")
                state, self.message = RunState.ERROR, self.recorder.unstored()
                print(f"flowmagic: {self.message}", file=sys.stderr)
            self.status = state
            self.emit("run", None, {"state": self.status, "message": self.message})
        finally:
            self.recorder.end()
        return state

    async def astep(self) -> str:
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
        return self._launch(self.astep)

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
        if self._executor is not None:
            self._executor.pause()
            running = sum(n.status == Status.RUNNING for n in self.workflow.nodes.values())
            self.message = (f"pausing: waiting for {running} running node"
                            f"{'s' if running != 1 else ''} to finish" if running else "pausing")
            self.emit("pausing", None, {"running": running, "message": self.message})

    def resume(self) -> "Flow":
        return self.run()

    def stop(self) -> None:
        """Cancel in-flight calls; those nodes go back to pending; nothing finished is lost."""
        if self._executor is not None:
            self._executor.stop()

    @property
    def running(self) -> bool:
        return self._executor is not None

    @property
    def busy(self) -> bool:
        """A run was started and has not finished (in a notebook it may not have begun yet)."""
        task = self._task
        if self._executor is not None:
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
        from .engine.tools import registry
        return list(self._tools) if self._tools is not None else list(registry().values())

    @tools.setter
    def tools(self, value: Any) -> None:
        from .engine.tools import as_tools
        self._tools = None if value is None else as_tools(value)

    def _has_tools(self) -> bool:
        """Whether nodes are offered any tool (asked once per node: no list is built, and no
        import statement run: no tool is registered before the tools module is loaded)."""
        if self._tools is not None:
            return bool(self._tools)
        tools = sys.modules.get(_TOOLS_MODULE)
        return tools is not None and bool(tools.registry())

    @property
    def chosen_tools(self) -> list | None:
        """The tools set on this flow, or None when it offers every @flowmagic.tool (a copy
        of the flow elsewhere, a Dask worker say, then offers that process's tools)."""
        return None if self._tools is None else list(self._tools)

    def tools_for(self, node_id: str) -> list:
        """The tools offered to a node: the `tools_top_n` most similar to its requirement."""
        from .engine.tools import select_tools
        similarity = self.settings.tool_similarity
        similarity = "tfidf" if similarity in ("auto", "embeddings") else similarity
        return select_tools(self.workflow.node(node_id).requirement, self.tools,
                            top_n=self.settings.tools_top_n,
                            similarity=similarity)

    async def atools_for(self, node_id: str) -> list:
        """The tools offered to a node, by meaning when the endpoint embeds (see
        flowmagic.engine.tools.aselect_tools; `tool_similarity` "auto" by default)."""
        from .engine.tools import aselect_tools
        node = self.workflow.node(node_id)
        return await aselect_tools(node.requirement, self.tools, top_n=self.settings.tools_top_n,
                                   similarity=self.settings.tool_similarity, llm=self.llm,
                                   model=node.model or self.settings.model)

    def tool_calls(self, node_id: str | None = None) -> list[dict]:
        """Every tool call of this run (or of one node): tool, arguments, result, duration, error."""
        return self.store.tool_calls(self.run_id, node_id)

    # -- updates ---------------------------------------------------------------------------
    def _replans(self) -> int:
        """Updates made by the updater so far (cheap repairs are bounded per node instead)."""
        return sum(1 for e in self.update_log if e.get("kind") == "replan")

    def _wants_update(self, node_id: str, ok: bool, outcome) -> bool:
        strategy = self.settings.update
        if strategy == "off":
            return False
        # Read from the output itself, never from the fault injector's flag: Flow's masking
        # experiment asks whether the system notices an output that reads "none".
        text = (outcome.output or "").strip().lower()
        problem = "failed" if not ok else "empty" if text in ("", "none") else None
        if strategy == "on-failure" and problem is None:
            return False
        repair_due = problem == "failed" and self.settings.repairs
        if self._replans() >= int(self.settings.max_updates) and not repair_due:
            self._say_capped(node_id)
            return False
        self._triggers.append({"node": node_id, "why": problem or "finished"})
        return True

    def _say_capped(self, node_id: str) -> None:
        """One line, once per run, when max_updates stops an update."""
        if self._capped:
            return
        self._capped = True
        self.message = (f"max_updates ({int(self.settings.max_updates)}) reached: no update "
                        f"after {node_id}; raise max_updates (%%flow --max-updates N) to allow more")
        self.emit("update_capped", node_id, {"message": self.message})

    async def _update(self) -> None:
        """Repair cheaply first (refine the instruction, then substitute the agent of a
        failed node), and re-plan with the updater only when no repair is left."""
        from .engine import repairs
        from .engine import updater

        trigger, self._triggers = self._triggers, []
        before = self.workflow.copy()
        fix = None
        if self.settings.repairs:
            fix = await repairs.plan_repair(before, self.update_log, self.llm,
                                            model=self.settings.model, seed=self.settings.seed,
                                            run_id=self.run_id, max_tokens=self.settings.max_tokens)
        if fix is not None:
            self._spend(fix.usage.get("cost_usd", 0.0))
            entry = {"kind": fix.kind, "trigger": [fix.node_id], "reason": fix.reason,
                     "no_change": False, "errors": [], "calls": 1}
            update = fix.update
        elif self._replans() >= int(self.settings.max_updates):
            self._say_capped(trigger[-1]["node"] if trigger else "the last node")
            return
        else:
            # Not the nodes' cap: a restructure cut at 512 tokens silently became "no change";
            # an answer cut anyway is continued (updater._ask).
            result = await updater.propose(before, llm=self.llm, k=int(self.settings.update_k),
                                           model=self.settings.model, seed=self.settings.seed,
                                           run_id=self.run_id, max_tokens=updater.UPDATE_MAX_TOKENS,
                                           trigger=trigger)
            for candidate in result.candidates or []:
                self._spend(getattr(candidate, "cost_usd", 0.0))
            called = {t["node"] for t in trigger if t["why"] != "finished"}
            entry = {"kind": "replan", "no_change": result.no_change, "stats": result.stats,
                     "calls": len(result.candidates or []),
                     "diff": result.diff, "errors": list(result.errors or []),
                     "rationale": result.rationale, "chosen": result.chosen,
                     "trigger": [i for i, n in before.nodes.items()   # plan order
                                 if n.status == Status.FAILED or i in called]}
            update = None if result.no_change else result.update
        entry.update(time=time.time(), strategy=self.settings.update)
        if update is not None:
            # Merge onto the live workflow: nodes may have finished since the snapshot.
            self.workflow, entry["diff"] = updater.merge(self.workflow, update)
            entry["stats"] = updater.stats(entry["diff"], before)
            self._restart_running(entry["diff"]["stale"])
            self._save_run()
        self.update_log.append(entry)
        self.recorder.add_update(entry)
        self.emit("updated", None, {"no_change": entry["no_change"], "kind": entry["kind"]})

    def _restart_running(self, node_ids) -> None:
        """Running nodes whose inputs were just reset are cancelled and run again after."""
        running = [i for i in node_ids if i in self.workflow.nodes
                   and self.workflow.nodes[i].status == Status.RUNNING]
        if running and self._executor is not None:
            self._executor.restart(running)

    async def _summary(self, messages: list[dict]):
        reply = await self.llm.complete_whole(messages, model=self.settings.model,
                                              seed=self.settings.seed,
                                              continuations=int(self.settings.continuations),
                                              max_tokens=self.settings.max_tokens,
                                              run_id=self.run_id, purpose="consolidate")
        self._spend(reply.cost_usd)
        return reply

    async def _consolidate(self) -> None:
        """The final write-up (engine/summary.py): a summary of what the nodes did, or the
        answer a node gave in the task's form; it never rewrites their work."""
        wf = self.workflow
        active = [n for n in wf.nodes.values() if n.status == Status.DONE]
        written = await summary.write(wf, self._summary, budget=int(self.settings.context_chars),
                                      data=self.settings.execute != "off" and bool(self._inputs()))
        self.result = written.text
        made = [f for n in active for f in made_files(n.execution)]
        if made:   # the deliverables are files: listed as they are, never rewritten
            self.result += ("\n\nFiles of this run (in flow.workspace, next to an exported "
                            "notebook): " + ", ".join(made))
        if written.cut:   # shown, never passed off as whole
            self.result += ("\n\n[cut: this summary reached the token limit and is unfinished; "
                            "the subtasks' results are complete]")
            self.message = "the final summary was cut at the token limit; raise max_tokens to get all of it"

    # -- steering (every button is one of these) ----------------------------------------------
    def _not_running(self, node_id: str):
        node = self.workflow.node(node_id)
        if node.status == Status.RUNNING:
            raise NodeError(f"node {node_id!r} is running; stop() the flow first")
        return node

    def _changed(self, kind: str, node_id: str, **data: Any) -> None:
        self._save_run()
        if self._executor is not None:
            self._executor.recount()
        self.emit(kind, node_id, data)

    def prune(self, node_id: str) -> None:
        """Remove a node: every predecessor is linked to every successor; history kept."""
        self._not_running(node_id)
        self.workflow.prune(node_id)
        self._changed("pruned", node_id)

    def unprune(self, node_id: str) -> None:
        """Undo prune(): the node and its edges come back, the bypass edges go."""
        self.workflow.unprune(node_id)
        self.result = None
        self._changed("unpruned", node_id)

    def downgrade(self, node_id: str, model: str) -> None:
        """Run this node on another (cheaper) model from now on."""
        node = self._not_running(node_id)
        # a malformed endpoint, or a model the endpoint does not list: a ConfigError now
        check_model(model)
        node.downgraded_from = node.downgraded_from or node.model or self.settings.model or "default"
        node.model = model
        self._changed("downgraded", node_id, model=model)

    def _reset(self, node_id: str) -> None:
        node = self.workflow.nodes[node_id]
        transition.reset(node)

    def rerun(self, node_id: str, *, run: bool = True) -> "Flow":
        """Run a node again; its descendants become pending (their old outputs stay in attempts)."""
        node = self._not_running(node_id)
        if node.status == Status.PRUNED:
            raise NodeError(f"node {node_id!r} is pruned; nothing to rerun")
        descendants = self.workflow.descendants(node_id)
        for i in [node_id, *descendants]:
            if self.workflow.nodes[i].status != Status.RUNNING:
                self._reset(i)
        self._restart_running(descendants)
        self.result = None
        self._changed("rerun", node_id)
        return self.run() if run and self._executor is None else self

    def edit(self, node_id: str, requirement: str) -> None:
        """New requirement: the node runs again on the next run(); descendants are marked stale."""
        node = self._not_running(node_id)
        if not isinstance(requirement, str) or not requirement.strip():
            raise NodeError("a requirement must be non-empty text")
        node.requirement = requirement.strip()
        if node.status in (Status.DONE, Status.FAILED):
            self._reset(node_id)
            descendants = self.workflow.descendants(node_id)
            for i in descendants:
                if self.workflow.nodes[i].status == Status.DONE:
                    self.workflow.nodes[i].stale = True
            self._restart_running(descendants)
        self.result = None
        self._changed("edited", node_id)

    def use_candidate(self, index: int) -> None:
        """Switch to another candidate plan (before anything has run)."""
        if any(n.status in (Status.DONE, Status.RUNNING, Status.FAILED) for n in self.workflow.nodes.values()):
            raise NodeError("this flow has already run nodes; plan again to switch candidates")
        if not 0 <= index < len(self.candidates) or self.candidates[index].workflow is None:
            usable = [c.index for c in self.candidates if c.workflow is not None]
            raise NodeError(f"no usable candidate {index}; usable: {usable}")
        self.workflow = self.candidates[index].workflow.copy()
        self.chosen = index
        self._changed("candidate", None, index=index)

    def to_notebook(self, path, **options: Any):
        """Write the executed workflow as a notebook whose cells replay it (flowmagic.ops.export)."""
        return ops.export_notebook(self, path, **options)

    # -- reading -------------------------------------------------------------------------
    def metrics(self) -> dict:
        return _metrics.summary(self.workflow)

    def counts(self) -> dict:
        out: dict[str, int] = {}
        for node in self.workflow.nodes.values():
            out[node.status] = out.get(node.status, 0) + 1
        return out

    def total(self) -> int:
        return sum(1 for n in self.workflow.nodes.values() if n.status != Status.PRUNED)

    def cost(self):
        """Tokens and USD of this run so far, by purpose, node and model: a DataFrame with
        pandas (`.total`: the totals; `["total"]` and `["rows"]` still work), else
        {"total": ..., "rows": [...]} (see cost_data)."""
        return cost_frame(self.cost_data())

    def cost_data(self) -> dict:
        """Tokens and USD of this run so far, by node and in total (planning and checks too).
        `cached` counts calls answered by flowmagic's response cache; `cached_tokens` the
        input tokens the endpoint served from its own prompt cache (priced at its cached rate)."""
        rows = self.store.usage(self.run_id)
        total = {"calls": 0, "cached": 0, "input_tokens": 0, "cached_tokens": 0,
                 "output_tokens": 0, "cost_usd": 0.0,
                 "unpriced": 0}   # calls whose model has no known price: their USD is unknown
        for row in rows:
            for key in total:
                total[key] += row[key] or 0
        return {"total": total, "rows": rows}

    def trace_numbers(self, node_id: str | None = None):
        """Each number the result states (or, given a node, its answer's text) with the node
        and printed output line it came from, or None where it traces nowhere: a DataFrame
        (number, value, node, line) when pandas is installed, else a list of dicts. The rule
        is flowmagic.engine.numbers' (rounding allowed; years, ordinals, list markers, single
        digits and numbers the task or requirements give are not listed)."""
        if node_id is None:
            return numbers.trace_rows(numbers.result_trace(self.workflow, self.result or ""))
        node = self.workflow.node(node_id)
        answer = next((a.get("output") for a in reversed(node.attempts) if a.get("output")), "")
        stated = numbers.stated_numbers(numbers.strip_claims(answer or ""),
                                        (self.workflow.task or "", node.requirement))
        return numbers.trace_rows(numbers.trace(stated, numbers.output_lines(self.workflow, node_id)))

    def timeline(self):
        """`timeline_rows()` as a DataFrame with pandas (one row per node that ran), else
        the rows."""
        return rows_frame(self.timeline_rows())

    def timeline_rows(self) -> list[dict]:
        """One row per node that ran: start, end, duration, tokens, cost, attempts, and the
        model calls made for it with why each was made (flowmagic.engine.calls)."""
        from .engine.calls import node_calls

        rows = []
        for node in self.workflow.nodes.values():
            if node.start is None:
                continue
            calls = node_calls(node, self.update_log)
            rows.append({"node": node.id, "agent": node.agent, "clone": node.clone,
                         "status": node.status, "start": node.start, "end": node.end,
                         "duration_s": node.duration, "tokens_in": node.tokens_in,
                         "tokens_out": node.tokens_out, "cost_usd": node.cost_usd,
                         "attempts": len(node.attempts), "calls": len(calls),
                         "calls_why": [c["why"] for c in calls],
                         "model": node.ran_on() or node.model})
        return sorted(rows, key=lambda r: r["start"])

    def draw(self, **options: Any):
        """The workflow as a graphviz.Digraph (see flowmagic.view.render.draw for the options)."""
        from .view import render
        return render.draw(self, **options)

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .view import render
        return render.mimebundle(self, include=include, exclude=exclude)

    def estimate(self) -> dict:
        """A rough estimate of a full run: calls, tokens and USD (4 characters a token)."""
        from .llm.endpoints import price_of
        wf = self.workflow
        pending = [n for n in wf.nodes.values() if n.status not in (Status.DONE, Status.PRUNED)]
        out_tokens = int(self.settings.max_tokens or 512) // 2
        tokens_in = tokens_out = 0
        cost = 0.0
        for node in pending:
            parents = len(wf.graph.pred[node.id]) if node.id in wf.graph else 0
            t_in = (len(wf.task) + len(node.requirement) + 300) // 4 + parents * out_tokens
            tokens_in += t_in
            tokens_out += out_tokens
            endpoint, model = resolve(node.model or self.settings.model)
            price = price_of(model, local=endpoint.local) or (0.0, 0.0)
            cost += (t_in * price[0] + out_tokens * price[1]) / 1e6
        calls = len(pending) * (2 if self.settings.validate_ == "llm" else 1) + 1
        return {"calls": calls, "input_tokens": tokens_in, "output_tokens": tokens_out,
                "cost_usd": round(cost, 6)}

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
            options["progress"] = ticking(bar, options.get("progress") or self._slim_event,
                                          _evaluated)
            return ops.run_sync(self, lambda: self.aimportance(probe, scorer, **options),
                                "importance")

    async def aimportance(self, probe: Any = None, scorer: Any = None, **options: Any):
        options.setdefault("progress", lambda e: self.emit("slim", None, e))
        return await ops.aimportance(self, ops.resolve_probe(self, probe, scorer), **options)

    def slim(self, probe: Any = None, scorer: Any = None, **options: Any):
        """(slimmed Flow, SlimReport), also kept as `last_slim`; this flow's workflow is
        untouched (see flowmagic.ops.slimming.aslim)."""
        with progress_bar(f"{self.name}: slim", unit="configuration") as bar:
            options["progress"] = ticking(bar, options.get("progress") or self._slim_event,
                                          _evaluated)
            return ops.run_sync(self, lambda: self.aslim(probe, scorer, **options), "slim")

    def _slim_event(self, event: dict) -> None:
        self.emit("slim", None, event)

    async def aslim(self, probe: Any = None, scorer: Any = None, **options: Any):
        options.setdefault("progress", lambda e: self.emit("slim", None, e))
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
    context = None
    if inputs is not None:
        from .engine.workspace import Workspace
        store_home = llm.store.path.parent
        workspace = Workspace.for_run(store_home, run_id, settings.workdir,
                                      settings.workdir_writes)
        await asyncio.to_thread(workspace.add, inputs)   # the inputs are read off the loop
        context = workspace.describe()
    candidates, chosen = await planner.plan(
        task.strip(), k=k, model=model, strategy=strategy, llm=llm, seed=settings.seed,
        max_subtasks=settings.max_subtasks, max_agents=settings.max_agents, run_id=run_id,
        progress=progress, context=context, method=settings.plan_method,
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
