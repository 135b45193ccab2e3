"""Text cutters every layer shares, so each way of shortening a text is written once."""

from __future__ import annotations

from typing import Any

__all__ = ["one_line", "short_repr", "keep_ends", "cut"]


def one_line(text: Any, limit: int = 80) -> str:
    """`text` on one line (white space folded), at most `limit` characters ending in "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_repr(x: Any, limit: int = 40) -> str:
    """`repr(x)` in at most `limit` characters ending in "...": a value quoted in a warning."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cut(text: str | None, limit: int, marker: str, *, head: int | None = None,
        fit: bool = False, least: int = 0) -> str:
    """`text` (None: "") if it has at most `limit` characters; else its first `head`
    characters and `marker`, where `{n}` is how many characters were left out.

    Without `fit` the marker comes on top of `head` (default `limit`) characters. With `fit`
    the whole is `limit` long: `head` defaults to what the marker leaves, and the last
    characters fill the rest. Below a `limit` of `least`, only the marker is left (stripped).
    The prompts' cutters are these parameters, so their text (and cache keys) stay the same.
    """
    text = text or ""
    if len(text) <= limit:
        return text
    if limit < least:
        return marker.format(n=len(text)).strip()
    if not fit:
        head = max(0, limit if head is None else head)
        return text[:head] + marker.format(n=len(text) - head)
    size = len(marker.format(n=0))   # the marker of a prompt cut to fit has no count
    head = limit - size if head is None else head
    tail = max(0, limit - head - size)
    return text[:head] + marker.format(n=len(text) - head - tail) + (text[-tail:] if tail else "")


def keep_ends(text: str, limit: int, marker: str, *, reserve: int = 0) -> str:
    """The head and the tail of `text` (`(limit - reserve) // 2` characters each, at least
    one) around `marker`, where `{n}` is how many characters were left out."""
    if len(text) <= limit:
        return text
    half = max((limit - reserve) // 2, 1)
    return f"{text[:half]}{marker.format(n=len(text) - 2 * half)}{text[-half:]}"
