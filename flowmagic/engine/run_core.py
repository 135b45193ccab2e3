"""`RunCore`: one flow's run: the loop, the budget, and the update and repair policy.

The facade (`flowmagic.flow.Flow`) asks; the core runs. `run()` drives the scheduler
(`scheduler.Executor`, the asyncio driver around `ready_set.ReadySet`) with the node runner
as each node's work, stops starting nodes when the budget is spent or the store fails,
decides after each node whether the plan needs an update (`wants_update`), and makes it
(`update`): a cheap repair first (`repairs`), the updater's re-plan (`updater`) only when no
repair is left. When every node is done it writes the final summary (`summary`). Every state
change goes through the recorder, which writes it before anyone is told.
"""

from __future__ import annotations

import sys
import time

from ..errors import FlowError, NodeError, StoreError
from ..model.status import RunState, Status
from . import summary
from .answer_code import made_files
from .budget import Budget
from .context import RunContext
from .node_runner import CONTINUATIONS, NodeRunner, embedded_on_data
from .recorder import Recorder
from .run_record import RunRecord
from .run_space import RunSpace
from .scheduler import Executor, Work
from .tool_choice import ToolChoice

__all__ = ["RunCore"]

# Re-plans per run when the settings leave it to the endpoint (None). On the embedded model in
# a flow on data one: SmolLM2's 65 re-plans in 60 stored runs (csv_eda, dabench-dev, tutorials;
# issue 31) made no change 54 times and added a node named "no_change" (9) or "add_to_memory"
# (2), never a change that served the task, while each took ~20 s there (~1,700 prompt tokens
# evaluated at ~9 ms). None: session 15's csv_eda spent 17.8 of its 85 s (2 threads) on the one
# kept, to answer {"action": "update", "remove": ["*"]} (issue 31's 60 s); the run says in one
# line that max_updates stopped it and how to allow one.
MAX_UPDATES, EMBEDDED_DATA_UPDATES = 5, 0


class RunCore:
    def __init__(self, record: RunRecord, *, llm, recorder: Recorder, space: RunSpace,
                 tools: ToolChoice):
        self.record, self.llm = record, llm
        self.recorder, self.space, self.tools = recorder, space, tools
        self.budget = Budget(record)
        self.executor: Executor | None = None   # the executor of the run under way
        self._triggers: list[dict] = []   # what called the next update: [{"node", "why"}]
        self._capped = False              # max_updates already said so in this run
        self.conversations: dict = {}     # RunContext.conversations, kept across runs

    def context(self) -> RunContext:
        """This run as the engine sees it (the node runner, prompts, fingerprints)."""
        return RunContext(self.record, self.record.settings, self.llm, self.recorder,
                          self.space, self.tools, self.budget, self.conversations)

    def make_executor(self, work: Work | None = None) -> Executor:
        """The executor a run uses: its hooks persist every state change (`emit`), stop
        starting nodes at the budget and call the updater. `work(node_id) -> Outcome`
        replaces the node runner when given (a benchmark's zero-latency stand-in)."""
        settings, record = self.record.settings, self.record
        return Executor(lambda: record.workflow, work or NodeRunner(self.context()).run,
                        concurrency=settings.concurrency, on_event=self.recorder.emit,
                        can_start=self.budget.reached, after_node=self.wants_update,
                        update=self.update, concurrent_update=settings.update == "concurrent")

    # -- the run ---------------------------------------------------------------------------
    async def run(self, *, step: bool = False, only: list[str] | None = None,
                  work: Work | None = None) -> str:
        """Run (or step) to completion on the current loop; returns the run state. `work`
        replaces the node runner when given (see make_executor)."""
        if self.executor is not None:
            raise NodeError(f"flow {self.record.name!r} is already running; pause() or stop() "
                            "it first")
        import openai  # noqa: F401 - loaded before the clock of the first node starts

        record, recorder = self.record, self.recorder
        self.executor = executor = self.make_executor(work)
        if record.status == RunState.INCOMPLETE:   # its result was written from part of the work
            record.result = None
        record.status, record.message, self._capped = RunState.RUNNING, None, False
        # a failed write stops what the run starts; the nodes running finish and are held
        recorder.begin(on_failure=lambda _exc: executor.pause())
        state = RunState.STOPPED
        try:
            recorder.set_status(RunState.RUNNING)
            recorder.flush()   # what a failed write held in an earlier run, before anything starts
            while recorder.error is None:
                state = await executor.run(step=step, only=only)
                if recorder.error is not None:
                    break
                if state == RunState.BUDGET:
                    record.message = executor.stop_reason
                elif (record.message or "").startswith("pausing"):
                    record.message = None
                if state == RunState.DONE and record.settings.consolidate and record.result is None:
                    try:
                        await self.consolidate()
                    except FlowError as exc:   # every node is done and stored; only the summary is missing
                        record.message = f"the final consolidation failed ({exc}); run() again to retry it"
                elif (state == RunState.INCOMPLETE and record.settings.consolidate
                      and record.result is None and (failed := self._partial())):
                    try:   # what finished is not lost behind the node that failed
                        await self.consolidate(failed=failed)
                    except FlowError as exc:
                        record.message = f"the summary of the finished subtasks failed ({exc})"
                # A rerun or an edit asked for while the run was finishing joins this run.
                if not (state == RunState.DONE and not step and only is None
                        and any(n.status == Status.PENDING for n in record.workflow.nodes.values())):
                    break
        except StoreError as exc:   # a write of its own (the run's status, a tool call, an update)
            recorder.error = exc
        finally:
            state = self._end(state)
        return state

    def _end(self, state: str) -> str:
        """Store and announce how the run ended. A store that failed during it makes the end
        an error, said in one line (also on stderr): a run whose results are not all stored
        is never reported done."""
        record, recorder = self.record, self.recorder
        try:
            self.executor = None
            recorder.flush()   # the run's last node events (a failure lands in recorder.error)
            if recorder.error is None:
                try:
                    recorder.set_status(state, record.result)
                except StoreError as exc:
                    recorder.error = exc
            if recorder.error is not None:   # (the store still says "running")
                state, record.message = RunState.ERROR, recorder.unstored()
                print(f"flowmagic: {record.message}", file=sys.stderr)
            record.status = state
            recorder.emit("run", None, {"state": record.status, "message": record.message})
        finally:
            recorder.end()
        return state

    # -- control ----------------------------------------------------------------------------
    def pause(self) -> None:
        """Nothing new starts; running nodes finish (`message` says how many it waits for)."""
        if self.executor is not None:
            self.executor.pause()
            running = sum(n.status == Status.RUNNING for n in self.record.workflow.nodes.values())
            self.record.message = (f"pausing: waiting for {running} running node"
                                   f"{'s' if running != 1 else ''} to finish" if running
                                   else "pausing")
            self.recorder.emit("pausing", None, {"running": running,
                                                 "message": self.record.message})

    def stop(self) -> None:
        """Cancel in-flight calls; those nodes go back to pending; nothing finished is lost."""
        if self.executor is not None:
            self.executor.stop()

    def changed(self, kind: str, node_id: str | None, **data) -> None:
        """The plan was steered (pruned, edited, ...): stored, recounted, announced."""
        self.recorder.save_run()
        if self.executor is not None:
            self.executor.recount()
        self.recorder.emit(kind, node_id, data)

    def restart_running(self, node_ids) -> None:
        """Running nodes whose inputs were just reset are cancelled and run again after."""
        nodes = self.record.workflow.nodes
        running = [i for i in node_ids if i in nodes and nodes[i].status == Status.RUNNING]
        if running and self.executor is not None:
            self.executor.restart(running)

    # -- updates and repairs -------------------------------------------------------------------
    def _replans(self) -> int:
        """Updates made by the updater so far (cheap repairs are bounded per node instead)."""
        return sum(1 for e in self.record.update_log if e.get("kind") == "replan")

    def _max_updates(self) -> int:
        """The re-plans a run may make: the settings', or where they leave it to the endpoint
        (None) MAX_UPDATES, EMBEDDED_DATA_UPDATES on the embedded model in a flow on data."""
        given = self.record.settings.max_updates
        if given is not None:
            return int(given)
        on_data = embedded_on_data(self.record.settings.model, self.space.inputs())
        return EMBEDDED_DATA_UPDATES if on_data else MAX_UPDATES

    def wants_update(self, node_id: str, ok: bool, outcome) -> bool:
        """After a node: whether an update runs before more nodes start (the executor's hook)."""
        settings = self.record.settings
        strategy = settings.update
        if strategy == "off":
            return False
        # Read from the output itself, never from the fault injector's flag: Flow's masking
        # experiment asks whether the system notices an output that reads "none".
        text = (outcome.output or "").strip().lower()
        problem = "failed" if not ok else "empty" if text in ("", "none") else None
        if strategy == "on-failure" and problem is None:
            return False
        repair_due = problem == "failed" and settings.repairs
        if self._replans() >= self._max_updates() and not repair_due:
            self._say_capped(node_id)
            return False
        self._triggers.append({"node": node_id, "why": problem or "finished"})
        return True

    def _say_capped(self, node_id: str) -> None:
        """One line, once per run, when max_updates stops an update."""
        if self._capped:
            return
        self._capped = True
        self.record.message = (f"max_updates ({self._max_updates()}) reached: "
                               f"no update after {node_id}; raise max_updates "
                               "(%%flow --max-updates N) to allow more")
        self.recorder.emit("update_capped", node_id, {"message": self.record.message})

    async def update(self) -> None:
        """Repair cheaply first (refine the instruction, then substitute the agent of a
        failed node), and re-plan with the updater only when no repair is left."""
        from . import repairs

        record, settings = self.record, self.record.settings
        trigger, self._triggers = self._triggers, []
        before = record.workflow.copy()
        fix = None
        if settings.repairs:
            fix = await repairs.plan_repair(before, record.update_log, self.llm,
                                            model=settings.model, seed=settings.seed,
                                            run_id=record.run_id, max_tokens=settings.max_tokens)
        if fix is not None:
            self.budget.spend(fix.usage.get("cost_usd", 0.0))
            entry = {"kind": fix.kind, "trigger": [fix.node_id], "reason": fix.reason,
                     "no_change": False, "errors": [], "calls": 1}
            update = fix.update
        elif self._replans() >= self._max_updates():
            self._say_capped(trigger[-1]["node"] if trigger else "the last node")
            return
        else:
            entry, update = await self._replan(before, trigger)
        self._apply(entry, update, before)

    def _apply(self, entry: dict, update, before) -> None:
        """Merge an update (None: no change) onto the live workflow, nodes may have finished
        since the snapshot `before`, and log it."""
        from . import updater

        record = self.record
        entry.update(time=time.time(), strategy=record.settings.update)
        if update is not None:
            record.workflow, entry["diff"] = updater.merge(record.workflow, update)
            entry["stats"] = updater.stats(entry["diff"], before)
            self.restart_running(entry["diff"]["stale"])
            self.recorder.save_run()
        record.update_log.append(entry)
        self.recorder.add_update(entry)
        self.recorder.emit("updated", None, {"no_change": entry["no_change"], "kind": entry["kind"]})

    async def _replan(self, before, trigger: list[dict]):
        """(update log entry, update or None): the updater's answer to what called it."""
        from . import repairs, updater

        record, settings = self.record, self.record.settings
        # Not the nodes' cap: a restructure cut at 512 tokens silently became "no change";
        # an answer cut anyway is continued (updater._ask).
        result = await updater.propose(before, llm=self.llm, k=int(settings.update_k),
                                       model=settings.model, seed=settings.seed,
                                       run_id=record.run_id, max_tokens=updater.UPDATE_MAX_TOKENS,
                                       trigger=trigger, start=self._flow_start(before))
        for candidate in result.candidates or []:
            self.budget.spend(getattr(candidate, "cost_usd", 0.0))
        called = {t["node"] for t in trigger if t["why"] != "finished"}
        again = [] if result.no_change else repairs.same_again(before, result.workflow, result.diff)
        if again:   # its code would fail as it did: the run ends here rather than repeat it
            result.no_change = True
            result.diff["warnings"].append(
                f"not run again: the update would run {', '.join(again)} again as it was, "
                "and its code failed on every try; change its requirement or its code to go on")
        entry = {"kind": "replan", "no_change": result.no_change, "stats": result.stats,
                 "calls": len(result.candidates or []),
                 "diff": result.diff, "errors": list(result.errors or []),
                 "rationale": result.rationale, "chosen": result.chosen,
                 "trigger": [i for i, n in before.nodes.items()   # plan order
                             if n.status == Status.FAILED or i in called]}
        return entry, None if result.no_change else result.update

    def _on_data(self) -> bool:
        """Whether this is a flow on input files whose code runs."""
        return self.record.settings.execute != "off" and bool(self.space.inputs())

    def _flow_start(self, workflow, *, working_start: bool = True) -> str | None:
        """The start the nodes' prompts of a flow on input files share (prompt_start), for a
        call of the run's own (the update, the summary) to open with, the working start's run
        in it when a done node holds one; None for any other flow."""
        settings = self.record.settings
        if not self._on_data():
            return None
        from .answer_code import report
        from .prompt_start import flow_start
        from .working_start import start_run
        return flow_start(workflow.task or "", self.space.workspace, int(settings.context_chars),
                          working_start=working_start, ran=report(start_run(workflow)))

    # -- the final write-up ----------------------------------------------------------------------
    async def _summary(self, messages: list[dict], schema: dict | None = None):
        settings = self.record.settings
        more = CONTINUATIONS if settings.continuations is None else int(settings.continuations)
        reply = await self.llm.complete_whole(messages, model=settings.model, seed=settings.seed,
                                              continuations=more, schema=schema,
                                              max_tokens=settings.max_tokens,
                                              run_id=self.record.run_id, purpose="consolidate")
        self.budget.spend(reply.cost_usd)
        return reply

    def _recheck(self, node_id: str, requirement: str) -> None:
        """Once a run: the node whose code should have printed the answer's values runs
        again, asked for them by name (summary.recheck); logged as an update."""
        entry = {"kind": summary.RECHECK, "trigger": [node_id], "no_change": False,
                 "errors": [], "calls": 0,
                 "reason": "no output held a value the task's answer form asks for"}
        self._apply(entry, {"action": "update", "subtasks": [
            {"id": node_id, "requirement": requirement, "rerun": True}]},
            self.record.workflow.copy())
        if self.executor is not None:
            self.executor.recount()

    def _partial(self) -> list[str]:
        """The failed subtasks of a run that ended incomplete with some subtask done (none
        pending or running: nothing more could start), else []."""
        nodes = self.record.workflow.nodes.values()
        if not any(n.status == Status.DONE for n in nodes):
            return []
        return [n.id for n in nodes if n.status == Status.FAILED]

    def _conversation(self, active: list) -> list[dict] | None:
        """The prompt and answer the one done node passed with in this process, while its
        output is still that answer's (summary._going_on), else None."""
        if len(active) != 1:
            return None
        kept = self.conversations.get(active[0].id)
        return kept[1] if kept is not None and kept[0] == active[0].output else None

    async def consolidate(self, failed: list[str] | None = None) -> None:
        """The final write-up (engine/summary.py): a summary of what the nodes did, or the
        answer a node gave in the task's form; it never rewrites their work. `failed`: the
        run ended incomplete, these subtasks failed, and the result is written from the
        subtasks that finished, marked so; a later run() writes it again."""
        record, settings = self.record, self.record.settings
        wf = record.workflow
        active = [n for n in wf.nodes.values() if n.status == Status.DONE]
        data = self._on_data()
        written = await summary.write(wf, self._summary, budget=int(settings.context_chars),
                                      data=data,
                                      start=self._flow_start(wf, working_start=False),
                                      conversation=self._conversation(active))
        if failed:
            record.result = f"{written.text}\n\n{summary.partial_mark(failed)}"
            return
        again = summary.recheck(wf, written) if data and settings.update != "off" else None
        if again is not None and not any(e.get("kind") == summary.RECHECK
                                         for e in record.update_log):
            self._recheck(*again)   # (the result is written when it has run again)
            return
        record.result = written.text
        made = [f for n in active for f in made_files(n.execution)]
        if made:   # the deliverables are files: listed as they are, never rewritten
            record.result += ("\n\nFiles of this run (in flow.workspace, next to an exported "
                              "notebook): " + ", ".join(made))
        if written.cut:   # shown, never passed off as whole
            record.result += ("\n\n[cut: this summary reached the token limit and is unfinished; "
                              "the subtasks' results are complete]")
            record.message = ("the final summary was cut at the token limit; raise max_tokens "
                              "to get all of it")
