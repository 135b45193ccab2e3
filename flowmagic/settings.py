"""A Flow's settings: one pydantic model, the one source of their defaults and checks.

`Settings(**given)` refuses an unknown key or a bad value (NaN, inf, a negative count, a
wrong type) at construction, with one `ConfigError` line that says what to do; assigning a
setting later is checked the same way. A setting given as None takes its default, except
`concurrency` and `max_tokens`, where None means no limit, and `max_attempts` and
`continuations`, where None leaves them to the endpoint (engine/node_runner.py). Settings
read as attributes (`settings.k`); `settings["k"]`, `dict(settings)` and `**settings` work
too, for stored runs, exported notebooks and the `%flow config` line, which hold them as a
plain dict.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from pydantic import (BaseModel, ConfigDict, SkipValidation, ValidationError, field_validator,
                      model_validator)

from .errors import ConfigError

__all__ = ["Settings", "DEFAULTS", "UPDATE_STRATEGIES", "SANDBOXES", "HARD_MAX_K", "check_sandbox"]

UPDATE_STRATEGIES = ("after-completion", "concurrent", "on-failure", "off")
SANDBOXES = ("bwrap", "none")
HARD_MAX_K = 1000   # candidate plans per call, whatever max_k says (each one is a paid call)
# concurrency=None: no limit; max_tokens=None: the model's own limit (the embedded one keeps a
# cap); max_attempts and continuations None: by the endpoint (engine/node_runner.py)
_NONE_MEANS_SOMETHING = frozenset(("concurrency", "max_tokens", "max_attempts", "continuations"))
# The one line each refused value gets (a pydantic type error reads like a stack of types).
_SAY = {
    "update": f"update strategy {{value!r}} is not one of {', '.join(UPDATE_STRATEGIES)}",
    "execute": "execute {value!r} must be 'auto' (run the Python an answer holds, in the "
               "sandbox) or 'off' (keep text only)",
    "starter": "starter {value!r} must be 'auto' (for the embedded model), 'on' or 'off'",
    "context": "context {value!r} must be 'parents' or 'ancestors'",
    "workdir_writes": "workdir_writes {value!r} must be 'run' (model code writes only in a run "
                      "folder inside workdir) or 'all' (anywhere in workdir)",
    "code_timeout": "code_timeout must be a number of seconds above 0",
    "max_tokens": "max_tokens must be at least 1 (or None for the model's own limit)",
    "continuations": "continuations must be 0 or more (or None: 2, none on the embedded model "
                     "in a flow on data)",
    "concurrency": "concurrency must be at least 1 (or None for no limit)",
    "mask_rate": "mask_rate must be between 0 and 1",
    "fail_rate": "fail_rate must be between 0 and 1",
    "budget_usd": "budget_usd must be a number of USD, 0 or more, not {value!r} "
                  "(leave it out for no budget)",
    "max_k": f"max_k must be a whole number from 1 to {HARD_MAX_K}, not {{value!r}}",
    "k": "k is a number of candidate plans, a whole number >= 1, not {value!r}",
    "update_k": "update_k is a number of candidate plans, a whole number >= 1, not {value!r}",
}
_COUNTS = {   # whole-number settings: the least value each takes (None allowed: max_*)
    "max_attempts": 1, "max_updates": 0, "context_chars": 0, "tools_top_n": 0,
    "tool_rounds": 0, "max_subtasks": 1, "max_agents": 1, "seed": None,
}
_SECONDS = ("tool_timeout_s", "plan_time_s")   # finite, above 0 (plan_time_s: None too)


class Settings(BaseModel):
    """Every setting of a Flow, with its default (see the README's settings table).

    A field's value is kept exactly as given once its check passed: it feeds cache keys,
    stored runs and exported notebooks, so pydantic must not convert it. `k` (or None),
    `update_k` and `max_k` take only ints (`_plans`), so they are typed `int` with pydantic's
    own conversion skipped (a strict int would still turn an int subclass into an int). The
    fields typed `Any` accept more than one type and keep it: a number or its text
    (seed="4" stays "4"), an int or a float (mask_rate=0 stays 0), a name or a function;
    typing them would convert or refuse values accepted today.
    """

    model_config = ConfigDict(validate_assignment=True)

    k: SkipValidation[int | None] = None   # candidate plans; None: the endpoint's (default_k)
    model: str | None = None
    strategy: str = "balanced"
    update: str = "on-failure"
    validate_: Any = "none"     # "none", "llm" or a function (node, output) -> bool
    validator_model: str | None = None
    concurrency: Any = 8
    context: str = "parents"
    budget_usd: Any = None
    max_attempts: Any = None    # None: 3, or 2 on the embedded model in a flow on data
    max_updates: Any = None     # None: 5, or 1 on the embedded model in a flow on data
    update_k: SkipValidation[int] = 1
    mask_rate: Any = 0.0
    fail_rate: Any = 0.0
    seed: Any = 0
    temperature: Any = None
    max_tokens: Any = None
    context_chars: Any = 16000
    continuations: Any = None   # None: 2, or 0 for a node on the embedded model in a flow on data
    # code (engine/answer_code): "auto" runs the Python an answer holds in the sandbox, in the
    # run's workspace (workdir, default <home>/runs/<run>/workspace); "off" keeps text only
    execute: str = "auto"
    code_timeout: Any = 60.0
    workdir: Any = None
    # what model code may write with a workdir: "run" (only its run folder,
    # <workdir>/flowmagic-runs/<run>, the default) or "all" (the whole workdir; inputs stay
    # read-only, modes are put back): see the README's sandbox section
    workdir_writes: str = "run"
    # the working start (Workspace.example): "auto" runs it for the embedded model only, in
    # the sandbox, in the first node that explores or plots a table input; "on"; "off"
    starter: str = "auto"
    max_subtasks: Any = None
    max_agents: Any = None
    consolidate: bool = True
    repairs: bool = True
    # planning: "auto" (one subtask without a call for a data task whose answer is a few named
    # values, else stepwise on the embedded model), "oneshot", "stepwise" or "direct"; seconds
    # for one planning (None: K x planner.PLAN_TIME_S on the embedded model, else no limit)
    plan_method: str = "auto"
    plan_time_s: Any = None
    # tools (flowmagic.engine.tools): how many are offered per node, rounds of calls, seconds per call
    tools_top_n: Any = 3
    tool_rounds: Any = 4
    tool_timeout_s: Any = 30.0
    tool_protocol: str = "auto"
    tool_similarity: Any = "auto"
    # candidate plans are paid calls: k (and update_k) above max_k needs max_k raised on purpose
    max_k: SkipValidation[int] = 10
    # where model-written code runs: "bwrap" (isolated by bubblewrap) or "none" (no
    # isolation, warned on every run)
    sandbox: str = "bwrap"

    def __init__(self, **given: Any) -> None:
        try:
            super().__init__(**given)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        name = _FIELD.get(name, name)
        if name not in type(self).model_fields:
            raise ConfigError(_unknown([name]))
        if value is None and name not in _NONE_MEANS_SOMETHING:
            value = type(self).model_fields[name].default
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    # -- checks ----------------------------------------------------------------------------
    @classmethod
    def refuse_unknown(cls, keys: Any) -> None:
        """A ConfigError line naming the keys that are no setting (before any value is known)."""
        unknown = sorted(k for k in keys if _FIELD.get(k, k) not in cls.model_fields)
        if unknown:
            raise ConfigError(_unknown(unknown))

    @model_validator(mode="before")
    @classmethod
    def _known(cls, given: Any) -> Any:
        if not isinstance(given, dict):
            return given
        cls.refuse_unknown(given)
        fields = cls.model_fields   # None takes the default (this runs on assignments too)
        return {name: fields[name].default if v is None and name not in _NONE_MEANS_SOMETHING
                else v for name, v in ((_FIELD.get(k, k), v) for k, v in given.items())}

    @field_validator("update", "execute", "starter", "context", "workdir_writes", mode="before")
    @classmethod
    def _choice(cls, value: Any, info) -> Any:
        allowed = {"update": UPDATE_STRATEGIES, "execute": ("auto", "off"),
                   "starter": ("auto", "on", "off"), "context": ("parents", "ancestors"),
                   "workdir_writes": ("run", "all")}
        if value not in allowed[info.field_name]:
            raise ValueError(_SAY[info.field_name].format(value=value))
        return value

    @field_validator("sandbox", mode="before")
    @classmethod
    def _sandbox(cls, value: Any) -> Any:
        return check_sandbox(value)

    @field_validator("k", "update_k", "max_k", mode="before")
    @classmethod
    def _plans(cls, value: Any, info) -> Any:
        if value is None and info.field_name == "k":
            return None   # decided when planning starts, by the endpoint's slots
        top = HARD_MAX_K if info.field_name == "max_k" else math.inf
        if not _whole(value) or not 1 <= value <= top:
            raise ValueError(_SAY[info.field_name].format(value=value))
        return value

    @field_validator("concurrency", "max_tokens", "continuations", mode="before")
    @classmethod
    def _limits(cls, value: Any, info) -> Any:
        least = 0 if info.field_name == "continuations" else 1
        if value is None:
            return None
        if not _whole_like(value) or float(value) < least:
            raise ValueError(_SAY[info.field_name])
        return value

    @field_validator(*_COUNTS, mode="before")
    @classmethod
    def _counts(cls, value: Any, info) -> Any:
        least = _COUNTS[info.field_name]
        if value is None and info.field_name.startswith("max_"):
            return None
        if not _whole_like(value) or (least is not None and float(value) < least):
            more = "" if least is None else f" >= {least}"
            raise ValueError(f"{info.field_name} must be a whole number{more}, not {value!r}")
        return value

    @field_validator("code_timeout", *_SECONDS, mode="before")
    @classmethod
    def _seconds(cls, value: Any, info) -> Any:
        if value is None and info.field_name == "plan_time_s":
            return None
        if not _finite(value) or float(value) <= 0:
            raise ValueError(_SAY.get(info.field_name)
                             or f"{info.field_name} must be a number of seconds above 0, "
                                f"not {value!r}")
        return value

    @field_validator("mask_rate", "fail_rate", mode="before")
    @classmethod
    def _rate(cls, value: Any, info) -> Any:
        if not _finite(value) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(_SAY[info.field_name])
        return value

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        if value is not None and not (_finite(value) and float(value) >= 0):
            raise ValueError(_SAY["budget_usd"].format(value=value))
        return value

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, value: Any) -> Any:
        if value is not None and not (_finite(value) and float(value) >= 0):
            raise ValueError(f"temperature must be a number, 0 or more, not {value!r} "
                             "(leave it out for the model's default)")
        return value

    @model_validator(mode="after")
    def _k_within_limit(self) -> Settings:
        for key in ("k", "update_k"):
            value, limit = getattr(self, key), self.max_k
            if value is not None and value > limit:
                raise ValueError(
                    f"{key}={value} would send {value} paid planning calls at once; the limit is "
                    f"max_k={limit}: lower {key}, or raise the limit on purpose "
                    f"(--max-k {min(value, HARD_MAX_K)}, at most {HARD_MAX_K})")
        return self

    # -- a dict's face, for stored runs, exported notebooks and **settings ------------------
    def __getitem__(self, key: str) -> Any:
        name = _FIELD.get(key, key)
        if name not in type(self).model_fields:
            raise KeyError(key)
        return getattr(self, name)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and _FIELD.get(key, key) in type(self).model_fields

    def __iter__(self) -> Iterator[str]:   # type: ignore[override]  (dict(settings) works)
        return iter(DEFAULTS)

    def __len__(self) -> int:
        return len(DEFAULTS)

    def keys(self):
        return DEFAULTS.keys()

    def items(self):
        return [(key, self[key]) for key in DEFAULTS]

    def values(self):
        return [self[key] for key in DEFAULTS]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def to_dict(self) -> dict:
        """The settings as a plain dict, by their names (`validate`, not `validate_`)."""
        return dict(self.items())

    def given(self) -> dict:
        """The settings set on purpose (at construction or later), by name: what a caller
        passes on to a function whose own defaults should hold for the rest."""
        return {key: self[key] for key in DEFAULTS if _FIELD.get(key, key) in self.model_fields_set}

    def deciding_calls(self) -> dict:
        """The settings that change what a node's model call returns, by name (a replay's
        fingerprint holds them; the prompt is hashed apart)."""
        return {"seed": self.seed, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "validate": self.validate_, "validator_model": self.validator_model,
                "max_attempts": self.max_attempts, "fail_rate": self.fail_rate,
                "mask_rate": self.mask_rate, "context": self.context,
                "context_chars": self.context_chars}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Settings):
            return self.to_dict() == other.to_dict()
        if isinstance(other, dict):
            return self.to_dict() == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.items())})"


# `validate` is BaseModel's own name; the setting is `validate` everywhere a user sees it.
_FIELD = {"validate": "validate_"}
_NAME = {v: k for k, v in _FIELD.items()}
DEFAULTS: dict[str, Any] = {_NAME.get(name, name): field.default
                            for name, field in Settings.model_fields.items()}


def check_sandbox(sandbox: object) -> str:
    """`sandbox` if it is a known setting, else a ConfigError saying which are."""
    if sandbox not in SANDBOXES:
        raise ConfigError(f"sandbox must be 'bwrap' (isolated, the default) or 'none' (no "
                          f"isolation, unsafe), not {sandbox!r}")
    return sandbox


def _unknown(keys: list[str]) -> str:
    return f"unknown setting(s) {', '.join(keys)}; known: {', '.join(DEFAULTS)}"


def _one_line(exc: ValidationError) -> str:
    """The first error of `exc` as the line its check wrote (or pydantic's, for a type)."""
    error = exc.errors(include_url=False)[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, (ValueError, ConfigError)):
        return str(cause)
    where = ".".join(_NAME.get(str(p), str(p)) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg')}, not {error.get('input')!r}"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole_like(value: Any) -> bool:
    """A whole number, or text of one (`--set concurrency=4` arrives as text)."""
    if isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number == int(number)


def _finite(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
