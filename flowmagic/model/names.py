"""The names a model may give: node ids, agent roles and model names, each from a safe alphabet.

What a model writes is untrusted on the host side too, and these names travel: onto the
magic lines and comments of an exported notebook, into the store and onto the panel. Each
alphabet holds only characters that need no quoting on a command or magic line, none that
IPython expands (`{`, `}`, `$`) and none that ends a line (`str.splitlines` breaks at more
than `\\n`: `\\r`, U+0085, U+2028 ...), so a valid name cannot break out of where it is
written:

- node ids: 1-40 of `a-z 0-9 _` (`node.is_slug`);
- agent roles: the same alphabet (`plans.clean_agent` makes one from what a model wrote);
- model names: 1-200 of `A-Z a-z 0-9 . _ : / @ + -`, starting with a letter or digit
  (so "Qwen/Qwen2.5-7B-Instruct", "llama3.2:1b", "cheap:gpt-4.1-mini" and
  "hf.co/org/model:Q4_K_M" are names; a leading "-" would read as an option).
"""

from __future__ import annotations

import re

from .._internal.text import short_repr
from .node import SLUG_MAX, is_slug

__all__ = ["MODEL_MAX", "MODEL_CHARS", "is_model_name", "model_name_problem", "is_agent_name",
           "agent_name_problem"]

MODEL_MAX = 200
MODEL_CHARS = "letters, digits and . _ : / @ + -"
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")


def is_model_name(text: object) -> bool:
    """True for a model name from the safe alphabet (see the module docstring)."""
    return (isinstance(text, str) and 0 < len(text) <= MODEL_MAX
            and _MODEL.fullmatch(text) is not None)


def _bad_char(text: str, allowed) -> str:
    return next((c for c in text if not allowed(c)), "")


def model_name_problem(text: object) -> str | None:
    """None for a good model name, else what is wrong with it, as a phrase for one line."""
    if is_model_name(text):
        return None
    if not isinstance(text, str):
        return f"{short_repr(text)} is a {type(text).__name__}, not a model name"
    if not text:
        return "the model name is empty"
    if len(text) > MODEL_MAX:
        return f"the model name {short_repr(text, 30)} has {len(text)} characters (at most {MODEL_MAX})"
    bad = _bad_char(text, lambda c: c.isascii() and (c.isalnum() or c in "._:/@+-"))
    if bad:
        return (f"the model name {short_repr(text, 50)} holds {bad!r} (a model name is "
                f"{MODEL_CHARS})")
    return f"the model name {short_repr(text, 50)} must start with a letter or a digit"


def is_agent_name(text: object) -> bool:
    """True for an agent role from the safe alphabet (the node ids' one)."""
    return is_slug(text)


def agent_name_problem(text: object) -> str | None:
    """None for a good agent role, else what is wrong with it, as a phrase for one line."""
    if is_slug(text):
        return None
    return (f"the agent {short_repr(text, 50)} is not a role name (1-{SLUG_MAX} of lowercase "
            "letters, digits and _)")
