"""The one gate where a model's answer becomes plan data: plans, updates and repairs.

A model's answer is untrusted input. Whatever path it takes (a one-shot plan, the stepwise
planner's steps, an update, a repair), it is read here, by a strict schema, before it can
become a `Workflow` or change one:

- unknown fields are refused, not kept; fields only a run may set (status, output,
  attempts, execution, figures, timings, tokens, cost, call ids, stale, clone,
  downgraded_from ...) are refused too, so a plan cannot say that a node ran;
- node ids and agent roles are slugs, model names come from the safe alphabet of `names`
  (whether the endpoint serves the model is the planner's check, one layer up);
- a refused answer is one `PlanError` line saying why; it is never half-kept.

The many shapes models write (spellings of keys, wrappers, Flow's paper form) are still
read, by `plans.repair_plan` (strict mode) and `merge`; the canonical result is then checked
by pydantic models that forbid extra fields. A plan the user wrote (`Flow.from_dict`) and a
run the store saved are the user's own and are not read here.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from ..errors import PlanError
from .._internal.text import short_repr
from .graph import Workflow
from .merge import UPDATE_ENTRY_FIELDS, UPDATE_FIELDS, read_update
from .names import agent_name_problem, model_name_problem
from .node import is_slug
from .plans import STATE_FIELDS, RepairedPlan, repair_plan

__all__ = ["PlannedSubtask", "UpdateSubtask", "UpdateAnswer", "RefineAnswer", "AgentAnswer",
           "NotebookNode", "NotebookPlan", "plan_from_answer", "update_from_answer",
           "refine_from_answer", "agent_from_answer", "plan_from_notebook"]

_MAX_TEXT = 20_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _slug(value: str) -> str:
    if not is_slug(value):
        raise ValueError(f"{short_repr(value, 40)} is not an id (1-40 of a-z, 0-9, _)")
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("it is empty")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"it has {len(value)} characters (at most {_MAX_TEXT})")
    return value


def _agent_name(value: str) -> str:
    problem = agent_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _model_name(value: str) -> str:
    problem = model_name_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _estimate(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("an estimate is a number of seconds, 0 or more")
    return value


Id = Annotated[str, AfterValidator(_slug)]
Text = Annotated[str, AfterValidator(_text)]
Role = Annotated[str, AfterValidator(_agent_name)]
ModelName = Annotated[str, AfterValidator(_model_name)]


class PlannedSubtask(_Strict):
    """A subtask as a model's plan may give it, after repair."""
    id: Id
    requirement: Text
    agent: Role
    model: ModelName | None = None
    estimate_s: Annotated[float | int, AfterValidator(_estimate)] | None = None


class UpdateSubtask(_Strict):
    """One entry of an update's "subtasks", as `merge.read_update` read it (a missing id is
    made from the requirement by `merge`; a dependency may name a node by its text)."""
    id: Id | None = None
    requirement: Text | None = None
    agent: Role | None = None
    depends_on: list[str] | None = None
    rerun: bool = False


class UpdateAnswer(_Strict):
    """An update as `merge` applies it: a no-change, or changes and removals by node id."""
    action: Literal["update", "no_change"]
    rationale: str | None = None
    subtasks: list[UpdateSubtask] = []
    remove: list[str] = []


class RefineAnswer(_Strict):
    """A refine_instruction repair's answer: the rewritten requirement."""
    requirement: Text


class AgentAnswer(_Strict):
    """A substitute_agent repair's answer: a role among those offered, and why."""
    agent: str
    why: str | None = None


class NotebookNode(_Strict):
    """A node as an exported notebook's `%%flow_plan` cell gives it (the cell can be edited,
    so it is read like a model's answer: the names safe, no state but a prune)."""
    id: Id
    requirement: Text
    agent: Role
    model: ModelName | None = None
    downgraded_from: ModelName | None = None
    status: Literal["pruned"] | None = None


class NotebookPlan(BaseModel):
    """The body of a `%%flow_plan` cell; its settings are checked by `Settings`."""
    model_config = ConfigDict(extra="forbid")
    task: str = ""
    settings: dict[str, Any] = {}
    nodes: list[NotebookNode]
    edges: list[tuple[Id, Id]] = []


def _one_line(exc: ValidationError, what: str) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "the answer"
    why = str(err.get("msg", "")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        state = err.get("loc", ("",))[-1] in STATE_FIELDS
        why = ("only a run may set it" if state else "it is not a field of " + what)
    return f"{what}: {where}: {' '.join(why.split())}; this answer was refused"


def _checked(plan: RepairedPlan) -> RepairedPlan:
    for node in plan.nodes:
        fields = {"id": node.id, "requirement": node.requirement, "agent": node.agent}
        fields.update({k: getattr(node, k) for k in ("model", "estimate_s")
                       if getattr(node, k) is not None})
        try:
            PlannedSubtask.model_validate(fields)
        except ValidationError as exc:
            raise PlanError(_one_line(exc, f"subtask {node.id}")) from None
    return plan


def plan_from_answer(answer: Any, task: str = "") -> Workflow:
    """The Workflow of a model's plan (JSON text or parsed JSON), or one `PlanError`."""
    return Workflow.assemble(_checked(repair_plan(answer, task, strict=True)))


def update_from_answer(answer: Any) -> dict:
    """A model's update (JSON text or parsed JSON) in the canonical form `UpdateAnswer`,
    for `merge`; a field it may not give refuses it with one `PlanError`."""
    read = read_update(answer)
    extra = [k for k in read.top if k not in UPDATE_FIELDS]
    extra += [k for entry in read.entries for k in entry if k not in UPDATE_ENTRY_FIELDS]
    if extra:
        key = extra[0]
        why = "only a run may set it" if key in STATE_FIELDS else "it is not a field of an update"
        raise PlanError(f"the update has the field {short_repr(key, 40)}: {why}; this answer "
                        "was refused")
    canonical = {"action": "no_change" if read.no_change else "update",
                 "subtasks": [c.to_dict() for c in read.changes], "remove": read.remove}
    if read.rationale is not None:
        canonical["rationale"] = read.rationale
    try:
        return UpdateAnswer.model_validate(canonical).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise PlanError(_one_line(exc, "the update")) from None


def plan_from_notebook(plan: Any) -> dict:
    """The body of a `%%flow_plan` cell, checked by `NotebookPlan`, or one `PlanError`."""
    try:
        return NotebookPlan.model_validate(plan).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        raise PlanError(_one_line(exc, "the %%flow_plan cell").replace(
            "this answer was refused", "fix the cell or export the flow again")) from None


def refine_from_answer(answer: Any) -> str:
    """The requirement a refine_instruction answer gives, or one `PlanError`."""
    try:
        return RefineAnswer.model_validate(answer).requirement
    except ValidationError as exc:
        raise PlanError(_one_line(exc, "the rewritten instruction")) from None


def agent_from_answer(answer: Any, offered: list[str]) -> str:
    """The role a substitute_agent answer chose among `offered`, or one `PlanError`."""
    try:
        agent = AgentAnswer.model_validate(answer).agent
    except ValidationError as exc:
        raise PlanError(_one_line(exc, "the chosen agent")) from None
    if agent not in offered:
        raise PlanError(f"the chosen agent {short_repr(agent, 40)} is none of the roles offered "
                        f"({', '.join(offered[:8])}); this answer was refused")
    return agent

