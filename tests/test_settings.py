"""A Flow's settings are one pydantic model: every default in one place, every bad value or
unknown key refused at construction (and on assignment) in one line that says what to do."""

import json
import math

import pytest

from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.settings import DEFAULTS, Settings

TWO = {"nodes": [{"id": "a", "requirement": "do a"}, {"id": "b", "requirement": "do b"}],
       "edges": [["a", "b"]]}

# setting, a bad value, words the one line must hold
BAD = [
    ("budget_usd", math.nan, "budget_usd must be a number of USD"),
    ("budget_usd", "nan", "budget_usd must be a number of USD"),
    ("budget_usd", math.inf, "budget_usd must be a number of USD"),
    ("budget_usd", -1, "budget_usd must be a number of USD"),
    ("budget_usd", True, "budget_usd must be a number of USD"),
    ("code_timeout", math.inf, "code_timeout must be a number of seconds above 0"),
    ("code_timeout", math.nan, "code_timeout must be a number of seconds above 0"),
    ("code_timeout", 0, "code_timeout must be a number of seconds above 0"),
    ("tool_timeout_s", -5, "tool_timeout_s must be a number of seconds above 0"),
    ("plan_time_s", math.inf, "plan_time_s must be a number of seconds above 0"),
    ("temperature", math.nan, "temperature must be a number, 0 or more"),
    ("temperature", -0.5, "temperature must be a number, 0 or more"),
    ("mask_rate", 1.5, "mask_rate must be between 0 and 1"),
    ("fail_rate", math.nan, "fail_rate must be between 0 and 1"),
    ("k", 0, "k is a number of candidate plans"),
    ("k", 2.5, "k is a number of candidate plans"),
    ("k", "3", "k is a number of candidate plans"),
    ("k", 11, "k=11 would send 11 paid planning calls at once"),
    ("max_k", 1001, "max_k must be a whole number from 1 to 1000"),
    ("concurrency", 0, "concurrency must be at least 1"),
    ("concurrency", "many", "concurrency must be at least 1"),
    ("max_tokens", -1, "max_tokens must be at least 1"),
    ("continuations", -1, "continuations must be 0 or more"),
    ("max_attempts", 0, "max_attempts must be a whole number >= 1"),
    ("max_updates", -1, "max_updates must be a whole number >= 0"),
    ("tool_rounds", math.inf, "tool_rounds must be a whole number >= 0"),
    ("seed", "x", "seed must be a whole number"),
    ("update", "sometimes", "update strategy 'sometimes' is not one of"),
    ("execute", "yes", "execute 'yes' must be 'auto'"),
    ("starter", "yes", "starter 'yes' must be 'auto'"),
    ("context", "all", "context 'all' must be 'parents' or 'ancestors'"),
    ("sandbox", "docker", "sandbox must be 'bwrap'"),
    ("model", 3, "model: Input should be a valid string"),
    ("consolidate", "maybe", "consolidate: Input should be a valid boolean"),
]


@pytest.mark.parametrize("key, value, says", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_is_refused_at_construction_in_one_line(key, value, says):
    with pytest.raises(ConfigError) as info:
        Settings(**{key: value})
    line = str(info.value)
    assert says in line and "\n" not in line
    with pytest.raises(ConfigError, match=key):
        Flow.from_dict(TWO, task="t", **{key: value})


@pytest.mark.parametrize("key, value, says", BAD[:12], ids=[f"{k}={v!r}" for k, v, _ in BAD[:12]])
def test_a_bad_value_assigned_later_is_refused_and_the_old_one_kept(key, value, says):
    settings = Settings()
    before = settings[key]
    with pytest.raises(ConfigError, match=key):
        settings[key] = value
    assert settings[key] == before


def test_unknown_keys_are_refused_naming_them_and_the_known_ones():
    with pytest.raises(ConfigError) as info:
        Settings(budget=3, kk=1)
    line = str(info.value)
    assert line.startswith("unknown setting(s) budget, kk; known: k, model,") and "\n" not in line
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings().budget = 3


def test_none_takes_the_default_except_where_it_means_no_limit_or_by_the_endpoint():
    s = Settings(k=None, seed=None, concurrency=None, max_tokens=None)
    # k None: decided when planning starts, by the endpoint (planner.default_k)
    assert (s.k, s.seed, s.concurrency, s.max_tokens) == (None, 0, None, None)
    s.k = 2
    s.k = None
    assert s.k is None


def test_the_model_is_the_one_source_of_defaults_and_reads_as_a_dict():
    s = Settings(validate="llm", budget_usd=0.5)
    assert dict(s) == {**DEFAULTS, "validate": "llm", "budget_usd": 0.5}
    assert s.validate_ == s["validate"] == "llm" and s.budget_usd == s.get("budget_usd")
    assert json.loads(json.dumps(s.to_dict()))["budget_usd"] == 0.5
    flow = Flow.from_dict(TWO, task="t", budget_usd=0.5)
    assert flow.settings == s.to_dict() | {"validate": "none"}
    assert Flow.from_dict(TWO, task="t", **flow.settings).settings == flow.settings
