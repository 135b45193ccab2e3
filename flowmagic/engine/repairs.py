"""Cheap repairs of a failed node, tried before re-planning the whole workflow.

CORAL's orchestrators were seen fixing a failure in two cheap ways before anything
bigger: *refine the instruction* (rewrite that subtask's requirement so it is concrete,
self-contained and answers the reviewer) and *substitute the agent* (give it to another
role). Each repair here is one small model call that returns an update in the updater's
format, `{"action": "update", "subtasks": [{"id", "requirement", "agent", "rerun": true}]}`,
so `updater.merge` applies it: only that node re-runs (its finished descendants become
stale, as with any rerun). When the model's answer is unusable a deterministic fallback
is used (the feedback appended to the requirement; the most similar other role), so a
repair never fails for lack of a good model answer.

`next_kind(update_log, node_id)` says which repair is due for a node (refine, then
substitute, then None: re-plan); `plan_repair` picks the first failed node and does it.

Both repairs are for failures that are not code errors: a node whose code raised (a
NameError, a KeyError, a missing module) is answered by a code fix, its retries naming the
failing line and what exists (engine/diagnosis.py), never by a rewritten instruction or
another agent; when its attempts are spent, the updater re-plans. A rewritten instruction
is checked as a plan's subtask is: an echo of the prompt (its example, its own sentences),
a placeholder, an empty text or one about nothing of the task or the subtask is refused,
and the fallback is used. An update whose only change is to run such a node again as it
was (the same requirement, agent and parents) is not applied (`same_again`): its code
would meet the same data with the same words. On dabench-dev q618 the bench model's updater
answered three times with the failed node's requirement unchanged, each costing an update
call and three more failed tries (some 90 s each at load 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import FlowError, NodeError, PlanError
from ..model.answers import agent_from_answer, refine_from_answer
from ..model.plan_checks import content_words, copied, normalized
from ..model.status import Status
from .._internal.text import cut
from .diagnosis import code_failure

__all__ = ["REPAIR_KINDS", "AGENT_POOL", "Repair", "refine_instruction", "substitute_agent",
           "repair", "next_kind", "feedback_of", "plan_repair", "refusal", "same_again"]

REPAIR_KINDS = ("refine_instruction", "substitute_agent")
AGENT_POOL = ("analyst", "coder", "writer", "researcher", "reviewer", "planner", "assistant")
_MAX_REQ = 8000
_ROLE_WORDS = {
    "analyst": "analyse data numbers statistics facts findings compare measure",
    "coder": "write python code program function script implement compute parse",
    "writer": "write prose report summary text explain document article",
    "researcher": "find facts background sources information search collect",
    "reviewer": "check review verify correct mistakes errors quality",
    "planner": "plan steps decompose organise schedule",
    "assistant": "help answer general task",
}


@dataclass
class Repair:
    """One repair: its kind, the node, the update for `updater.merge`, and why."""
    kind: str
    node_id: str
    update: dict
    reason: str
    model_used: bool = True        # False when the deterministic fallback was used
    usage: dict = field(default_factory=lambda: {"tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0})

    def __iter__(self):   # `kind, update = await refine_instruction(...)`
        return iter((self.kind, self.update))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "node": self.node_id, "update": self.update,
                "reason": self.reason, "model_used": self.model_used, **self.usage}


def feedback_of(node) -> str:
    """The reviewer's last word on a node: its last attempt's feedback or error, else node.error."""
    for attempt in reversed(node.attempts or []):
        text = attempt.get("feedback") or attempt.get("error")
        if text:
            return str(text)
    return node.error or "the output was rejected"


def _cut(text: str, limit: int) -> str:
    return cut(text, limit, " [cut]", fit=True)


def _update(node, requirement: str, agent: str) -> dict:
    return {"action": "update", "subtasks": [{"id": node.id, "requirement": requirement,
                                              "agent": agent, "rerun": True}]}


def _context(workflow, node, feedback: str) -> str:
    last = next((a.get("output") for a in reversed(node.attempts or []) if a.get("output")),
                node.output)
    return (f"Overall task:\n{_cut(workflow.task, 2000)}\n\nSubtask {node.id} (agent: {node.agent}):\n"
            f"{node.requirement}\n\nIts last output:\n{_cut(last or '(none)', 1500)}\n\n"
            f"Why it was rejected:\n{_cut(feedback, 800)}")


async def _ask(llm, messages, schema, *, model: str | None, seed: int, run_id: str | None,
               max_tokens: int | None, node_id: str):
    reply = await llm.complete(messages, schema=schema, model=model, seed=seed,
                               max_tokens=max_tokens, run_id=run_id, node_id=node_id,
                               purpose="repair")
    return reply, {"tokens_in": reply.input_tokens, "tokens_out": reply.output_tokens,
                   "cost_usd": reply.cost_usd}


def _node(workflow, node_id: str):
    node = workflow.node(node_id)
    if node.status in (Status.RUNNING, Status.PRUNED):
        raise NodeError(f"node {node_id!r} is {node.status}; only a finished or failed node "
                        "can be repaired")
    return node


_REFINE_SYSTEM = ("You rewrite one subtask's instruction so that the agent gets it right next "
                  "time. Keep its goal; make it concrete and self-contained; say exactly what "
                  "the result must contain so the rejection does not happen again.")
_REFINE_EXAMPLE = "<the new instruction, in your own words>"
_PLACEHOLDER = re.compile(r"<[A-Za-z][^<>]{0,80}>")
# What the prompt itself says: an answer repeating it is no rewrite (SmolLM2 answered
# "the rewritten instruction", the prompt's example, and it became the requirement).
_REFINE_ECHOES = (_REFINE_EXAMPLE, "the rewritten instruction", *_REFINE_SYSTEM.split(". "))


def refusal(text: Any, node, task: str, feedback: str) -> str | None:
    """Why a rewritten instruction cannot be used (None: it can), checked as a plan's
    subtask is: not empty, no placeholder, no echo of the prompt, not the same text, and
    about the task or the subtask (a content word shared with them or the feedback)."""
    if not isinstance(text, str) or not text.strip():
        return "it was empty"
    if " ".join(text.split()).lower() == " ".join(node.requirement.split()).lower():
        return "it repeated the requirement"
    about = f"{task} {node.requirement} {feedback}"
    if _PLACEHOLDER.search(text):
        return "it held a placeholder"
    if copied(text, about, _REFINE_ECHOES):
        return "it repeated the prompt's example"
    mine = " ".join(text.split()).lower().strip(" .")
    for echo in (e.lower().strip(" .") for e in _REFINE_ECHOES):
        if len(echo) > 12 and echo in mine or len(mine) > 12 and mine in echo:
            return "it repeated the prompt"
    if not content_words(text) & content_words(about):
        return "it was about nothing of the task or the subtask"
    return None


async def refine_instruction(workflow, node_id: str, feedback: str | None, llm, *,
                             model: str | None = None, seed: int = 0, run_id: str | None = None,
                             max_tokens: int | None = 400) -> Repair:
    """Rewrite the node's requirement to answer the feedback; the node re-runs with it.
    A rewrite that `refusal` refuses is replaced by the fallback, which says why."""
    node = _node(workflow, node_id)
    feedback = feedback or feedback_of(node)
    schema = {"type": "object", "properties": {"requirement": {"type": "string"}},
              "required": ["requirement"]}
    messages = [
        {"role": "system", "content": _REFINE_SYSTEM},
        {"role": "user", "content": _context(workflow, node, feedback) + "\n\nAnswer with JSON: "
         f'{{"requirement": "{_REFINE_EXAMPLE}"}}'}]
    usage, text, why = None, None, "there was no answer"
    try:
        reply, usage = await _ask(llm, messages, schema, model=model, seed=seed, run_id=run_id,
                                  max_tokens=max_tokens, node_id=node_id)
        text = refine_from_answer(reply.data)   # the gate: any other field refuses it
        why = refusal(text, node, workflow.task or "", feedback)
    except PlanError as exc:
        why = " ".join(str(exc).split())
    except FlowError:
        pass   # the fallback below needs no model
    if why is None:
        repaired = Repair("refine_instruction", node_id,
                          _update(node, _cut(text.strip(), _MAX_REQ), node.agent),
                          f"rewrote the requirement of {node_id} to address: {_cut(feedback, 200)}")
    else:
        note = f"{node.requirement}\n\nThe last attempt was rejected; make sure to fix this: {feedback}"
        repaired = Repair("refine_instruction", node_id, _update(node, _cut(note, _MAX_REQ), node.agent),
                          f"appended the feedback to the requirement of {node_id} (the model's "
                          f"rewrite was refused: {why})", model_used=False)
    repaired.usage = usage or repaired.usage
    return repaired


def _candidates(workflow, node, agents) -> list[str]:
    pool = list(agents) if agents else [*dict.fromkeys(n.agent for n in workflow.nodes.values()),
                                         *AGENT_POOL]
    return [a for a in dict.fromkeys(pool) if isinstance(a, str) and a and a != node.agent]


def _most_similar(node, feedback: str, candidates: list[str]) -> str:
    from ..llm.similarity import get_similarity
    texts = [f"{c} {_ROLE_WORDS.get(c, '')}" for c in candidates]
    scores = get_similarity("tfidf")([f"{node.requirement} {feedback}"], texts)[0]
    return candidates[max(range(len(candidates)), key=lambda i: (scores[i], -i))]


async def substitute_agent(workflow, node_id: str, feedback: str | None, llm, *,
                           model: str | None = None, agents: Any = None, seed: int = 0,
                           run_id: str | None = None, max_tokens: int | None = 120) -> Repair:
    """Give the node to another role (chosen by the model among `agents`, default the
    workflow's roles and AGENT_POOL); the node re-runs with it."""
    node = _node(workflow, node_id)
    feedback = feedback or feedback_of(node)
    candidates = _candidates(workflow, node, agents)
    if not candidates:
        raise NodeError(f"no other agent to give {node_id!r} to; name some with agents=[...]")
    schema = {"type": "object", "properties": {"agent": {"enum": candidates},
                                               "why": {"type": "string"}}, "required": ["agent"]}
    messages = [
        {"role": "system", "content": "You choose which kind of agent should redo a subtask that "
         "its current agent failed."},
        {"role": "user", "content": _context(workflow, node, feedback) + "\n\nChoose one of: "
         + ", ".join(candidates) + '. Answer with JSON: {"agent": NAME, "why": ONE SENTENCE}'}]
    usage, choice = None, None
    try:
        reply, usage = await _ask(llm, messages, schema, model=model, seed=seed, run_id=run_id,
                                  max_tokens=max_tokens, node_id=node_id)
        choice = agent_from_answer(reply.data, candidates)   # the gate
    except FlowError:
        pass
    model_used = choice is not None
    if not model_used:
        choice = _most_similar(node, feedback, candidates)
    repaired = Repair("substitute_agent", node_id, _update(node, node.requirement, choice),
                      f"gave {node_id} to the {choice} instead of the {node.agent}"
                      + ("" if model_used else " (the most similar role; the model's choice was unusable)"),
                      model_used=model_used)
    repaired.usage = usage or repaired.usage
    return repaired


async def repair(kind: str, workflow, node_id: str, feedback: str | None, llm, **options) -> Repair:
    """Run the repair named `kind` (one of REPAIR_KINDS)."""
    if kind == "refine_instruction":
        options.pop("agents", None)   # only a substitution chooses among agents
        return await refine_instruction(workflow, node_id, feedback, llm, **options)
    if kind == "substitute_agent":
        return await substitute_agent(workflow, node_id, feedback, llm, **options)
    raise NodeError(f"unknown repair {kind!r}; repairs: {', '.join(REPAIR_KINDS)}")


def next_kind(update_log: list[dict], node_id: str, order: tuple = REPAIR_KINDS) -> str | None:
    """The first repair in `order` not yet logged for this node; None: time to re-plan."""
    tried = {e.get("kind") for e in update_log or [] if node_id in (e.get("trigger") or [])}
    return next((k for k in order if k not in tried), None)


async def plan_repair(workflow, update_log: list[dict], llm, **options) -> Repair | None:
    """The due repair of the first failed node that still has one, or None (re-plan).
    A node that failed on its code has none (see the module's docstring)."""
    for node in workflow.nodes.values():
        if node.status != Status.FAILED or code_failure(node.attempts):
            continue
        kind = next_kind(update_log, node.id)
        if kind is not None:
            return await repair(kind, workflow, node.id, feedback_of(node), llm, **options)
    return None


def same_again(before, after, diff: dict) -> list[str]:
    """The failed nodes an update would only run again as they were, when that is all it
    does ([] when it changes anything else): each failed on its code, and keeps its
    requirement (case, spacing and punctuation aside), its agent and its parents."""
    if any(diff.get(key) for key in ("added", "removed", "reassigned", "rewired")):
        return []
    ids = list(dict.fromkeys([*diff.get("rerun", []), *diff.get("edited", [])]))
    for node_id in ids:
        old, new = before.nodes.get(node_id), after.nodes.get(node_id)
        if (old is None or new is None or old.status != Status.FAILED
                or not code_failure(old.attempts)
                or normalized(old.requirement or "") != normalized(new.requirement or "")
                or old.agent != new.agent
                or set(before.parents(node_id)) != set(after.parents(node_id))):
            return []
    return ids
