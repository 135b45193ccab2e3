"""A subtask (`Node`), its fields and their JSON types, and node ids (slugs).

The lowest piece of the model: `plans` (repair) and `graph` (the Workflow) both build on it.
"""

from __future__ import annotations

import copy as _copy
import re
import unicodedata
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from ..errors import PlanError
from .status import STATUSES, Status

__all__ = ["STATUSES", "SLUG_MAX", "FIELD_TYPES", "Node", "node_fields", "slugify", "is_slug"]

SLUG_MAX = 40


def is_slug(text: object) -> bool:
    """True for a valid node id: 1-40 characters of lowercase ascii letters, digits, `_`."""
    return (isinstance(text, str) and 0 < len(text) <= SLUG_MAX
            and all(c in "abcdefghijklmnopqrstuvwxyz0123456789_" for c in text))


def slugify(text: object, fallback: str = "") -> str:
    """A node id made from `text`; valid slugs come back unchanged, so this is idempotent."""
    if is_slug(text):
        return str(text)
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "_", ascii_text.lower()).strip("_")
    return slug[:SLUG_MAX].rstrip("_") or fallback


@dataclass
class Node:
    id: str
    requirement: str
    agent: str = "assistant"
    model: str | None = None
    status: Status = Status.PENDING
    output: str | None = None
    attempts: list[dict] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    start: float | None = None
    end: float | None = None
    error: str | None = None
    clone: str | None = None
    estimate_s: float | None = None
    downgraded_from: str | None = None
    stale: bool = False
    # what prune() changed, so unprune() can undo it: {"status", "parents", "children", "added"}
    pruned_from: dict | None = None
    execution: dict | None = None   # code run, its outputs, files and figures (engine/answer_code)

    def __post_init__(self) -> None:
        if self.status in STATUSES:   # a plain string from JSON or the store; an unknown one
            self.status = Status(self.status)   # is the Workflow's to refuse, in one line

    def to_dict(self) -> dict:
        # asdict's generic walk was most of the cost of saving a 10,000-node plan
        return {name: _json_copy(getattr(self, name)) for name in _NODE_FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> Node:
        """The inverse of `to_dict`; unknown keys are ignored, a wrongly typed field is a PlanError."""
        if not isinstance(d, dict):
            raise PlanError(f"a node must be a JSON object, not {type(d).__name__}; "
                            "pass what Node.to_dict() returned")
        kwargs, bad = node_fields(d)
        if bad:
            raise PlanError(f"node field {bad[0]!r} has the wrong type; "
                            "fix it or drop it from the node dict")
        for key in ("id", "requirement"):
            if not isinstance(d.get(key), str) or not d[key].strip():
                raise PlanError(f"a node needs a non-empty string {key!r}; add one to the node dict")
        return cls(id=d["id"], requirement=d["requirement"], **kwargs)

    def ran_on(self) -> str | None:
        """The model its last attempt ran on (a later downgrade changes `model`, the model of
        the next run, never this)."""
        return next((str(a["model"]) for a in reversed(self.attempts) if a.get("model")), None)

    @property
    def duration(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return self.end - self.start


def _json_copy(value: Any) -> Any:
    """A copy of a node field, as `dataclasses.asdict` makes it: containers copied all the
    way down, dataclasses inside turned into dicts, other values shared."""
    kind = type(value)
    if kind is dict:
        return {k: _json_copy(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return kind(_json_copy(v) for v in value)
    if kind in (str, int, float, bool, _NONE, Status):
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return _copy.deepcopy(value)


_NODE_FIELDS = tuple(f.name for f in fields(Node))
_NONE = type(None)
_NUM = (int, float)
# Field -> accepted JSON types; bool is excluded from numbers explicitly below.
FIELD_TYPES: dict[str, tuple] = {
    "agent": (str,), "model": (str, _NONE), "status": (str,), "output": (str, _NONE),
    "attempts": (list,), "tokens_in": (int,), "tokens_out": (int,), "cost_usd": _NUM,
    "start": _NUM + (_NONE,), "end": _NUM + (_NONE,), "error": (str, _NONE),
    "clone": (str, _NONE), "estimate_s": _NUM + (_NONE,), "downgraded_from": (str, _NONE),
    "stale": (bool,), "pruned_from": (dict, _NONE), "execution": (dict, _NONE),
}


def node_fields(d: dict) -> tuple[dict, list[str]]:
    """Node fields of `d` (other than id and requirement) with valid types, and the names of bad ones."""
    good, bad = {}, []
    for name, types in FIELD_TYPES.items():
        if name not in d:
            continue
        value = d[name]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if name == "attempts" and ok:
            ok = all(isinstance(a, dict) for a in value)
        if ok:
            good[name] = _copy.deepcopy(value)
        else:
            bad.append(name)
    return good, bad
