"""How a Flow comes to be: a task planned (`plan`, `aplan`), a run loaded from the store
(`load`), an exported notebook's plan cell (`flow_from_plan`)."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any, Callable

from .._internal.aio import run_blocking
from ..engine.prompt_start import flow_start
from ..errors import ConfigError
from ..llm.client import LLM, get_llm
from ..llm.endpoints import check_model
from ..model import status as transition
from ..model.graph import Workflow
from ..model.status import RunState, Status
from ..settings import DEFAULTS, Settings
from ..store import Store, get_store
from .facade import Flow, new_run_id

__all__ = ["plan", "aplan", "load", "flow_from_plan", "say_where_code_cannot_run"]


async def aplan(task: str, k: int | None = None, model: str | None = None,
                strategy: str = "balanced",
                *, name: str = "flow", llm: LLM | None = None, tools: Any = None,
                progress: Callable[[dict], Any] | None = None, inputs: Any = None,
                start_session: bool = False, **settings: Any) -> Flow:
    """Plan `task` as K candidate graphs and keep the best by `planner.RULE` (connected and
    covering first, then the most parallel, then the least tangled); K left out is
    `planner.default_k` (3, or a server you run's slots when fewer); `progress(event)` hears
    each step (see planner.plan_candidates). `inputs` (file paths, or {name: DataFrame / value
    / path}) are saved in the run's workspace; the planner and every agent are told what they
    hold. `start_session` (for a flow that runs next, as `%%flow --run` and `--step` do):
    its sandboxed Python session starts while the task is planned, so the first cell does not
    wait for the sandbox, the imports and the inputs to load (about 1 s)."""
    from ..engine import planner

    if not isinstance(task, str) or not task.strip():
        raise ConfigError("the task is empty; write what you want done in words")
    llm = llm or get_llm()
    llm.warm(model)   # the embedded server starts while the inputs load and the sandbox starts
    if k is None:
        k = await asyncio.to_thread(planner.default_k, model)
    settings = Settings(**{**settings, "k": k, "model": model, "strategy": strategy})
    check_model(model)   # before any paid call: a model the endpoint does not list is refused
    say_where_code_cannot_run(settings)
    run_id = new_run_id()
    context = start = early = None
    if inputs is not None:
        from ..engine.workspace import Workspace
        store_home = llm.store.path.parent
        workspace = Workspace.for_run(store_home, run_id, settings.workdir,
                                      settings.workdir_writes)
        await asyncio.to_thread(workspace.add, inputs)   # the inputs are read off the loop
        context = workspace.describe()
        if settings.execute != "off" and workspace.inputs:   # its nodes' prompts open alike
            start = flow_start(task.strip(), workspace, int(settings.context_chars),
                               working_start=False)
            early = _EarlySession(workspace, settings) if start_session else None
    try:
        candidates, chosen = await planner.plan(
            task.strip(), k=k, model=model, strategy=strategy, llm=llm, seed=settings.seed,
            max_subtasks=settings.max_subtasks, max_agents=settings.max_agents, run_id=run_id,
            progress=progress, context=context, start=start, method=settings.plan_method,
            time_limit_s=settings.plan_time_s)
        workflow = candidates[chosen].workflow.copy()
        flow = Flow(workflow, name=name, candidates=candidates, chosen=chosen, run_id=run_id,
                    llm=llm, tools=tools, **settings)
    except BaseException:
        if early is not None:
            early.drop()
        raise
    if early is not None:
        flow.space.adopt(early.session)
    flow.spent_usd = sum(c.cost_usd for c in candidates)
    return flow


class _EarlySession:
    """A flow's Session on `workspace`, starting in a thread of its own while the task is
    planned (a start that fails is left to the first cell, which starts it again and says
    why it cannot)."""

    def __init__(self, workspace, settings: Settings):
        from ..engine.session import Session

        self.session = Session(workspace, sandbox=settings.sandbox)
        self._dropped = threading.Event()
        threading.Thread(target=self._start, name="flowmagic-session-start", daemon=True).start()

    def _start(self) -> None:
        try:
            self.session.start()
        except Exception:  # noqa: BLE001 - reported by the first cell's own start
            pass
        if self._dropped.is_set():   # dropped while it started: it ends now
            self.session.close()

    def drop(self) -> None:
        """No flow takes it (the plan failed): it ends now, or as soon as its start returns."""
        self._dropped.set()
        self.session.close()


def say_where_code_cannot_run(settings: Settings) -> None:
    """One line, before any paid call, when this machine cannot run model-written code (no
    bubblewrap, no user namespaces, not Linux) and the flow would try: what to do, and that
    text-only nodes still run."""
    if settings.execute == "off" or settings.sandbox != "bwrap":
        return
    from ..engine.sandbox import sandbox_status
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
    from ..ops.replay import plan_parts

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
        from ..engine.planner import Candidate
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
