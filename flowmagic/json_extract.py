"""Pull one JSON value out of what a model really wrote, and join an answer continued
after the token limit.

Models wrap JSON in code fences and prose, leave trailing commas, use single quotes,
Python literals (True, None), comments and unquoted keys, and get cut off by a length
limit. `extract_json` repairs the first four kinds of damage. A value cut off before
its closing bracket is reported as truncated and never completed by guessing.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from .errors import ModelOutputError, TruncatedError

__all__ = ["extract_json", "find_json_spans", "join_continued", "FENCE_LINE"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.S)
_SMART = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_OPEN = {"{": "}", "[": "]"}


def _scan(text: str, start: int) -> int | None:
    """Index just past the bracket that closes text[start]; -1 on a mismatched bracket,
    None when the text ends first."""
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            # An apostrophe inside a word ("don't") is not a string delimiter.
            if ch == '"' or not (i > 0 and text[i - 1].isalnum() and i + 1 < len(text)
                                 and text[i + 1].isalnum()):
                quote = ch
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in "}]":
            if not stack or stack[-1] != ch:
                return -1
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    return None


def find_json_spans(text: str) -> tuple[list[str], bool]:
    """Candidate JSON texts in reading order, and whether one was left unclosed."""
    spans: list[str] = []
    i = 0
    while i < len(text):
        if text[i] in _OPEN:
            end = _scan(text, i)
            if end is None:
                # Everything after an opening bracket that never closes belongs to a
                # value that was cut off; its complete inner parts are not answers.
                return spans, True
            if end < 0:
                i += 1
                continue
            spans.append(text[i:end])
            i = end
        else:
            i += 1
    return spans, False


def _strip_comments(text: str) -> str:
    out, quote, i = [], None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            out.append(ch)
        elif text.startswith("//", i) or ch == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_BARE_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_\-]*)(\s*:)")
_PY_WORDS = {"true": "True", "false": "False", "null": "None"}


def _python_literal(text: str) -> Any:
    # JSON words become Python words outside strings, then ast reads single quotes,
    # tuples and True/None safely (literal_eval never runs code).
    out, quote, i = [], None, 0
    while i < len(text):
        ch = text[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = None
            i += 1
            continue
        if ch in "\"'":
            quote = ch
        m = re.match(r"[A-Za-z_]+", text[i:])
        if m:
            word = m.group(0)
            out.append(_PY_WORDS.get(word, word))
            i += len(word)
            continue
        out.append(ch)
        i += 1
    return ast.literal_eval("".join(out))


def _parse(candidate: str) -> Any:
    attempts = [candidate]
    cleaned = _TRAILING_COMMA.sub(r"\1", _strip_comments(candidate.translate(_SMART)))
    attempts.append(cleaned)
    attempts.append(_BARE_KEY.sub(r'\1"\2"\3', cleaned))
    for attempt in attempts:
        try:   # a raw newline or tab inside a string, as small models write them, is read
            return json.loads(attempt, strict=False)
        except (ValueError, RecursionError):   # nested deeper than the recursion limit
            pass
    for attempt in attempts[1:]:
        try:
            value = _python_literal(attempt)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (dict, list, tuple)):
            try:  # keys JSON cannot have (b"id", (1, 2)) are dropped, not a crash
                return json.loads(json.dumps(value, default=str, skipkeys=True))
            except (ValueError, RecursionError):
                continue
    raise ValueError("not JSON")


def extract_json(text: str, *, finish_reason: str | None = None) -> Any:
    """The first JSON object or array in `text`, repaired; raises a one-line error.

    `finish_reason="length"` with no complete value means the answer was cut off.
    """
    if not isinstance(text, str) or not text.strip():
        raise ModelOutputError("the model returned an empty answer; try again or use a stronger model")
    stripped = text.strip()
    try:
        value = json.loads(stripped, strict=False)
        if isinstance(value, (dict, list)):
            return value
    except (ValueError, RecursionError):
        pass
    sources = [body for _, body in _FENCE.findall(text)] + [text]
    unclosed_any = False
    for source in sources:
        spans, unclosed = find_json_spans(source)
        unclosed_any = unclosed_any or unclosed
        for span in sorted(spans, key=len, reverse=True):
            try:
                return _parse(span)
            except ValueError:
                continue
    if unclosed_any or finish_reason == "length":
        raise TruncatedError(
            "the model's JSON answer was cut off before it ended; raise max_tokens or ask for less"
        )
    raise ModelOutputError(
        f"the model did not answer with JSON (it began {stripped[:60]!r}); "
        "try again, or use a model that follows formats better"
    )


# ----------------------------------------------------------------------------- continuations
# A fence line of a Markdown code block: the fence (group 1) and the language it names (group 2).
FENCE_LINE = re.compile(r"[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n`]*$")


def _open_block(lines: list[str]) -> tuple[int, str] | None:
    """Where the fenced block left open at the end of `lines` starts (the index of its
    opening fence line) and its fence, or None when every block is closed."""
    open_at: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        m = FENCE_LINE.match(line)
        if open_at is None:
            if m:
                open_at = (i, m.group(1))
        elif line.strip() and set(line.strip()) == {open_at[1][0]} and len(line.strip()) >= len(open_at[1]):
            open_at = None
    return open_at


def join_continued(text: str, more: str) -> str:
    """`text`, an answer cut at the token limit, followed by `more`, its continuation.

    Asked to continue where it stopped, a model cut inside a code block often opens a
    new block instead (```python) and writes the cut line again. Glued as they are, the
    fence would land in the middle of a code line. So when `text` ends inside an open
    block and `more` starts with a fence that names a language, `more`'s code goes into
    the open block: from the line it repeats when it repeats one (the cut line begun
    again, or the block written again from an earlier line), else after the block's
    finished lines (the cut line is dropped: where it would have ended is unknown).
    Anything else is joined as it is; a bare fence at the start of `more` closes the
    block."""
    head = more.lstrip("\n")
    first, _, code = head.partition("\n")
    start = FENCE_LINE.match(first)
    lines = text.split("\n")
    block = _open_block(lines)
    if not start or not start.group(2) or block is None or start.group(1)[0] != block[1][0]:
        return text + more
    body, partial = lines[block[0] + 1:-1], lines[-1]
    again = code.split("\n", 1)[0].strip()
    if again and partial.strip() and again.startswith(partial.strip()):
        keep = body
    elif again and again in (line.strip() for line in body):
        keep = body[:max(i for i, line in enumerate(body) if line.strip() == again)]
    else:
        keep = body   # the cut line: where it would have ended is unknown
    return "\n".join([*lines[:block[0] + 1], *keep, code])
