"""A local server's answer, timed on its progress rather than on its length.

A model on a laptop writes 10-30 tokens a second, so a whole-answer timeout either cuts
long answers or waits minutes for a dead server. A streamed answer shows progress: the
call fails only when no first token comes within `first_token_s` (the prompt is read,
the queue ahead of it served), when the stream stalls for `stall_s`, or past
`answer_s`, a whole-answer limit that is the user's choice (None: none). Whichever it
was is said in one line (`NoProgress.line`). Leaving the stream closes it, so the server,
which notices a closed connection at its next token, stops generating for nobody.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable

__all__ = ["NoProgress", "follow"]


class NoProgress(Exception):
    """A streamed answer that stopped making progress; `phase` is "first" (no first token),
    "stall" (no next token) or "whole" (past the whole-answer limit)."""

    def __init__(self, phase: str, seconds: float, pieces: int):
        super().__init__(phase)
        self.phase, self.seconds, self.pieces = phase, seconds, pieces

    def line(self, where: str, ahead: int) -> str:
        """One line for the user: what happened and what to do."""
        if self.phase == "first":
            queue = (f"{ahead} request{'s' if ahead != 1 else ''} ahead" if ahead else
                     "none of ours ahead (another client, or a long prompt)")
            return (f"{where} is busy: {queue}, no token for {self.seconds:g} s; it is up (it "
                    "took the request, now cancelled): run again when it is free, or raise "
                    "first_token_s")
        if self.phase == "stall":
            return (f"{where} stalled: no token for {self.seconds:g} s after {self.pieces} "
                    "pieces of the answer; the request was cancelled on it: check the server, "
                    "then run again (or raise stall_s)")
        return (f"{where} did not finish the answer within answer_s={self.seconds:g} s (it "
                f"was still writing: {self.pieces} pieces); the request was cancelled on it: "
                "raise answer_s, or set it to None")


async def follow(events: AsyncIterator[Any], take: Callable[[Any], None], *,
                 first_token_s: float, stall_s: float, answer_s: float | None) -> int:
    """Feed each event of `events` to `take` until the stream ends; the number of events.
    Raises `NoProgress` when a bound is passed. `events` is closed in every case (an
    async generator whose closing closes the HTTP response and its connection)."""
    loop = asyncio.get_running_loop()
    pieces = 0
    whole, timer = asyncio.timeout(answer_s), asyncio.timeout(first_token_s)
    try:
        async with whole:
            async with timer:
                async for event in events:
                    pieces += 1
                    timer.reschedule(loop.time() + stall_s)
                    take(event)
    except TimeoutError:
        if whole.expired():
            raise NoProgress("whole", float(answer_s or 0), pieces) from None
        raise NoProgress("first" if not pieces else "stall",
                         first_token_s if not pieces else stall_s, pieces) from None
    finally:
        await events.aclose()
    return pieces
