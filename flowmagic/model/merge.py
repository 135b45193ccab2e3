"""Merge an update (the updater's answer, or a repair's) into a workflow by node id.

The reference updater replaced the whole workflow with what the model returned, so every
task the model left out was deleted (finished ones included), and a finished task whose
text changed was reset. Here an update is a *patch*: `subtasks` lists nodes to add or
change, ids it leaves out are unchanged, `remove` prunes (with graph surgery, history
kept). A finished node keeps its output unless the update says `"rerun": true` for it;
a running node is never touched. `merge` works on a copy and reports every change and
every ignored or repaired part of the update in a diff, so a bad update degrades to
warnings, never to a lost result. Asking a model for the update is `updater`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import networkx as nx

from ..errors import FlowError, PlanError
from .._internal.text import short_repr
from .graph import Node, Workflow, slugify
from .plans import clean_agent
from . import status as transition
from .status import Status

__all__ = ["DIFF_KEYS", "UPDATE_FIELDS", "UPDATE_ENTRY_FIELDS", "UpdateRead", "read_update",
           "merge", "stats"]

# rerun: re-run on request (explicit rerun, or a failed node the update names);
# stale: descendants of a rerun node, reset to pending; rewired: incoming edges replaced.
DIFF_KEYS = ("added", "removed", "edited", "rerun", "reassigned", "rewired", "stale",
             "kept_finished", "warnings")
_CHANGE_KEYS = ("added", "removed", "edited", "rerun", "reassigned", "rewired")
_SUB_KEYS = ("subtasks", "tasks", "nodes", "changes", "add", "steps")
_REMOVE_KEYS = ("remove", "delete", "prune", "removed", "deleted")
_ID_KEYS = ("id", "task_id", "subtask_id", "node_id", "name")
_REQ_KEYS = ("requirement", "subtask_requirement", "description", "task", "text", "instruction", "content")
_DEP_KEYS = ("depends_on", "dependencies", "deps", "parents", "after", "requires")
_AGENT_KEYS = ("agent", "role")
_NO_CHANGE = ("no_change", "nochange", "none", "keep", "no_update", "unchanged")
_MAX_REQ = 8000
# Every field an update may hold, in every spelling read here (slugged keys): the gate
# (`answers.update_from_answer`) refuses a model's update with any other.
UPDATE_FIELDS = frozenset(("action", "rationale") + _SUB_KEYS + _REMOVE_KEYS)
UPDATE_ENTRY_FIELDS = frozenset(_ID_KEYS + _REQ_KEYS + _DEP_KEYS + _AGENT_KEYS + ("rerun",))


def _key(k: Any) -> str:
    return slugify(str(k).lower())


def _fields(d: dict) -> dict:
    return {_key(k): v for k, v in reversed(d.items())}  # the first spelling wins


def _first(f: dict, keys: tuple) -> Any:
    return next((f[k] for k in keys if k in f), None)


def _as_list(value: Any, what: str, warn: Callable[[str], None]) -> list | None:
    """None stays None (not given); one id becomes a list; anything else is ignored."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [value]
    if value is not None and not isinstance(value, list):
        warn(f"ignored {what}: {short_repr(value)} is not a list")
        return None
    return value


def _scalar(v: Any) -> str | None:
    if isinstance(v, str):
        return v.strip() or None
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**18:
        return str(v)
    return None


@dataclass
class _Change:
    id: str
    requirement: str | None = None
    agent: str | None = None
    deps: list | None = None      # None: keep the node's edges
    rerun: bool = False
    fresh: bool = False           # id made from the requirement: always a new node

    def to_dict(self) -> dict:
        """The change in the updater's own words (a made-up id is left out, so it is made
        up again the same way)."""
        deps = None if self.deps is None else [s for s in map(_scalar, self.deps) if s]
        return {"id": None if self.fresh else self.id, "requirement": self.requirement,
                "agent": self.agent, "depends_on": deps, "rerun": self.rerun}


@dataclass
class UpdateRead:
    """What an update says, read but not applied: its changes, the refs it removes, whether
    it is a no-change, its rationale, and the fields it used (slugged: the top level's and
    each entry's), for the gate to check."""
    changes: list = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    no_change: bool = False
    rationale: str | None = None
    top: list[str] = field(default_factory=list)
    entries: list[list[str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- reading
def _load(update: Any) -> Any:
    if isinstance(update, (str, bytes)):
        from ..json_extract import extract_json
        try:
            return extract_json(update if isinstance(update, str) else update.decode("utf-8", "replace"))
        except (FlowError, ValueError, RecursionError):
            raise PlanError("the update is not JSON; ask the updater again") from None
    return update


def read_update(update: Any) -> UpdateRead:
    """What an update (JSON text or parsed JSON) says; PlanError when nothing usable."""
    read = UpdateRead()
    warn = read.warnings.append
    update = _load(update)
    if isinstance(update, list):
        update = {"subtasks": update}
    if not isinstance(update, dict) or not update:
        raise PlanError(f"the update must be a non-empty JSON object, not {short_repr(update)}; "
                        "ask the updater again")
    f = _fields(update)
    action, subs, remove = f.get("action"), _first(f, _SUB_KEYS), _first(f, _REMOVE_KEYS)
    read.top = list(f)
    if isinstance(f.get("rationale"), str):
        read.rationale = f["rationale"]
    if subs is None and remove is None and "action" not in f:
        if all(isinstance(v, dict) for v in update.values()):  # {"id": {...}, ...}
            subs, read.top = update, []
        else:
            raise PlanError("the update has no \"action\", \"subtasks\" or \"remove\"; "
                            "ask the updater again")
    listed = subs.values() if isinstance(subs, dict) else subs if isinstance(subs, list) else []
    read.entries = [[_key(k) for k in e] for e in listed if isinstance(e, dict)]
    if isinstance(action, str) and _key(action) in _NO_CHANGE:
        if subs or remove:
            warn("the update said no_change but listed changes; nothing was changed")
        read.no_change = True
        return read
    if action is not None and not (isinstance(action, str) and _key(action) == "update"):
        if subs is None and remove is None:
            raise PlanError(f"the update's action {short_repr(action)} is neither \"update\" nor "
                            "\"no_change\" and it lists no change; ask the updater again")
        warn(f"ignored the unknown action {short_repr(action)}")
    if isinstance(subs, dict):
        subs = [dict(v, id=v.get("id", k)) if isinstance(v, dict) else v for k, v in subs.items()]
    if not isinstance(subs, (list, type(None))):
        warn(f"ignored \"subtasks\": {short_repr(subs)} is not a list")
        subs = None
    remove = _as_list(remove, '"remove"', warn)
    read.changes = [c for c in (_change(i, e, warn) for i, e in enumerate(subs or [], 1)) if c]
    if not read.changes and not remove:
        warn("the update asked for no usable change")
    read.remove = [s for s in map(_scalar, remove or []) if s]
    return read


def _change(pos: int, entry: Any, warn: Callable[[str], None]) -> _Change | None:
    if not isinstance(entry, dict):
        warn(f"ignored subtask entry {pos}: {short_repr(entry)} is not an object")
        return None
    f = _fields(entry)
    req = _first(f, _REQ_KEYS)
    if req is not None and not (isinstance(req, str) and req.strip()):
        warn(f"ignored the requirement of subtask entry {pos}: not a non-empty string")
        req = None
    if isinstance(req, str) and len(req) > _MAX_REQ:
        warn(f"cut the requirement of subtask entry {pos} to {_MAX_REQ} characters")
        req = req[:_MAX_REQ]
    raw = _scalar(_first(f, _ID_KEYS))
    node_id = slugify(raw.lower()) if raw else ""
    if not node_id:
        if req is None:
            warn(f"ignored subtask entry {pos}: it has neither an id nor a requirement")
            return None
        node_id = slugify(" ".join(req.lower().split()[:6]), f"task_{pos}")
    agent = f.get("agent", f.get("role"))
    if agent is not None and not (isinstance(agent, str) and agent.strip()):
        warn(f"ignored the agent of subtask {node_id}: not a non-empty string")
        agent = None
    if agent is not None:   # a role name from the safe alphabet, as a plan's roles are
        agent = clean_agent(agent, req or "")
    deps = _as_list(_first(f, _DEP_KEYS), f"the dependencies of subtask {node_id}", warn)
    rerun = f.get("rerun", False)
    if isinstance(rerun, str):
        rerun = rerun.strip().lower() in ("true", "yes")
    elif not isinstance(rerun, bool):
        warn(f"ignored \"rerun\" of subtask {node_id}: {short_repr(rerun)} is not true or false")
        rerun = False
    return _Change(node_id, req.strip() if req else None, agent, deps, rerun,
                   fresh=not raw or not slugify(raw.lower()))


def _resolve(wf: Workflow, ref: Any) -> str | None:
    s = _scalar(ref)
    if s is None:
        return None
    for cand in (s, s.lower(), slugify(s.lower())):
        if cand in wf.nodes:
            return cand
    return None


# ---------------------------------------------------------------------------- merging
def _archive(node: Node, why: str) -> None:
    """Back to pending (`status.reset`); the output it had is kept in attempts (once)."""
    if node.output is not None and not any(a.get("output") == node.output for a in node.attempts):
        node.attempts.append({"output": node.output, "feedback": why,
                              "passed": node.status == Status.DONE,
                              "start": node.start, "end": node.end})
    transition.reset(node)


def _differs(wf: Workflow, node: Node, c: _Change) -> bool:
    if c.requirement not in (None, node.requirement) or c.agent not in (None, node.agent):
        return True
    return c.deps is not None and ({_resolve(wf, d) for d in c.deps} - {None}) != set(wf.parents(node.id))


def _apply(wf: Workflow, c: _Change, diff: dict, warn) -> bool:
    """Apply one change to its node; True when its dependencies may be rewired."""
    node = wf.nodes.get(c.id)
    if node is None:
        if c.requirement is None:
            warn(f"did not add subtask {c.id}: a new subtask needs a requirement")
            return False
        wf.add_node(Node(id=c.id, requirement=c.requirement, agent=c.agent or "assistant"))
        diff["added"].append(c.id)
        return True
    if node.status == Status.RUNNING:
        warn(f"left subtask {c.id} as it is: it is running")
        return False
    if node.status == Status.PRUNED:
        warn(f"left subtask {c.id} pruned; add it again under a new id to bring it back")
        return False
    if node.status == Status.DONE and not c.rerun:
        if _differs(wf, node, c):
            warn(f"kept finished subtask {c.id} and its output: the update changed it "
                 "without \"rerun\": true")
        return False
    if node.status in (Status.DONE, Status.FAILED):
        _archive(node, "superseded: the update asked to rerun this subtask")
        diff["rerun"].append(c.id)
    if c.requirement not in (None, node.requirement):
        node.requirement = c.requirement
        diff["edited"].append(c.id)
    if c.agent not in (None, node.agent):
        node.agent = c.agent
        diff["reassigned"].append(c.id)
    return True


def _rewire(wf: Workflow, rewire: dict[str, list], diff: dict, warn) -> None:
    """Replace incoming edges; edges the update adds go in one by one and any that
    would close a cycle is dropped, so only the update's edges are ever dropped."""
    introduced = []
    for node_id, refs in rewire.items():
        old, parents = wf.parents(node_id), []
        unknown = []
        for ref in refs:
            if isinstance(ref, str) and ref.strip().lower() in ("", "none", "null", "-"):
                continue
            p = _resolve(wf, ref)
            if p is None or wf.nodes[p].status == Status.PRUNED:
                unknown.append(ref)
            elif p == node_id:
                warn(f"dropped the dependency of {node_id} on itself")
            elif p not in parents:
                parents.append(p)
        if unknown:
            warn(f"dropped {len(unknown)} dependency(ies) of {node_id} on unknown or removed "
                 f"subtasks ({', '.join(short_repr(u, 30) for u in unknown[:3])})")
        wf.graph.remove_edges_from((p, node_id) for p in old if p not in parents)
        introduced += [(p, node_id) for p in parents if p not in old]
        if set(parents) != set(old) and node_id not in diff["added"]:
            diff["rewired"].append(node_id)
    for a, b in introduced:
        if nx.has_path(wf.graph, b, a):
            warn(f"dropped the edge {a} -> {b}: it closed a cycle ({b} already leads to {a})")
        else:
            wf.graph.add_edge(a, b)


def _remove(wf: Workflow, refs: list, diff: dict, warn) -> None:
    for ref in refs:
        node_id = _resolve(wf, ref)
        if node_id is None:
            warn(f"could not remove {short_repr(ref, 30)}: no such subtask")
        elif wf.nodes[node_id].status == Status.RUNNING:
            warn(f"did not remove subtask {node_id}: it is running")
        elif wf.nodes[node_id].status != Status.PRUNED and node_id not in diff["removed"]:
            wf.prune(node_id)
            diff["removed"].append(node_id)


def _mark_stale(wf: Workflow, diff: dict, warn) -> None:
    """Everything downstream of a rerun node must run again on the new inputs."""
    for root in diff["rerun"]:
        if wf.nodes[root].status == Status.PRUNED:
            continue
        for d in wf.descendants(root):
            node = wf.nodes[d]
            if node.status == Status.RUNNING:   # the executor cancels it and runs it again
                warn(f"subtask {d} was running on inputs from {root}, which will be rerun; "
                     "it runs again after it")
                if d not in diff["stale"]:
                    diff["stale"].append(d)
            elif node.status != Status.PRUNED and not (node.status == Status.PENDING and node.stale):
                if node.status == Status.DONE:
                    _archive(node, f"stale: {root} was rerun by an update")
                transition.mark_stale(node)
                if d not in diff["stale"] and d not in diff["rerun"]:
                    diff["stale"].append(d)


def merge(workflow: Workflow, update: Any) -> tuple[Workflow, dict]:
    """The workflow with `update` applied by node id (on a copy), and the diff.

    Raises PlanError only when the update has nothing usable at all (not JSON, not an
    object, no known key); every other defect is skipped with one warning in the diff.
    """
    wf = workflow.copy()
    diff: dict = {k: [] for k in DIFF_KEYS}
    warn = diff["warnings"].append
    done_before = [i for i, n in wf.nodes.items() if n.status == Status.DONE]
    read = read_update(update)
    diff["warnings"].extend(read.warnings)
    changes, remove, no_change = read.changes, read.remove, read.no_change
    if not no_change:
        removing = {_resolve(wf, r) for r in remove} - {None}
        by_id: dict[str, _Change] = {}
        for c in changes:
            if c.fresh:  # never let a made-up id land on an existing node
                base, n = c.id, 2
                while c.id in wf.nodes or c.id in by_id:
                    c.id, n = f"{base[:36]}_{n}", n + 1
                warn(f"named a subtask that had no usable id {c.id}")
            elif c.id in by_id:
                warn(f"subtask {c.id} appears twice in the update; the last entry wins")
            by_id[c.id] = c
        rewire = {}
        for c in by_id.values():
            if c.id in removing and wf.nodes[c.id].status != Status.RUNNING:
                warn(f"subtask {c.id} is both changed and removed by the update; removed")
            elif _apply(wf, c, diff, warn) and (c.deps is not None or c.id in diff["added"]):
                rewire[c.id] = c.deps or []
        _rewire(wf, rewire, diff, warn)
        _remove(wf, remove, diff, warn)
        _mark_stale(wf, diff, warn)
    if not nx.is_directed_acyclic_graph(wf.graph):  # cannot happen; never hand out a cycle
        raise PlanError("the merged update left a cycle; please report this as a flowmagic bug")
    diff["kept_finished"] = [i for i in done_before if wf.nodes[i].status == Status.DONE]
    return wf, diff


def stats(diff: dict, workflow_before: Workflow) -> dict:
    """Flow's update figures: active tasks before, tasks the update changed, their ratio.

    Changed = distinct ids added, removed, edited, rerun, reassigned or rewired; nodes made
    stale as a consequence are not counted. The ratio is 0.0 for an empty workflow.
    """
    initial = sum(1 for n in workflow_before.nodes.values() if n.status != Status.PRUNED)
    changed = len({i for k in _CHANGE_KEYS for i in (diff or {}).get(k, [])})
    return {"initial_tasks": initial, "changed_tasks": changed,
            "change_ratio": changed / initial if initial else 0.0}
