"""Plan repair: turn whatever a model wrote into valid subtasks and edges, or one `PlanError`.

Models emit plans in many shapes (a bare list of steps, Flow's paper dict, `{"subtasks": ...}`,
`{"nodes", "edges"}`, ids written as prose, dependencies by name, text or 1-based index).
`repair_plan` reads them all, repairs what it can (slug ids, duplicates, unknown references,
self-loops, `next`/`prev` disagreement) and records one warning sentence per repair.

This module builds on `node` only; `graph.parse_plan` (and `Workflow.from_dict`) call it and
assemble the `Workflow`, dropping an edge that closes a cycle.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import FlowError, PlanError, TruncatedError
from .._internal.text import short_repr
from .names import model_name_problem
from .node import FIELD_TYPES, SLUG_MAX, STATUSES, Node, node_fields, slugify
from .status import Status

__all__ = ["RepairedPlan", "repair_plan", "clean_agent", "role_for", "PLAN_FIELDS", "STATE_FIELDS"]

# Spellings small models use, matched after slugging the key ("Depends On" -> depends_on).
_WRAP_KEYS = ("subtasks", "sub_tasks", "tasks", "steps", "nodes", "plan", "workflow", "graph",
              "items", "stages", "task")
_ID_KEYS = ("id", "task_id", "subtask_id", "step_id", "node_id", "step", "key")
_NAME_KEYS = ("name", "title")
_REQ_KEYS = ("requirement", "subtask_requirement", "description", "task", "text", "label", "content", "instruction",
             "instructions", "objective", "goal", "details", "desc", "action", "prompt", "subtask")
_DEP_KEYS = ("dependencies", "depends_on", "dependson", "deps", "dependency", "depends", "after",
             "prev", "previous", "parents", "parent", "requires", "prerequisites", "predecessors")
_KID_KEYS = ("next", "child", "children", "successors", "then")
_AGENT_KEYS = ("agent", "role", "assignee", "assigned_to", "agent_name", "worker")
_META_KEYS = ("task", "goal", "objective", "title", "description", "name", "summary")
_NODE_KEYS = set(_ID_KEYS + _NAME_KEYS + _REQ_KEYS + _DEP_KEYS + _KID_KEYS + _AGENT_KEYS
                 + tuple(FIELD_TYPES) + ("data", "num_parents_not_completed"))
_SUBTASK_KEYS = _NODE_KEYS - set(_ID_KEYS + _NAME_KEYS)
# What a model's plan may say of a subtask (every spelling read above, a model, an estimate),
# and what only a run may say: a model's plan with one of these is refused (strict mode).
PLAN_FIELDS = frozenset(_ID_KEYS + _NAME_KEYS + _REQ_KEYS + _DEP_KEYS + _KID_KEYS + _AGENT_KEYS
                        + ("model", "estimate_s"))
STATE_FIELDS = frozenset(set(FIELD_TYPES) - {"agent", "model", "estimate_s"}
                         | {"data", "num_parents_not_completed", "figures", "files", "result",
                            "call_id", "call_ids", "tokens", "cost", "cached", "cache_key"})
_TOP_FIELDS = frozenset(_WRAP_KEYS + _META_KEYS + ("edges",))
_PENDING_WORDS = {"", "pending", "todo", "not_started", "waiting", "none", "null"}
_NO_REF = ("", "none", "null", "n/a", "na", "nothing", "-")
_STATUS_WORDS = {"completed": Status.DONE, "complete": Status.DONE, "finished": Status.DONE,
                 "success": Status.DONE, "in_progress": Status.RUNNING, "started": Status.RUNNING,
                 "todo": Status.PENDING, "not_started": Status.PENDING, "waiting": Status.PENDING,
                 "error": Status.FAILED}
_INDEX_REF = re.compile(r"(?:sub)?(?:task|step|node|t|s)?[\s_#.-]*(\d{1,6})")
_MAX_NEST = 4
# Role names that say nothing (or a prompt's placeholder copied), and words that suggest one.
_JUNK_ROLES = {"", "agent", "role", "name", "none", "null", "n_a", "na", "unknown", "tbd", "todo",
               "x", "string", "the_role", "agent_name", "role_name"}
_ROLE_CUES = (("tester", ("test", "verify", "check", "validate", "review")),
              ("designer", ("plot", "chart", "draw", "design", "visual", "photo", "image", "ui")),
              ("coder", ("code", "implement", "script", "program", "function", "train", "fit",
                         "load", "clean", "compute", "build", "model")),
              ("analyst", ("analy", "summar", "statistic", "compare", "measure", "forecast",
                           "estimate", "explore", "evaluat")),
              ("researcher", ("research", "find", "search", "collect", "gather", "list", "read")),
              ("writer", ("write", "report", "draft", "explain", "document", "guide", "post")))


@dataclass
class _Item:
    pos: int                # 1-based place in the model's list, for "depends on 2"
    raw_id: str             # what the model called it ("" when nothing)
    requirement: str
    agent: str
    aliases: list[str]      # every name a reference may use for this subtask
    deps: list = field(default_factory=list)
    kids: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    declared: tuple = (False, False)  # (had a dependency field, had a next/child field)
    textual: bool = False   # a bare step text: no id was ever expected
    id: str = ""


class _Repair:
    def __init__(self, task: str, strict: bool = False) -> None:
        self.task, self.warnings, self.prior, self.raw_edges = task, [], [], []
        self.strict = strict   # a model's answer: unknown and state fields refused

    def warn(self, sentence: str) -> None:
        # folded as a stored plan's warnings are when read back, so a saved plan reads the same
        self.warnings.append(" ".join(sentence.split()))


def _key(k: Any) -> str:
    return slugify(str(k).lower())


def _scalar(v: Any) -> str | None:
    """A short string for ids and references; None for anything that cannot be one."""
    if isinstance(v, str):
        return v.strip() or None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**18:
        return str(v)
    return None


def role_for(requirement: str) -> str:
    """A role suggested by the first word of a requirement that is a cue (usually its verb),
    else "assistant"."""
    for word in re.findall(r"[a-z]+", requirement.lower()):
        role = _role_of_word(word)
        if role:
            return role
    return "assistant"


@functools.lru_cache(maxsize=4096)
def _role_of_word(word: str) -> str | None:
    """The role a word cues, or None (cached: a plan of 10,000 nodes repeats its words)."""
    for role, cues in _ROLE_CUES:
        if word.startswith(cues):
            return role
    return None


def clean_agent(agent: str, requirement: str = "") -> str:
    """An agent name cleaned like an id ("writer," -> "writer"); an empty, placeholder or
    junk one ("<role>", "agent", "123") becomes a role derived from the requirement."""
    slug = slugify(agent)
    if slug in _JUNK_ROLES or not re.search(r"[a-z]{2}", slug):
        return role_for(requirement)
    return slug


def _text(v: Any, depth: int = 0) -> str:
    """A requirement from a field: strings as given, numbers printed, lists joined, else ''."""
    if isinstance(v, str):
        return v if v.strip() else ""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        ok = math.isfinite(v) and abs(v) < 10**18
        return str(v) if ok else ""
    if depth >= 3:
        return ""
    if isinstance(v, (list, tuple)):
        return "; ".join(t.strip() for t in (_text(x, depth + 1) for x in v) if t)
    if isinstance(v, dict):
        return _first_text({_key(k): x for k, x in v.items()}, _REQ_KEYS + _NAME_KEYS, depth + 1)
    return ""


def _first_text(f: dict, keys: tuple, depth: int = 0) -> str:
    for k in keys:
        text = _text(f.get(k), depth)
        if text:
            return text
    return ""


def _load(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        obj = bytes(obj).decode("utf-8", "replace")
    if not isinstance(obj, str):
        return obj
    if not obj.strip():
        raise PlanError("the plan is empty text; ask the planner again or write the subtasks as JSON")
    try:
        from ..json_extract import extract_json
    except ModuleNotFoundError as exc:  # the text extractor is optional
        if exc.name != __package__.rpartition(".")[0] + ".json_extract":
            raise
        extract_json = json.loads
    try:
        return extract_json(obj)
    except (FlowError, ValueError, RecursionError) as exc:
        if isinstance(exc, TruncatedError):
            raise PlanError("the plan's JSON was cut off before it ended; "
                            "raise max_tokens or ask for fewer subtasks") from None
        raise PlanError(f"no JSON plan could be read from the text (it began "
                        f"{short_repr(obj.strip(), 40)}); ask for the subtasks as a JSON list") from None


def _entries(obj: Any, r: _Repair, depth: int = 0) -> list[tuple[Any, Any]]:
    """(key or None, raw subtask) pairs from any of the plan shapes models emit."""
    if depth > _MAX_NEST:
        raise PlanError("the plan is nested too deeply to find its subtasks; "
                        "give them as a JSON list under \"subtasks\"")
    if isinstance(obj, list):
        if obj and all(isinstance(v, str) for v in obj):
            r.warn(f"the plan is a bare list of {len(obj)} steps with no dependencies; "
                   "they were kept as independent subtasks, not a chain")
        return [(None, v) for v in obj]
    if not isinstance(obj, dict):
        raise PlanError(f"a plan must be a JSON object or a list of subtasks, not "
                        f"{type(obj).__name__}; ask for subtasks as a JSON list")
    keys = {}
    for k in obj:
        keys.setdefault(_key(k), k)
    if r.strict and any(isinstance(obj[keys[k]], list) for k in _WRAP_KEYS if k in keys):
        # a wrapper ({"subtasks": [...], ...}): next to its list, only a title or edges
        _refuse_fields("the plan", {k: obj[v] for k, v in keys.items() if k not in _TOP_FIELDS},
                       "a plan holds its list of subtasks, a title and its edges")
    meta = obj.get(keys.get("task"))
    if isinstance(meta, str) and meta.strip() and not r.task:
        r.task = meta.strip()
    if isinstance(obj.get(keys.get("nodes")), list) and "edges" in keys:
        r.raw_edges = obj[keys["edges"]]
        prior = obj.get(keys.get("warnings"))
        prior = prior if isinstance(prior, list) else []
        r.prior = [" ".join(w.split()) for w in prior if isinstance(w, str) and w.strip()]
        return [(None, v) for v in obj[keys["nodes"]]]
    for k in _WRAP_KEYS:
        inner = obj.get(keys.get(k))
        # A dict that is itself a subtask is a paper-form node called "plan", not a wrapper.
        if isinstance(inner, dict) and {_key(x) for x in inner} & _SUBTASK_KEYS:
            continue
        if isinstance(inner, (list, dict)) and inner:
            return _entries(inner, r, depth + 1)
    f = {k: obj[orig] for k, orig in keys.items()}
    single = set(f) <= _NODE_KEYS and not any(isinstance(v, dict) for v in f.values())
    out = [] if single else _mapping(obj, r)
    if not out and _first_text(f, _REQ_KEYS):
        r.warn("the plan is a single subtask object; it was read as a one-subtask plan")
        return [(None, f)]
    return out


def _mapping(obj: dict, r: _Repair) -> list[tuple[Any, Any]]:
    """Flow's paper form {"Task_A": {...}} or {"name": "step text", ...}."""
    has_dicts = any(isinstance(v, dict) for v in obj.values())
    out = []
    for k, v in obj.items():
        if has_dicts and isinstance(v, str) and _key(k) in _META_KEYS:
            continue  # a title or goal next to the subtasks, not a subtask
        if isinstance(v, dict) and not {_key(x) for x in v} & _SUBTASK_KEYS:
            r.warn(f"ignored the entry {short_repr(k)}: it has no requirement or dependencies")
        elif isinstance(v, (dict, str)):
            out.append((k, v))
        else:
            r.warn(f"ignored the entry {short_repr(k)}: it is neither a subtask object nor a step text")
    if out and not has_dicts:
        r.warn(f"the plan maps {len(out)} names to step texts with no dependencies; "
               "they were kept as independent subtasks")
    return out


def _item(pos: int, key: Any, value: Any, r: _Repair) -> _Item | None:
    if isinstance(value, str):
        raw = _scalar(key) or ""
        if not value.strip():
            r.warn(f"dropped subtask {pos}: its text is empty")
            return None
        return _Item(pos, raw, value, "assistant", [raw.lower()] if raw else [], textual=True)
    if not isinstance(value, dict):
        r.warn(f"dropped item {pos}: a {type(value).__name__} is not a subtask")
        return None
    f = {}
    for k, v in value.items():
        f.setdefault(_key(k), v)
    ids = [s for s in (_scalar(f.get(k)) for k in _ID_KEYS) if s]
    names = [s for s in (_scalar(f.get(k)) for k in _NAME_KEYS) if s]
    raw = _scalar(key) or next(iter(ids + names), "")
    if r.strict:
        f = _plan_fields(f, raw or str(pos), r)
    text = _first_text(f, _REQ_KEYS) or next(iter(names), "")
    if not text and " " in raw:
        text = raw  # an id written as prose ("Load the data") is the requirement too
    if not text:
        r.warn(f"dropped subtask {short_repr(raw or pos)}: it has no usable requirement")
        return None
    agent = clean_agent(next((a for a in (f.get(k) for k in _AGENT_KEYS)
                              if isinstance(a, str) and a.strip()), ""), text)
    it = _Item(pos, raw, text, agent, [a.lower() for a in [raw] + ids + names if a])
    for k in _DEP_KEYS:
        it.deps += _as_list(f.get(k))
    for k in _KID_KEYS:
        it.kids += _as_list(f.get(k))
    it.declared = (any(k in f for k in _DEP_KEYS), any(k in f for k in _KID_KEYS))
    it.extra = _extras(f, raw or str(pos), r)
    return it


def _as_list(v: Any) -> list:
    if v is None or isinstance(v, bool):
        return []
    if isinstance(v, (list, tuple)):
        return [x for e in v for x in (e if isinstance(e, (list, tuple)) else [e])]
    return [v]


def _neutral(key: str, value: Any) -> bool:
    """A state field a plan may carry because it says nothing (Flow's paper form writes
    "status": "pending" and "data": null into every subtask of a new plan)."""
    if key == "num_parents_not_completed":   # derived from the edges, never read
        return True
    if key == "status":
        return isinstance(value, str) and _key(value) in _PENDING_WORDS
    return value is None or value in ("", [], {}) or (value == 0 and not isinstance(value, str))


_GIVES = ("a plan gives each subtask only an id, a requirement, an agent, its dependencies "
          "(and an estimate_s or a model)")


def _refuse_fields(label: str, fields: dict, gives: str = _GIVES) -> None:
    """A model's plan naming a field it may not set is refused, in one line."""
    for key, value in fields.items():
        if key in STATE_FIELDS:
            raise PlanError(f"{label} sets {key!r} to {short_repr(value, 30)}, which only a run "
                            f"may say; {gives}, so this answer was refused")
        raise PlanError(f"{label} has the unknown field {short_repr(key, 40)}; {gives}, so "
                        "this answer was refused")


def _plan_fields(f: dict, label: str, r: _Repair) -> dict:
    """The fields of a model's subtask that a plan may set: a state field that says nothing
    is dropped; any other state field or unknown field refuses the whole answer."""
    where = f"subtask {short_repr(label, 40)}"
    _refuse_fields(where, {k: v for k, v in f.items() if k not in PLAN_FIELDS
                           and not (k in STATE_FIELDS and _neutral(k, v))})
    model = f.get("model")
    if model is not None:
        problem = model_name_problem(model)
        if problem:
            raise PlanError(f"{where}: {problem}; this answer was refused")
    return {k: v for k, v in f.items() if k in PLAN_FIELDS}


def _extras(f: dict, label: str, r: _Repair) -> dict:
    """Node fields carried over from the plain form; wrong types and unknown statuses dropped."""
    if "output" not in f and f.get("data") not in (None, ""):
        data = f["data"]
        f = {**f, "output": data if isinstance(data, str) else json.dumps(data, default=str)}
    if isinstance(f.get("status"), str):
        word = _key(f["status"])
        f = {**f, "status": _STATUS_WORDS.get(word, word)}
    good, bad = node_fields(f)
    good.pop("agent", None)  # read with the other spellings of agent in _item
    if good.get("status", Status.PENDING) not in STATUSES:
        bad.append("status")
        del good["status"]
    if bad:
        r.warn(f"ignored field(s) {', '.join(bad)} of subtask {short_repr(label)}: wrong type or value")
    return good


def _unique(base: str, taken: dict) -> str:
    n = 2
    while True:
        suffix = f"_{n}"
        candidate = base[: SLUG_MAX - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


def _assign_ids(items: list[_Item], r: _Repair) -> list[_Item]:
    """Slug ids; exact duplicates merged, clashing ones renamed. Returns the kept items."""
    kept: dict[str, _Item] = {}
    renamed, unnamed = {}, 0
    for it in items:
        base = slugify(it.raw_id) if it.raw_id else ""
        if not base:
            base, unnamed = f"task_{it.pos}", unnamed + (not it.textual)
        elif base != it.raw_id:
            renamed[f"{short_repr(it.raw_id, 30)} -> {base}"] = None
            if len(re.sub(r"[^a-z0-9]+", "_", str(it.raw_id).lower()).strip("_")) > SLUG_MAX:
                r.warn(f"shortened the id {short_repr(it.raw_id, 60)} to {base}: ids are at most "
                       f"{SLUG_MAX} characters")
        first = kept.get(base)
        if first is not None and first.requirement.strip() == it.requirement.strip():
            first.deps += it.deps
            first.kids += it.kids
            first.aliases += it.aliases
            first.declared = tuple(a or b for a, b in zip(first.declared, it.declared))
            it.id = base
            r.warn(f"merged a duplicate of subtask {base} (same id and requirement) into one node")
            continue
        if first is not None:
            new = _unique(base, kept)
            r.warn(f"renamed a second subtask called {base} to {new}: same id, other requirement")
            base = new
        it.id = base
        kept[base] = it
    if renamed:
        more = " ..." if len(renamed) > 5 else ""
        shown = ", ".join(list(renamed)[:5])
        r.warn(f"normalised {len(renamed)} subtask id(s) to slugs: {shown}{more}")
    if unnamed:
        r.warn(f"named {unnamed} subtask(s) without an id task_<position>")
    return list(kept.values())


class _Refs:
    """Resolves what a plan uses to point at a subtask: id, name, text or 1-based index."""

    def __init__(self, items: list[_Item], kept: list[_Item]) -> None:
        self.index = {}
        self.names = {it.id: it.id for it in kept}  # exact ids win over everything else
        for it in items:
            self.index.setdefault(it.pos, it.id)
            for alias in it.aliases + [slugify(a) for a in it.aliases]:
                if alias:
                    self.names.setdefault(alias, it.id)
        for it in items:
            self.names.setdefault(it.requirement.strip().lower(), it.id)

    def resolve(self, ref: Any) -> str | None:
        if isinstance(ref, dict):
            f = {_key(k): v for k, v in ref.items()}
            inner = next((f[k] for k in _ID_KEYS + _NAME_KEYS if _scalar(f.get(k))), None)
            return None if inner is None else self.resolve(inner)
        s = _scalar(ref)
        if s is None:
            return None
        s = s.lower()
        hit = self.names.get(s) or self.names.get(slugify(s))
        if hit:
            return hit
        m = _INDEX_REF.fullmatch(s)
        return self.index.get(int(m.group(1))) if m else None

    def expand(self, refs: list) -> list:
        """Refs with "none" dropped and "a, b and c" split when the whole string is no name."""
        out = []
        for ref in refs:
            if isinstance(ref, str) and ref.strip().lower() in _NO_REF and not self.resolve(ref):
                continue  # "none" means no dependency, unless a subtask is called none
            parts = [ref]
            if isinstance(ref, str) and self.resolve(ref) is None:
                parts = [p for p in re.split(r"\s*(?:[,;]|\band\b)\s*", ref)
                         if p.strip().lower() not in _NO_REF]
            # Split only when that finds a name: prose with commas stays one unknown reference.
            out += parts if any(self.resolve(p) for p in parts) else [ref]
        return out


def _edge_pair(e: Any) -> tuple[Any, Any] | None:
    if isinstance(e, (list, tuple)) and len(e) == 2:
        return e[0], e[1]
    if isinstance(e, dict):
        f = {_key(k): v for k, v in e.items()}
        for a, b in (("from", "to"), ("source", "target"), ("parent", "child"), ("u", "v")):
            if a in f and b in f:
                return f[a], f[b]
    if isinstance(e, str) and "->" in e:
        a, _, b = e.partition("->")
        return a, b
    return None


def _collect_edges(kept: list[_Item], refs: _Refs, r: _Repair) -> list[tuple[str, str]]:
    deps, kids, unknown = [], [], {}
    for it in kept:
        for ref in refs.expand(it.deps):
            p = refs.resolve(ref)
            deps.append((p, it.id)) if p else unknown.setdefault(it.id, []).append(ref)
        for ref in refs.expand(it.kids):
            c = refs.resolve(ref)
            kids.append((it.id, c)) if c else unknown.setdefault(it.id, []).append(ref)
    for node_id, bad in unknown.items():
        r.warn(f"dropped {len(bad)} link(s) from {node_id} to unknown subtasks "
               f"({', '.join(short_repr(b, 30) for b in bad[:3])}); they are not in the plan")
    explicit = []
    raw_edges = r.raw_edges if isinstance(r.raw_edges, list) else []
    if not isinstance(r.raw_edges, list):
        r.warn("ignored \"edges\": it is not a list of [parent, child] pairs")
    for e in raw_edges:
        pair = _edge_pair(e)
        ends = pair and (refs.resolve(pair[0]), refs.resolve(pair[1]))
        if ends and all(ends):
            explicit.append(ends)
        else:
            r.warn(f"dropped the edge {short_repr(e)}: it is not a pair of known subtasks")
    # An edge disagrees when one end lists the other and the other end has a list without it.
    declared = {it.id: it.declared for it in kept}
    differ = sorted({(a, b) for a, b in set(deps) - set(kids) if declared[a][1] and a != b}
                    | {(a, b) for a, b in set(kids) - set(deps) if declared[b][0] and a != b})
    if differ:
        r.warn(f"the dependency lists and the next/child lists disagree on {len(differ)} "
               f"edge(s) (e.g. {differ[0][0]} -> {differ[0][1]}); kept the union")
    edges: dict[tuple[str, str], None] = {}
    for a, b in deps + kids + explicit:
        if a == b:
            if (a, b) not in edges:
                r.warn(f"dropped the dependency of {a} on itself")
            edges[(a, b)] = None
        else:
            edges.setdefault((a, b), None)
    return [e for e in edges if e[0] != e[1]]


@dataclass
class RepairedPlan:
    """A plan after repair: its subtasks in plan order, its edges (some may still close a
    cycle: `graph.Workflow.assemble` drops those), and one sentence per repair so far."""
    task: str
    nodes: list[Node]
    edges: list[tuple[str, str]]
    warnings: list[str]


def repair_plan(obj_or_text: Any, task: str = "", *, strict: bool = False) -> RepairedPlan:
    """The subtasks and edges of what a model emitted (JSON text or parsed JSON), repaired.

    A plan with nothing usable raises a one-line `PlanError`, never another exception.
    `strict` (a model's answer, see `answers`): a subtask may carry only PLAN_FIELDS (in any
    spelling read here); a state field (STATE_FIELDS) that says something, or any other
    field, refuses the answer with one `PlanError`, and a model name must be a safe one.
    Without it (a plan the user wrote, a run the store saved) every Node field is kept.
    """
    r = _Repair(task.strip() if isinstance(task, str) else "", strict)
    entries = _entries(_load(obj_or_text), r)
    items = [it for it in (_item(i, k, v, r) for i, (k, v) in enumerate(entries, 1)) if it]
    if not items:
        why = "it is empty" if not entries else "no subtask has a usable requirement"
        raise PlanError(f"the plan has no usable subtasks ({why}); ask the planner again or give "
                        "a JSON list of {\"id\", \"requirement\", \"dependencies\"}")
    kept = _assign_ids(items, r)
    edges = _collect_edges(kept, _Refs(items, kept), r)
    nodes = [Node(id=it.id, requirement=it.requirement, agent=it.agent, **it.extra) for it in kept]
    return RepairedPlan(r.task, nodes, edges, r.prior + r.warnings)
