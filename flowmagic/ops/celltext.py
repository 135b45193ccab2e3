"""What flowmagic writes into a notebook's code cells, encoded so a value cannot break out.

An exported notebook is code the user will run, and some of what it says came from a model
or an endpoint (node ids, roles, model names, a served model's id). Three ways to write a
value, each safe for any string:

- `comment(text)`: one `# ...` line. Everything that is not printable ASCII is escaped as
  JSON escapes it (`\\n`, `\\u2028`, `\\u0085` ...), so no character can end the comment:
  `str.splitlines`, which IPython uses to cut a cell into lines, breaks at `\\r`, `\\x0b`,
  `\\x0c`, `\\x1c`-`\\x1e`, U+0085, U+2028 and U+2029 as well as `\\n`.
- `literal(value)`: a Python string literal on one line, ASCII only (`ascii()`).
- `magic_word(value, what)`: a word on a `%%flow_node` / `%%flow_code` line. Only names of
  the safe alphabets (`model.names`) pass, which need no quoting and hold nothing IPython
  would expand; anything else is refused with one line (a value that needs quoting on a
  magic line is a value flowmagic never made).
"""

from __future__ import annotations

import json
import re

from ..errors import ConfigError
from .._internal.text import short_repr

__all__ = ["comment", "literal", "magic_word", "magic_line"]

# The alphabets of model.names together (ids and roles are subsets of model names'), plus
# "," between the ids of --after; never a leading "-", which argparse would read as an option.
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:/@+,-]*")


def comment(text: str) -> str:
    """`text` as one comment line: printable ASCII only, whatever `text` holds."""
    return "# " + json.dumps(str(text), ensure_ascii=True)[1:-1]


def literal(value: str) -> str:
    """`value` as a Python string literal on one line, ASCII only."""
    return ascii(str(value))


def magic_word(value: str, what: str) -> str:
    """`value` as one word of a magic line, or ConfigError when it is no safe name."""
    if isinstance(value, str) and len(value) <= 400 and _WORD.fullmatch(value):
        return value
    raise ConfigError(f"cannot write {what} {short_repr(value, 50)} on a notebook's magic line: "
                      "it is not a name (letters, digits and . _ : / @ + -); fix it (for a "
                      "model: flow.downgrade(NODE, MODEL)) and export again")


def magic_line(magic: str, *words: tuple[str, str], options: dict | None = None) -> str:
    """`%%magic WORD ... --option VALUE ...`, each (value, what) checked by `magic_word`;
    an option whose value is None or empty is left out."""
    parts = [f"%%{magic}"] + [magic_word(v, what) for v, what in words]
    for flag, (value, what) in (options or {}).items():
        if value:
            parts += [flag, magic_word(value, what)]
    return " ".join(parts)
