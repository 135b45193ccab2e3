"""No secret and no lone surrogate reaches the file: every text a write carries is
scrubbed of the secrets (API keys) that registered sources name."""

from __future__ import annotations

from typing import Callable, Iterable

__all__ = ["add_secret_source", "known_secrets", "scrub_args", "scrub_rows"]

# Who can tell the store which texts are secrets (the endpoints' API keys): every string
# written is scrubbed of them, so no key reaches the file whatever the caller passed.
_secret_sources: list[Callable[[], Iterable[str]]] = []


def add_secret_source(source: Callable[[], Iterable[str]]) -> None:
    """Register a function returning the secrets (API keys) to scrub from every write."""
    if source not in _secret_sources:
        _secret_sources.append(source)


def known_secrets() -> list[str]:
    """The secrets to scrub now, longest first (a key holding another is hidden whole)."""
    found: set[str] = set()
    for source in _secret_sources:
        found.update(s for s in source() if s)
    return sorted(found, key=len, reverse=True)


def scrub_args(args: tuple, secrets: list[str]) -> tuple:
    """The arguments of one write: no secret in any text, and no lone surrogate (a task
    typed with one would make SQLite refuse the whole write)."""
    if not secrets:   # the usual case (no key long enough to hide): only the text check
        return tuple(value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
                     if isinstance(value, str) and not value.isascii() else value
                     for value in args)
    out = []
    for value in args:
        if isinstance(value, str):
            for secret in secrets:
                if secret in value:
                    value = value.replace(secret, "[key hidden]")
            if not value.isascii():
                value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        out.append(value)
    return tuple(out)


def scrub_rows(rows: list[tuple], secrets: list[str]) -> list[tuple]:
    """`scrub_args` of every row, checked at once: the rows themselves when no text in them
    holds a secret or a lone surrogate, the usual case (one join and a few searches in C
    instead of a new tuple per row). A secret cannot hide across the joins: it is found in
    the joined text whenever it is in one of the texts."""
    texts = [value for row in rows for value in row if isinstance(value, str)]
    joined = "\x00".join(texts)
    if not any(secret in joined for secret in secrets):
        if joined.isascii():
            return rows
        try:
            joined.encode("utf-8")
            return rows
        except UnicodeEncodeError:
            pass
    return [scrub_args(row, secrets) for row in rows]
