"""Text cutters every layer shares, so each way of shortening a text is written once."""

from __future__ import annotations

from typing import Any

__all__ = ["one_line", "short_repr", "keep_ends"]


def one_line(text: Any, limit: int = 80) -> str:
    """`text` on one line (white space folded), at most `limit` characters ending in "…"."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_repr(x: Any, limit: int = 40) -> str:
    """`repr(x)` in at most `limit` characters ending in "...": a value quoted in a warning."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def keep_ends(text: str, limit: int, marker: str, *, reserve: int = 0) -> str:
    """The head and the tail of `text` (`(limit - reserve) // 2` characters each, at least
    one) around `marker`, where `{n}` is how many characters were left out."""
    if len(text) <= limit:
        return text
    half = max((limit - reserve) // 2, 1)
    return f"{text[:half]}{marker.format(n=len(text) - 2 * half)}{text[-half:]}"
