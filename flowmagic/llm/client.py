"""The only door to models: AsyncOpenAI against any OpenAI-compatible endpoint.

Every call is cached by a content hash of (endpoint, model, messages, parameters,
seed), logged in the store with tokens, latency and cost, retried with bounded
exponential backoff on 429 / 5xx / timeouts / connection errors, and limited by a
process-wide concurrency cap (and an optional requests-per-minute cap).
Structured output asks for `json_schema`, falls back to `json_object` with the
schema (llama.cpp turns it into a grammar), then to plain text with extraction, and
remembers per endpoint what worked. With `tools`, the reply carries the model's
`tool_calls` (OpenAI wire shape); an endpoint that rejects `tools` raises
`ToolsUnsupportedError` once and is remembered, so callers switch to a JSON protocol.

A local endpoint (`Endpoint.self_hosted`: a server the user runs) is asked differently:
its answers are streamed and timed on progress (llm.progress: `first_token_s`, `stall_s`,
and `answer_s`, the user's whole-answer limit), its calls wait on our side for one of the
server's slots (llm.queue), an abandoned call is closed so the server stops on it, a call
that made no progress is not sent again, and a refused connection fails at once.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from typing import Any, Callable

from . import transport as _transport
from .cache_keys import cache_key
from .chat import CONTINUE_PROMPT, LOCAL_MAX_TOKENS, ChatCalls, Reply
from .embeddings import Embeddings
from .endpoints import Endpoint, configure
from .failures import EmbeddingsUnsupportedError, ToolsUnsupportedError
from .._internal.aio import run_blocking
from ..store import Store

# Re-exported: `flowmagic.llm.client` is where callers (and `flowmagic.llm`) find them.
__all__ = ["LLM", "Reply", "configure", "get_llm", "cache_key", "ToolsUnsupportedError",
           "EmbeddingsUnsupportedError", "LOCAL_MAX_TOKENS", "CONTINUE_PROMPT", "run_closing"]


class LLM(ChatCalls, Embeddings):
    """Calls models through the openai SDK; see the module docstring. Its chat calls are in
    `chat`, its embedding calls in `embeddings`, what both use to reach an endpoint (clients,
    slots, batched store access, closing) in `connections`."""

    def __init__(self, store: Store | None = None, *, timeout: float = 120.0,
                 max_retries: int = 4, concurrency: int = 8, rpm: int | None = None,
                 backoff_base: float = 0.5, backoff_max: float = 20.0,
                 transport: _transport.Transport | None = None, first_token_s: float = 300.0,
                 stall_s: float = 60.0, answer_s: float | None = None):
        self._store = store
        self._transport = transport or _transport.Transport()
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.rpm = rpm
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        # A local server's calls (see the module docstring): a generous wait for the first
        # token (a 7B model reading a long prompt on a laptop), a shorter one between tokens.
        self.first_token_s, self.stall_s, self.answer_s = first_token_s, stall_s, answer_s
        self._modes: dict[str, str] = {}   # endpoint identity -> structured-output mode
        self._tool_modes: dict[str, str] = {}   # endpoint identity -> "native" | "action"
        self._embeds: dict[str, bool] = {}   # endpoint identity -> /embeddings works
        self._by_size: set[str] = set()   # models whose usage was priced by size (said once)
        self._per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = (
            weakref.WeakKeyDictionary())
        self._sent: deque[float] = deque()
        self._loop_lock = threading.Lock()
        self._last: tuple | None = None   # the last loop's state (see _state)
        # A caller-supplied async context manager factory, gate(endpoint), entered around
        # each request: e.g. limits shared by the workers of a cluster (ops.dask_worker).
        self.gate: Callable[[Endpoint], Any] | None = None


_shared: LLM | None = None


def get_llm() -> LLM:
    """The process-wide LLM (one concurrency limit for everything in the process)."""
    global _shared
    if _shared is None:
        _shared = LLM()
    return _shared


def run_closing(make: Callable[[], Any], llm: LLM | None = None, *, name: str = "flowmagic") -> Any:
    """`await make()` to its end from sync code, a notebook cell included (see
    `_internal.aio.run_blocking`); then `llm`'s HTTP clients (the shared LLM's when None,
    looked up at the end) are closed in the same loop."""
    async def aclose():
        await (llm or get_llm()).aclose()

    return run_blocking(make, close=aclose, name=name)
