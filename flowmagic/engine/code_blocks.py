"""Python code pulled out of a model's answer: its fenced blocks, and an unlabelled fence
when its body parses as Python that does something."""

from __future__ import annotations

import ast
import textwrap

from ..json_extract import FENCE_LINE

__all__ = ["extract_code"]

_PY_LANGS = {"python", "py", "python3", "py3", "ipython", "python3.11", "pycon"}


def _looks_like_code(src: str) -> bool:
    """Parses as Python and does something: bare values (JSON, `42`, a word) do not count."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return any(not isinstance(s, ast.Expr) or isinstance(s.value, (ast.Call, ast.Await))
               for s in tree.body)


def extract_code(text: str) -> list[str]:
    """The Python code blocks of a model's answer, in order.

    Blocks fenced as python (```python, ```py, ~~~python ...) are taken as they are; an
    unlabelled fence is taken when its body parses as Python and is more than a bare
    value. A python fence left open at the end (a cut-off answer) is taken too.
    """
    if not isinstance(text, str):
        return []
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body, i = [], i + 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        src = textwrap.dedent("\n".join(body)).strip("\n")
        if not src.strip():
            continue
        if lang in _PY_LANGS or (lang == "" and closed and _looks_like_code(src)):
            blocks.append(src + "\n")
    return blocks
