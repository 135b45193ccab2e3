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
import atexit
import contextlib
import functools
import hashlib
import json
import random
import re
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable

from . import discovery
from . import endpoints as _endpoints
from . import queue as _queue
from . import transport as _transport
from .progress import NoProgress, follow
from .endpoints import Endpoint, cached_price_of, configure, price_of, scrub
from ..errors import ConfigError, EndpointError, ModelOutputError, TruncatedError
from .._internal.aio import run_blocking
from .._internal.jsontext import encoder
from ..json_extract import extract_json, join_continued
from ..store import Store, get_store

__all__ = ["LLM", "Reply", "configure", "get_llm", "cache_key", "ToolsUnsupportedError",
           "EmbeddingsUnsupportedError", "LOCAL_MAX_TOKENS", "CONTINUE_PROMPT", "run_closing"]

# The embedded model rambles until it is stopped, so every call on it is capped (a caller
# may lower the cap); a configured endpoint gets the model's own limit unless the caller
# names one.
LOCAL_MAX_TOKENS = 512
CONTINUE_PROMPT = ("Your answer stopped at the length limit. Continue it exactly where it "
                   "stopped, mid-word if need be: no repetition, no preamble, no apology.")

_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
_MODES = ("json_schema", "json_object", "text")
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class Reply:
    text: str
    data: Any = None
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0
    cached: bool = False
    call_id: int | None = None
    finish_reason: str | None = None
    cache_key: str = ""
    tool_calls: list[dict] | None = None   # [{"id", "type": "function", "function": {"name", "arguments"}}]
    continuations: int = 0   # extra calls that continued an answer cut at the token limit
    cut: bool = False        # still at the token limit after the last continuation
    priced: bool = True      # False: the model has no known price, cost_usd 0.0 is not "free"
    cached_tokens: int = 0   # input tokens the endpoint served from its prompt cache

    def to_dict(self) -> dict:
        return asdict(self)


def cache_key(identity: str, model: str, messages: list, params: dict, *,
              messages_json: str | None = None, params_json: str | None = None) -> str:
    """SHA-256 of the JSON of [identity, model, messages, params] (sorted keys).

    `messages_json` is `_messages_json(messages)[1]` and `params_json` is `_params_json(params)`
    when the caller has them: the blob is then joined from the parts, byte for byte the dump
    of the whole list (a list's items are encoded one by one and joined with ", "), so stored
    keys still match."""
    if messages_json is None:
        blob = json.dumps([identity, model, messages, params], sort_keys=True, ensure_ascii=False)
    else:
        blob = (f"{_key_head(identity, model)}{messages_json}, "
                f"{params_json if params_json is not None else _params_json(params)}]")
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()   # lone ones too


@functools.lru_cache(maxsize=64)
def _key_head(identity: str, model: str) -> str:
    return f"[{json.dumps(identity, ensure_ascii=False)}, {json.dumps(model, ensure_ascii=False)}, "


# json.dumps(value, sort_keys=True, ensure_ascii=False), byte for byte, with the encoder
# built once instead of per call.
_sorted_json = encoder(sort_keys=True, ensure_ascii=False)


def _params_json(params: dict) -> str:
    """A call's parameters as they enter its cache key and its log row."""
    return _sorted_json(params)


def _messages_json(messages: list) -> tuple[list, str]:
    """(messages, their JSON with sorted keys), lone surrogates as U+FFFD in both (see
    `_valid_unicode`). One dump per call serves the check, the cache key and the log row."""
    text = _sorted_json(messages)
    if text.isascii():
        return messages, text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:   # in JSON text they can only be inside strings
        text = _SURROGATE.sub("\ufffd", text)
        messages = json.loads(text)
    return messages, text


class ToolsUnsupportedError(EndpointError):
    """The endpoint refused a request with `tools`; use a JSON action protocol instead."""


class EmbeddingsUnsupportedError(EndpointError):
    """The endpoint has no usable /embeddings (remembered per endpoint by `LLM.embed`)."""


# Statuses that mean "this endpoint does not embed" until it has embedded once: llama.cpp
# started without --embedding answers 500, chat-only servers 404/405/501, and a chat
# model named as the embedding model 400/422.
_NO_EMBEDDINGS = {400, 404, 405, 422, 500, 501}
_EMBED_BATCH = 256


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _valid_unicode(value: Any) -> Any:
    """Lone surrogates (a "\\ud800" escape in a reply or in its JSON) as U+FFFD: SQLite,
    nbformat and file writers refuse them, so one bad character would crash the run."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if text.isascii():   # (most answers: no encoding to check)
        return value
    try:
        text.encode("utf-8")
        return value
    except UnicodeEncodeError:   # in JSON text they can only be inside strings
        text = _SURROGATE.sub("\ufffd", text)
        return text if isinstance(value, str) else json.loads(text)


_MAX_TOKENS_REPORTED = 10**9   # more than any context window; beyond it the count is a lie
_CHARS_PER_TOKEN = 4           # the size estimate (Flow.estimate's too)
# No tokenizer averages more than ~8 characters a token over a text: a count below a
# sixteenth of the characters is not one an endpoint could really have used.
_MOST_CHARS_PER_TOKEN = 16


def _token_count(value: Any, chars: int) -> int | None:
    """A usage count as the endpoint reported it when it could be true for `chars`
    characters: a whole number (not a bool, float or text) from chars / 16 to 10**9. Else
    None: the caller prices the call by its size, so a hostile or careless endpoint
    (negative, absurd, missing counts) can neither lower the spent budget nor abort the run."""
    if type(value) is not int or not chars // _MOST_CHARS_PER_TOKEN <= value <= _MAX_TOKENS_REPORTED:
        return None
    return value


def _by_size(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


def _chars(messages: list[dict]) -> int:
    """The size of a request: the characters of its messages' texts and tool calls (the
    JSON around them is not what a model reads)."""
    return sum(len(v) if isinstance(v, str) else len(json.dumps(v))
               for m in messages for k, v in m.items() if k != "role" and v)


def _cost(endpoint: Endpoint, model: str, tokens_in: int, tokens_out: int,
          cached_in: int = 0) -> float | None:
    """USD of a call, or None when the model has no known price (logged as unknown, never
    as free: configure(prices=...) gives it one). `cached_in` of the input tokens are paid
    at the model's cached-input rate."""
    price = price_of(model, local=endpoint.local)
    if not price:
        return None
    cached_rate = cached_price_of(model, local=endpoint.local) if cached_in else 0.0
    return ((tokens_in - cached_in) * price[0] + cached_in * cached_rate
            + tokens_out * price[1]) / 1_000_000


def _cached_count(value: Any, tokens_in: int, by_size: bool) -> int:
    """The cached input tokens an endpoint reported when they could be true: a whole number
    from 0 to the call's input tokens as reported. Else 0: a call priced by its size, or a
    count that would price more tokens at the cached rate than were sent, is paid in full."""
    if by_size or type(value) is not int or not 0 <= value <= tokens_in:
        return 0
    return value


def _with_schema_note(messages: list[dict], schema: dict) -> list[dict]:
    note = ("Answer with one JSON value and nothing else. It must match this JSON schema:\n"
            + json.dumps(schema, separators=(",", ":")))
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{note}"
    else:
        out.insert(0, {"role": "system", "content": note})
    return out


def _retryable(exc: Exception, timeout: float) -> "_Retryable | None":
    """The retryable form of a transport or HTTP failure, or None when retrying cannot help
    (a 4xx other than 408/409/429)."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        if exc.status_code not in _RETRY_STATUS:
            return None
        retry_after = exc.response.headers.get("retry-after")
        try:
            wait = float(retry_after) if retry_after else None
        except ValueError:
            wait = None
        return _Retryable(f"HTTP {exc.status_code}", wait)
    if isinstance(exc, openai.APITimeoutError):
        return _Retryable(f"no answer within {timeout:g} s")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return _Retryable(scrub(f"cannot connect: {type(cause).__name__}: {cause}"))
    return _Retryable(scrub(f"malformed response: {exc}"))


def _output_error(error: str, call_id, tokens_in: int, tokens_out: int, cost: float,
                  text: str = ""):
    """The error for an answer that was not the JSON asked for; it carries the call's
    id, usage and text, because the call happened, was paid for, and a cut-off answer
    can be continued."""
    exc = (TruncatedError if "cut off" in error else ModelOutputError)(error)
    exc.call_id, exc.input_tokens, exc.output_tokens, exc.cost_usd = (
        call_id, tokens_in, tokens_out, cost)
    exc.text = text
    return exc


class LLM:
    """Calls models through the openai SDK; see the module docstring."""

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

    @property
    def store(self) -> Store:
        return self._store or get_store()

    # -- per event loop state (httpx clients and semaphores belong to one loop) --
    def _state(self) -> dict:
        loop = asyncio.get_running_loop()
        last = self._last   # (weak ref to a loop, its state): a call asks ~5 times a request
        if last is not None and last[0]() is loop:
            return last[1]
        with self._loop_lock:
            state = self._per_loop.get(loop)
            if state is None:
                state = {"clients": {}, "limits": {}, "log": [], "reads": [], "active": 0,
                         "turn": set(), "all": asyncio.Semaphore(self.concurrency)}
                self._per_loop[loop] = state
                state["closer"] = _arm(_close_with_loop(self, loop))
                _live.add(self)
            self._last = (weakref.ref(loop), state)
            return state

    def _client_now(self, endpoint: Endpoint, state: dict):
        """The client of a remote endpoint on this loop (`state`) when it was built already,
        else None (then `await self._client(endpoint)`): the usual case needs no coroutine."""
        if endpoint.local:
            return None
        return state["clients"].get((endpoint.name, endpoint.base_url))

    async def _client(self, endpoint: Endpoint):
        base_url = endpoint.base_url
        if endpoint.local:
            from .local import ensure_server
            base_url = await asyncio.to_thread(ensure_server)
        state = self._state()
        key = (endpoint.name, base_url)
        if key not in state["clients"]:
            state["clients"][key] = self._transport.client(
                base_url, endpoint.api_key or "not-needed", self.timeout)
        return state["clients"][key]

    def _limit(self, endpoint: Endpoint) -> asyncio.Semaphore | None:
        if not endpoint.concurrency:
            return None
        limits = self._state()["limits"]
        if endpoint.identity not in limits:
            limits[endpoint.identity] = asyncio.Semaphore(endpoint.concurrency)
        return limits[endpoint.identity]

    # These two return `_in_turn`'s future itself (no coroutine of their own to await).
    def _log(self, state: dict, defer: Callable[[dict], None] | None,
             call: dict) -> Awaitable[int | None]:
        """Log a call (`Store.log_call`'s keyword arguments) together with every other call
        that ended in this event-loop turn, in one commit; its row id once it is committed,
        so no result is handed back before its log row is durable. With `defer`, the row
        goes to `defer(call)` instead and the id is None (see `complete`)."""
        if defer is None:
            return self._in_turn(state, "log", call, Store.log_calls)
        defer(call)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def _may_hit(self, state: dict, key: str) -> bool:
        """Whether the store's cache may hold `key`: a call it certainly does not hold skips
        the look-up (its query, and the turn it waits for the calls of this turn to join it).
        Other connections' entries are checked for once per event-loop turn."""
        store, turn = self.store, state["turn"]
        mark = ("keys", store)
        recheck = mark not in turn
        if recheck:
            if not turn:
                asyncio.get_running_loop().call_soon(turn.clear)
            turn.add(mark)
        return store.cache_may_hold(key, recheck=recheck)

    def _cache_get(self, state: dict, key: str) -> Awaitable[dict | None]:
        """The cached answer under `key` (None for a miss); the look-ups of one event-loop
        turn are one SELECT (a wide level of a DAG starts its nodes in one turn)."""
        return self._in_turn(state, "reads", key, Store.cache_get_many)

    def _in_turn(self, state: dict, queue: str, item: Any,
                 handle: Callable[[Store, list], list]) -> asyncio.Future:
        """A future of `handle(store, items)[i]` for this item, with the items queued in this
        event-loop turn handled together in the next one (one SQLite statement or commit per
        store). The first item of a turn from the only call in progress on this loop (a
        chain's) is handled at once instead, its future done when returned: waiting would
        hold its request or its result back. (Only the first: calls that do not wait on the
        network, cache hits, run to their end one after another in one turn, each the only
        one in progress.) A future, not a coroutine: one object less per call in flight.
        `state` is this loop's (`_state()`, which the caller has)."""
        pending = state[queue]
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if state["active"] == 1 and not pending:
            turn = state["turn"]
            if queue not in turn:
                if not turn:
                    loop.call_soon(turn.clear)
                turn.add(queue)
                try:
                    done.set_result(handle(self.store, [item])[0])
                except Exception as exc:   # raised where it is awaited, as before
                    done.set_exception(exc)
                return done
        if not pending:
            loop.call_soon(self._handle_queue, state, queue, handle)
        pending.append((self.store, item, done))
        return done

    @staticmethod
    def _handle_queue(state: dict, queue: str, handle: Callable[[Store, list], list]) -> None:
        pending, state[queue] = state[queue], []
        by_store: dict[Store, list] = {}
        for store, item, done in pending:
            by_store.setdefault(store, []).append((item, done))
        for store, items in by_store.items():
            try:
                results = handle(store, [item for item, _ in items])
            except Exception as exc:   # the callers raise it, as a direct call would
                for _, done in items:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), result in zip(items, results):
                if not done.done():
                    done.set_result(result)

    async def aclose(self) -> None:
        """Close the HTTP clients of the running loop. A loop that ends through `asyncio.run`
        (or `loop.shutdown_asyncgens()`) closes them by itself, and so does process exit."""
        await self._close_clients(self._state())

    @staticmethod
    async def _close_clients(state: dict) -> None:
        clients, state["clients"] = state["clients"], {}
        for client in clients.values():
            await client.close()

    def _close_abandoned(self) -> None:
        """At process exit: the clients of loops that ended without closing them (a loop
        closed by hand, a worker thread's loop). An open aiohttp session would print
        "Unclosed client session" when collected; their sockets are closed here instead."""
        with self._loop_lock:
            states = list(self._per_loop.items())
        for loop, state in states:
            closer = state.get("closer")
            if loop.is_running() or closer is None or closer.ag_frame is None:
                continue
            try:
                if not loop.is_closed():   # a loop left open: close them in it
                    loop.run_until_complete(closer.aclose())
                    continue
            except Exception:   # noqa: BLE001 - at exit, closing is best effort
                pass
            clients, state["clients"] = state["clients"], {}
            _finish(closer)
            for client in clients.values():
                client.abandon()

    def _slot(self, endpoint: Endpoint, state: dict | None = None):
        """One request's place: the requests-per-minute pace, the process-wide cap and the
        endpoint's own cap (the embedded server serves one request at a time). With no
        pace, no endpoint cap and no gate (the usual case) it is the process-wide cap alone."""
        if not self.rpm and not endpoint.concurrency and self.gate is None:
            return (state or self._state())["all"]
        return self._paced_slot(endpoint)

    @contextlib.asynccontextmanager
    async def _paced_slot(self, endpoint: Endpoint):
        if self.rpm:
            await self._pace()
        limit = self._limit(endpoint)
        async with self._state()["all"]:
            if limit is None and self.gate is None:   # a pace alone: no stack to build
                yield
                return
            async with contextlib.AsyncExitStack() as stack:
                if limit is not None:
                    await stack.enter_async_context(limit)
                if self.gate is not None:
                    await stack.enter_async_context(self.gate(endpoint))
                yield

    async def _pace(self) -> None:
        if not self.rpm:
            return
        while True:
            now = time.monotonic()
            while self._sent and now - self._sent[0] > 60:
                self._sent.popleft()
            if len(self._sent) < self.rpm:
                self._sent.append(now)
                return
            await asyncio.sleep(60 - (now - self._sent[0]) + 0.01)

    # -- the call ---------------------------------------------------------------
    async def complete(self, messages: list[dict] | str, *, model: str | None = None,
                       schema: dict | None = None, temperature: float | None = None,
                       seed: int | None = None, max_tokens: int | None = None,
                       cache: bool = True, run_id: str | None = None,
                       node_id: str | None = None, purpose: str | None = None,
                       on_text: Callable[[str], None] | None = None,
                       tools: list[dict] | None = None,
                       defer_log: Callable[[dict], None] | None = None,
                       on_wait: Callable[[int | None], None] | None = None) -> Reply:
        """One chat completion; `on_text` receives the text as it streams in, `on_wait(n)`
        how many requests are ahead while the call waits for a local server (then None).

        `tools` are OpenAI function specs; the reply's `tool_calls` holds what the model
        asked for (None when it answered in text).

        The call's log row (and its cache entry) is committed before the reply is returned,
        unless `defer_log` is given: then the row (`Store.log_call`'s keyword arguments) is
        handed to `defer_log(row)` and the reply's `call_id` is None. The caller writes it
        (`Store.write_batch(calls=...)`), in the commit that makes the result final: a
        flow's node answer and its log row are one commit, not two.
        """
        state = self._state()
        state["active"] += 1   # calls in progress on this loop (see _in_turn)
        try:   # (one coroutine for the whole call: each one more is an object per call in flight)
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            # a lone surrogate cannot go over HTTP as UTF-8
            messages, messages_json = _messages_json(messages)
            endpoint, model_name = _endpoints.resolve(model)
            if not model_name:
                model_name = await self._first_model(endpoint)
            if max_tokens is None and endpoint.local:
                # Uncapped, SmolLM2 ran to the end of its context (3,669 tokens) and the server
                # kept generating after the client gave up.
                max_tokens = LOCAL_MAX_TOKENS
            params = {k: v for k, v in (("temperature", temperature), ("seed", seed),
                                        ("max_tokens", max_tokens), ("schema", schema),
                                        ("tools", tools or None)) if v is not None}
            params_json = _params_json(params)
            key = cache_key(endpoint.identity, model_name, messages, params,
                            messages_json=messages_json, params_json=params_json)
            model_id = f"{endpoint.name}:{model_name}"
            log = {"endpoint": endpoint.identity, "model": model_id, "messages": messages,
                   "messages_json": messages_json, "params": params, "params_json": params_json,
                   "cache_key": key, "run_id": run_id, "node_id": node_id, "purpose": purpose}
            if cache:
                hit = await self._cache_get(state, key) if self._may_hit(state, key) else None
                if hit is not None:
                    call_id = await self._log(state, defer_log, {
                        **log, "response": hit, "cached": True,
                        "input_tokens": hit["input_tokens"], "output_tokens": hit["output_tokens"],
                        "error": hit.get("error")})
                    if hit.get("error"):
                        exc = _output_error(hit["error"], call_id, 0, 0, 0.0,
                                            hit.get("text") or "")
                        exc.cached = True   # a replayed failure: a retry needs another seed
                        raise exc
                    if on_text:
                        on_text(hit["text"])
                    return Reply(hit["text"], hit.get("data"), model_id, hit["input_tokens"],
                                 hit["output_tokens"], 0.0, 0.0, True, call_id,
                                 hit.get("finish_reason"), key, hit.get("tool_calls"))
            # a paid call whose answer could not be kept: refuse it first
            self.store.check_writable()
            # The embedded model's cap is the endpoint's own limit, like a remote model's: it is
            # not a parameter of the call, so it stays out of the cache key.
            limit = LOCAL_MAX_TOKENS if max_tokens is None and endpoint.local else max_tokens
            started = time.perf_counter()
            call = (endpoint, model_name, messages, schema, temperature, seed, limit, on_text,
                    tools or None)
            try:
                try:   # the first attempt without the retry loop's coroutine (most calls)
                    raw, attempts = await self._call_once(*call, state=state, on_wait=on_wait), 1
                except _Retryable as first:
                    raw, attempts = await self._call_with_retries(*call, first=first,
                                                                  on_wait=on_wait)
            except EndpointError as exc:
                self.store.log_call(**log, error=str(exc),
                                    latency_s=time.perf_counter() - started)
                raise
            latency = time.perf_counter() - started
            text, finish, tokens_in, tokens_out, tool_calls, cached_in = raw
            # an endpoint echoing the key: not kept, not passed on
            text = scrub(_valid_unicode(text))
            answer_chars = len(text) + (len(json.dumps(tool_calls)) if tool_calls else 0)
            tokens_in, tokens_out, by_size = self._usage(
                endpoint, model_name, (tokens_in, tokens_out), (_chars(messages), answer_chars))
            cached_in = _cached_count(cached_in, tokens_in, by_size)
            cost = _cost(endpoint, model_name, tokens_in, tokens_out, cached_in)
            data, error = None, None
            if schema is not None:
                try:
                    data = _valid_unicode(extract_json(text, finish_reason=finish))
                except ModelOutputError as exc:
                    error = str(exc)
            payload = {"text": text, "data": data, "finish_reason": finish,
                       "input_tokens": tokens_in, "output_tokens": tokens_out,
                       "attempts": attempts}
            if tool_calls:
                payload["tool_calls"] = tool_calls
            if by_size:
                payload["usage_by_size"] = True
            # A replay must meet the same answer, an unusable one included, not call again.
            cached = (payload if error is None else {**payload, "error": error}) if cache else None
            log.update(response=payload, input_tokens=tokens_in, output_tokens=tokens_out,
                       cached_tokens=cached_in, latency_s=latency, cost_usd=cost, error=error,
                       cache_payload=cached)
            call_id = await self._log(state, defer_log, log)
            if error is not None:
                raise _output_error(error, call_id, tokens_in, tokens_out, cost or 0.0, text)
            return Reply(text, data, model_id, tokens_in, tokens_out, latency, cost or 0.0, False,
                         call_id, finish, key, tool_calls or None, priced=cost is not None,
                         cached_tokens=cached_in)
        finally:
            state["active"] -= 1

    async def complete_whole(self, messages: list[dict] | str, *, continuations: int = 2,
                             **kwargs) -> Reply:
        """`complete`, then up to `continuations` calls that continue an answer which
        stopped at the token limit (finish_reason "length"); the texts are joined and the
        usage summed. `Reply.cut` says the answer is still unfinished after them: callers
        must never take such an answer as done.

        With a `schema`, a JSON answer cut off is continued as text and the joined text is
        parsed; if it still is not whole JSON, the error (`TruncatedError` when it is still
        cut) carries the summed usage, the joined text and the first call's id."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        schema = kwargs.get("schema")
        try:
            reply = await self.complete(messages, **kwargs)
        except TruncatedError as exc:
            if continuations <= 0:
                raise
            reply = Reply(exc.text, None, "", exc.input_tokens, exc.output_tokens, 0.0,
                          exc.cost_usd, bool(getattr(exc, "cached", False)), exc.call_id,
                          "length")
        if schema is not None and reply.data is not None:
            return reply   # whole JSON, even if the limit was reached right after it
        first, text, total = reply.call_id, reply.text, reply
        rest = None
        for n in range(1, max(0, int(continuations)) + 1):
            if reply.finish_reason != "length" or reply.tool_calls:
                break
            if rest is None:   # the rest is plain text
                rest = {k: v for k, v in kwargs.items() if k != "schema"}
            more = [*messages, {"role": "assistant", "content": text},
                    {"role": "user", "content": CONTINUE_PROMPT}]
            reply = await self.complete(more, **rest)
            text = join_continued(text, reply.text)
            total = Reply(text, None, reply.model, total.input_tokens + reply.input_tokens,
                          total.output_tokens + reply.output_tokens,
                          total.latency_s + reply.latency_s, total.cost_usd + reply.cost_usd,
                          total.cached and reply.cached, reply.call_id, reply.finish_reason,
                          reply.cache_key, None, n, priced=total.priced and reply.priced,
                          cached_tokens=total.cached_tokens + reply.cached_tokens)
        total.cut = total.finish_reason == "length"
        if schema is not None:
            try:
                total.data = _valid_unicode(extract_json(text, finish_reason=total.finish_reason))
            except ModelOutputError as exc:
                after = f" (after {total.continuations} continuations)" if total.continuations else ""
                raise _output_error(f"{exc}{after}", first, total.input_tokens,
                                    total.output_tokens, total.cost_usd, text) from None
        return total

    def complete_sync(self, messages: list[dict] | str, **kwargs) -> Reply:
        """`complete` for scripts; from inside a running loop it uses a worker thread."""
        return run_blocking(lambda: self.complete(messages, **kwargs), close=self.aclose)

    # -- embeddings -------------------------------------------------------------
    def embeddings_supported(self, model: str | None = None) -> bool | None:
        """Whether the endpoint of `model` embeds: True / False once known, None before."""
        endpoint, _ = _endpoints.resolve(model)
        return self._embeds.get(endpoint.identity)

    async def embed(self, texts: list[str] | str, *, model: str | None = None,
                    cache: bool = True, run_id: str | None = None,
                    purpose: str = "embed") -> list[list[float]]:
        """One vector per text from the endpoint's `/embeddings`, in order.

        Texts are cached one by one (endpoint, model, text), so only new ones are sent;
        each request is logged as a call, and a request answered wholly from the cache
        as one cached call. An endpoint that cannot embed raises
        `EmbeddingsUnsupportedError`, at once on later calls. Blank texts get [].
        """
        texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        endpoint, model_name = _endpoints.resolve(model)
        where = "the embedded model" if endpoint.local else endpoint.base_url
        if self._embeds.get(endpoint.identity) is False:
            raise EmbeddingsUnsupportedError(f"{where} has no /embeddings; use TF-IDF similarity")
        if not model_name:
            model_name = await self._first_model(endpoint)
        keys = {t: cache_key(endpoint.identity, model_name, [t], {"embed": True})
                for t in texts if t.strip()}
        found: dict[str, list[float]] = {}
        hits = self.store.cache_get_many(list(keys.values())) if cache else []
        for text, hit in zip(keys, hits):
            if hit is not None:
                found[text] = hit["vector"]
        missing = [t for t in keys if t not in found]
        log = dict(endpoint=endpoint.identity, model=f"{endpoint.name}:{model_name}",
                   messages=[{"role": "input", "content": t} for t in missing or list(keys)],
                   params={"embed": True}, run_id=run_id, purpose=purpose)
        if not missing:
            self.store.log_call(**log, response={"vectors": len(keys)}, cached=True)
            return [found.get(t, []) for t in texts]
        started, tokens = time.perf_counter(), 0
        try:
            for i in range(0, len(missing), _EMBED_BATCH):
                batch = missing[i:i + _EMBED_BATCH]
                vectors, used = await self._embed_with_retries(endpoint, model_name, batch)
                found.update(zip(batch, vectors))
                tokens += used
        except EndpointError as exc:
            self.store.log_call(**log, error=str(exc), latency_s=time.perf_counter() - started)
            raise
        self._embeds[endpoint.identity] = True
        self.store.log_call(**log, response={"vectors": len(missing)}, input_tokens=tokens,
                            latency_s=time.perf_counter() - started,
                            cost_usd=_cost(endpoint, model_name, tokens, 0))
        for text in missing if cache else ():
            self.store.cache_put(keys[text], {"vector": found[text]})
        return [found.get(t, []) for t in texts]

    def embed_sync(self, texts: list[str] | str, **kwargs) -> list[list[float]]:
        """`embed` for scripts and sync callers; inside a running loop it uses a worker thread."""
        return run_blocking(lambda: self.embed(texts, **kwargs), close=self.aclose)

    async def _embed_with_retries(self, endpoint: Endpoint, model: str, texts: list[str]):
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt, last))
            try:
                return await self._embed_once(endpoint, model, texts)
            except _Retryable as exc:
                last = exc
        where = "the embedded model" if endpoint.local else endpoint.base_url
        raise EndpointError(f"{where} /embeddings failed {self.max_retries + 1} times ({last}); "
                            "check that the server is up, or use TF-IDF similarity")

    async def _embed_once(self, endpoint: Endpoint, model: str, texts: list[str]):
        import openai

        client = await self._client(endpoint)
        try:
            async with self._slot(endpoint), asyncio.timeout(
                    None if endpoint.local else self.timeout):
                response = await client.embeddings.create(model=model, input=texts,
                                                          encoding_format="float")
        except TimeoutError:
            raise _Retryable(f"no answer within {self.timeout:g} s") from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status in _NO_EMBEDDINGS and not self._embeds.get(endpoint.identity):
                self._embeds[endpoint.identity] = False
                where = "the embedded model" if endpoint.local else endpoint.base_url
                raise EmbeddingsUnsupportedError(
                    f"{where} cannot embed with {model!r} (HTTP {status}: "
                    f"{' '.join(scrub(str(exc)).split())[:120]}); use TF-IDF similarity") from None
            raise _retryable(exc, self.timeout) or EndpointError(
                self._status_message(endpoint, model, exc)) from None
        except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError,
                AttributeError) as exc:
            raise _retryable(exc, self.timeout) from None
        data = sorted(getattr(response, "data", None) or [], key=lambda d: d.index)
        if len(data) != len(texts):
            raise _Retryable(f"{len(data)} vectors for {len(texts)} texts")
        used = self._usage(endpoint, model, (getattr(getattr(response, "usage", None),
                                                     "prompt_tokens", None), 0),
                           (sum(len(t) for t in texts), 0))[0]
        return [[float(x) for x in d.embedding] for d in data], used

    def _usage(self, endpoint: Endpoint, model: str, reported: tuple,
               chars: tuple[int, int]) -> tuple[int, int, bool]:
        """(input tokens, output tokens, priced by size): each reported count when it could
        be true (`_token_count`), else the request's or the answer's characters / 4; said
        once per model when that is what prices its calls."""
        counts = [_token_count(r, c) for r, c in zip(reported, chars)]
        if None not in counts:
            return counts[0], counts[1], False
        model_id = f"{endpoint.name}:{model}"
        price = price_of(model, local=endpoint.local)
        if price and any(price) and model_id not in self._by_size:
            self._by_size.add(model_id)
            print(f"flowmagic: {model_id} reported usage that is not a count of tokens "
                  f"(prompt_tokens={reported[0]!r:.30}, completion_tokens={reported[1]!r:.30}): "
                  "its calls are priced by their size (characters / 4) instead", file=sys.stderr)
        return (*(_by_size(c) if n is None else n for n, c in zip(counts, chars)), True)

    async def _first_model(self, endpoint: Endpoint) -> str:
        client = await self._client(endpoint)
        try:
            page = await client.models.list()
            # a listed id is untrusted: only a model name of the safe alphabet is used
            ids = discovery.model_ids(endpoint.base_url, [m.id for m in page.data])
        except Exception as exc:  # any failure here means: tell the user to name one
            raise ConfigError(
                f"no model named for {endpoint.base_url} and listing its models failed "
                f"({scrub(str(exc))}); "
                "set FLOWMAGIC_MODEL or configure(model=...)") from None
        if not ids:
            raise ConfigError(f"{endpoint.base_url} lists no models; set FLOWMAGIC_MODEL")
        endpoint.model = ids[0]
        return ids[0]

    def tool_mode(self, model: str | None = None) -> str:
        """"native" (OpenAI `tools`) or "action" (a JSON action protocol) for this endpoint.

        The embedded llama.cpp server accepts `tools` but its chat template ignores them,
        so it starts on "action"; others start on "native" until they refuse `tools`.
        """
        endpoint, _ = _endpoints.resolve(model)
        return self._tool_modes.get(endpoint.identity, "action" if endpoint.local else "native")

    async def _call_with_retries(self, endpoint, model, messages, schema, temperature, seed,
                                 max_tokens, on_text, tools=None, *,
                                 first: Exception | None = None, on_wait=None):
        """The call with its retries; `first` is the first attempt's error when the caller
        made that attempt itself (then the retries follow it)."""
        last: Exception | None = first
        for attempt in range(0 if first is None else 1, self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt, last))
            try:
                return await self._call_once(endpoint, model, messages, schema, temperature,
                                             seed, max_tokens, on_text, tools,
                                             on_wait=on_wait), attempt + 1
            except _Retryable as exc:
                last = exc
        if endpoint.self_hosted:   # it answered, so it is up: what it said is the news
            raise EndpointError(f"{_where(endpoint)} failed {self.max_retries + 1} times "
                                f"({last}); see its log, then re-run")
        where = "the embedded model" if endpoint.local else endpoint.base_url
        raise EndpointError(
            f"{where} failed {self.max_retries + 1} times ({last}); "
            "check that the server is up and the model name is right, then re-run")

    def _backoff(self, attempt: int, error: Exception | None) -> float:
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        delay = random.uniform(ceiling / 2, ceiling)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, min(retry_after, 60.0))
        return delay

    async def _call_once(self, endpoint, model, messages, schema, temperature, seed,
                         max_tokens, on_text, tools=None, *, state: dict | None = None,
                         on_wait=None):
        import openai

        state = state or self._state()   # (this loop's, when the caller has it)
        client = self._client_now(endpoint, state)
        if client is None:
            client = await self._client(endpoint)
        mode = self._modes.get(endpoint.identity, "json_object" if endpoint.local
                               else "json_schema") if schema is not None else None
        while True:
            kwargs = self._request(model, messages, schema, mode, temperature, seed, max_tokens)
            if tools:
                kwargs["tools"] = tools
            # The transport's timeout bounds each read; `whole` bounds the whole answer, so
            # an endpoint trickling bytes cannot hold a call past `timeout`. The embedded
            # server is ours: slow there is a busy machine, not a trick.
            whole = None if endpoint.local else self.timeout
            try:
                if endpoint.self_hosted:
                    return await self._send_local(endpoint, state, client, kwargs, on_text,
                                                  on_wait)
                slot = self._slot(endpoint, state)
                if on_text is None and isinstance(slot, asyncio.Semaphore):
                    # The usual case, the process-wide cap alone: taken and given back
                    # without a context manager's two coroutines (as `_send` does, inline).
                    await slot.acquire()
                    try:
                        return _completion(await self._transport.post_json(
                            client, "/chat/completions", kwargs, whole=whole))
                    finally:
                        slot.release()
                async with slot:
                    if on_text is None:   # the transport's own timer bounds it: no second one
                        return await self._send(client, kwargs, None, whole)
                    async with asyncio.timeout(whole):
                        return await self._send(client, kwargs, on_text)
            except TimeoutError:
                raise _Retryable(f"no answer within {self.timeout:g} s") from None
            except openai.APIStatusError as exc:
                status = exc.status_code
                if tools and status in (400, 422, 500, 501):
                    self._tool_modes[endpoint.identity] = "action"
                    raise ToolsUnsupportedError(
                        f"{endpoint.base_url} refused function calling (HTTP {status}); "
                        "flowmagic uses its JSON action protocol there from now on") from None
                if mode in ("json_schema", "json_object") and status in (400, 422, 500, 501):
                    mode = _MODES[_MODES.index(mode) + 1]   # try the next structured mode
                    self._modes[endpoint.identity] = mode
                    continue
                raise _retryable(exc, self.timeout) or EndpointError(
                    self._status_message(endpoint, model, exc)) from None
            except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError,
                    AttributeError) as exc:
                raise _retryable(exc, self.timeout) from None

    @staticmethod
    def _status_message(endpoint: Endpoint, model: str, exc) -> str:
        where = "the embedded model" if endpoint.local else endpoint.base_url
        if exc.status_code in (401, 403):
            env = endpoint.key_env or "FLOWMAGIC_API_KEY"
            return f"{where} refused the API key (HTTP {exc.status_code}); check {env}"
        if exc.status_code == 404:
            return (f"{where} has no model {model!r} (HTTP 404); "
                    "check the model name with `%flow models` or FLOWMAGIC_MODEL")
        # Some endpoints and proxies quote the request's headers back: the key leaves here.
        said = " ".join(scrub(str(exc)).split())
        return f"{where} rejected the request (HTTP {exc.status_code}): {said[:200]}"

    @staticmethod
    def _request(model, messages, schema, mode, temperature, seed, max_tokens) -> dict:
        kwargs: dict[str, Any] = {"model": model, "messages": messages}
        if temperature is not None:
            kwargs["temperature"] = temperature
        if seed is not None:
            kwargs["seed"] = seed
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if schema is not None:
            kwargs["messages"] = _with_schema_note(messages, schema)
            if mode == "json_schema":
                kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": schema}}
            elif mode == "json_object":
                kwargs["response_format"] = {"type": "json_object", "schema": schema}
        return kwargs

    async def _send(self, client, kwargs: dict, on_text,
                    whole: float | None = None) -> tuple[str, str | None, Any, Any, list, Any]:
        """The reply as (text, finish reason, input tokens, output tokens, tool calls, cached
        input tokens), from
        the JSON as it came (no pydantic models); a malformed body raises ValueError.
        Without `on_text`, `whole` bounds the whole answer (the caller bounds a stream).

        A streamed reply (only when someone watches the text: `on_text`, which the notebook
        panel sets for every node) has its text joined here, and its tool calls (ids, names,
        argument fragments, in pieces keyed by index) by the SDK's `ChatCompletionStreamState`,
        fed only the chunks that carry them: the SDK's objects cost ~0.2-0.9 ms a chunk
        (issue 17's note) against ~0.03 ms for the text read by hand."""
        if on_text is None:
            return _completion(await self._transport.post_json(
                client, "/chat/completions", kwargs, whole=whole))
        reader = _StreamReader(on_text)
        async with contextlib.aclosing(self._transport.post_stream(
                client, "/chat/completions", {**kwargs, **_WITH_USAGE})) as events:
            async for chunk in events:
                reader.take(chunk)
        return reader.answer()

    async def _send_local(self, endpoint: Endpoint, state: dict, client, kwargs: dict,
                          on_text, on_wait) -> tuple[str, str | None, Any, Any, list, Any]:
        """The answer of a local server (see the module docstring): a place in our queue for
        it, then the streamed answer, timed on its progress."""
        import openai

        queue = await self._queue(endpoint, state, client)
        await queue.enter(on_wait)
        try:
            async with self._slot(endpoint, state):
                ahead = queue.running - 1
                reader = _StreamReader(on_text)
                events = self._transport.post_stream(client, "/chat/completions",
                                                     {**kwargs, **_WITH_USAGE}, patient=True)
                try:
                    await follow(events, reader.take, first_token_s=self.first_token_s,
                                 stall_s=self.stall_s, answer_s=self.answer_s)
                except NoProgress as exc:   # not sent again: it would queue behind itself
                    raise EndpointError(exc.line(_where(endpoint), ahead)) from None
                except openai.APIConnectionError as exc:
                    if _refused(exc):   # nothing listens: retrying cannot help
                        raise EndpointError(
                            f"cannot connect to {_where(endpoint)} (connection refused): start "
                            "the server, or check its address (FLOWMAGIC_BASE_URL or "
                            "configure(base_url=...))") from None
                    raise
        finally:
            queue.leave()
        answer = reader.answer()
        if answer[1] is None and not answer[4]:
            raise _Retryable(f"{_where(endpoint)} ended the answer before it was finished (a "
                             "llama-cpp-python server does when another client's request "
                             "comes: start it with --interrupt_requests False)")
        return answer

    async def _queue(self, endpoint: Endpoint, state: dict, client) -> _queue.ServerQueue:
        """This loop's queue for a local server (its slots asked once per process)."""
        queues = state.setdefault("queues", {})
        queue = queues.get(endpoint.identity)
        if queue is None:
            slots = await asyncio.to_thread(_queue.slots_of, endpoint, client.base)
            queue = queues.setdefault(endpoint.identity, _queue.ServerQueue(slots))
        return queue


_WITH_USAGE = {"stream_options": {"include_usage": True}}


def _where(endpoint: Endpoint) -> str:
    return "the embedded model's server" if endpoint.local else f"the server at {endpoint.base_url}"


def _refused(exc: Exception) -> bool:
    """Whether a connection error is a refused connection (somewhere in its causes)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ConnectionRefusedError) or "connection refused" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _StreamReader:
    """A streamed chat completion, joined from its chunks: the text by hand, passed on to
    `on_text` as it comes, the tool calls by `_ToolCallPieces`."""

    __slots__ = ("on_text", "parts", "finish", "tokens_in", "tokens_out", "cached", "calls")

    def __init__(self, on_text):
        self.on_text = on_text
        self.parts: list[str] = []
        # the usage as reported, None when the stream has none (`LLM._usage` checks it)
        self.finish, self.tokens_in, self.tokens_out, self.cached = None, None, None, None
        self.calls: _ToolCallPieces | None = None

    def take(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise ValueError("a streamed event is not a chat completion chunk")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.tokens_in, self.tokens_out, self.cached = _tokens(usage, chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise ValueError("a streamed event is not a chat completion chunk")
        for choice in choices[:1]:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.parts.append(delta["content"])
                if self.on_text is not None:
                    self.on_text(delta["content"])
            if delta.get("tool_calls"):
                self.calls = self.calls or _ToolCallPieces()
                self.calls.add(chunk, choice, delta["tool_calls"])
            self.finish = choice.get("finish_reason") or self.finish

    def answer(self) -> tuple[str, str | None, Any, Any, list, Any]:
        """(text, finish reason, input tokens, output tokens, tool calls, cached input
        tokens)."""
        return ("".join(self.parts), self.finish, self.tokens_in, self.tokens_out,
                self.calls.calls() if self.calls else [], self.cached)


class _ToolCallPieces:
    """The tool calls of a streamed reply, joined by the SDK's `ChatCompletionStreamState`
    from the chunks that carry their pieces (the text of the reply is joined by hand)."""

    def __init__(self):
        from openai.lib.streaming.chat import ChatCompletionStreamState
        from openai.types.chat import ChatCompletionChunk

        self._state, self._kind = ChatCompletionStreamState(), ChatCompletionChunk

    def add(self, chunk: dict, choice: dict, pieces: Any) -> None:
        only = {**chunk, "choices": [{**choice, "delta": {"tool_calls": pieces}}]}
        try:
            self._state.handle_chunk(_sdk_chunk(self._kind, only))
        except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:
            raise ValueError(f"a streamed event is not a chat completion chunk ({exc})") from None

    def calls(self) -> list[dict]:
        choices = self._state.current_completion_snapshot.choices
        return [{"id": call.id or f"call_{i}", "type": "function",
                 "function": {"name": call.function.name or "",
                              "arguments": call.function.arguments or ""}}
                for i, call in enumerate((choices[0].message.tool_calls or []) if choices else [])]


def _sdk_chunk(kind, chunk: dict):
    """The SDK's object of a streamed chunk: validated (pydantic's core, the fast way), or
    built as it is when a server leaves out a field the SDK requires (`created`, `id`)."""
    from pydantic import ValidationError

    try:
        return kind.model_validate(chunk)
    except ValidationError:
        return kind.construct(**chunk)


def _tokens(usage: Any, body: dict) -> tuple[Any, Any, Any]:
    """The usage counts as reported (None when missing): prompt, completion and cached
    prompt tokens; `LLM._usage` checks them. Cached ones as OpenAI (and vLLM) report them,
    `prompt_tokens_details.cached_tokens`, or as DeepSeek (`prompt_cache_hit_tokens`) and
    llama.cpp's own server (`timings.cache_n`, beside the usage) do."""
    if not isinstance(usage, dict):
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("prompt_cache_hit_tokens")
    if cached is None and isinstance(body.get("timings"), dict):
        cached = body["timings"].get("cache_n")
    return usage.get("prompt_tokens"), usage.get("completion_tokens"), cached


def _completion(body: Any) -> tuple[str, str | None, Any, Any, list, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise ValueError("the body is not a chat completion")
    choice = body["choices"][0]
    message = choice.get("message") or {}
    calls = [{"id": c.get("id"), "type": "function",
              "function": {"name": c["function"].get("name"),
                           "arguments": c["function"].get("arguments") or ""}}
             for c in message.get("tool_calls") or [] if isinstance(c.get("function"), dict)]
    tokens_in, tokens_out, cached = _tokens(body.get("usage"), body)
    return (message.get("content") or "", choice.get("finish_reason"), tokens_in, tokens_out,
            calls, cached)


async def _close_with_loop(llm: LLM, loop: asyncio.AbstractEventLoop):
    """An async generator that lives as long as `loop`: the loop closes it in
    `shutdown_asyncgens()` (asyncio.run does so before closing), and then it closes the
    LLM's clients of that loop and forgets the loop's state."""
    try:
        yield
    finally:
        state = llm._per_loop.pop(loop, None)
        if llm._last is not None and llm._last[1] is state:
            llm._last = None
        if state is not None:
            await llm._close_clients(state)


def _arm(closer) -> Any:
    """Start `closer` on the running loop, so the loop's first-iteration hook registers it."""
    step = closer.asend(None)
    try:
        step.send(None)
    except StopIteration:
        pass
    return closer


def _finish(closer) -> None:
    """Finish a started closer outside its loop (that loop is closed or gone), so that its
    collection does not schedule an `aclose()` on a closed loop."""
    step = closer.aclose()
    try:
        step.send(None)
    except (StopIteration, RuntimeError, GeneratorExit):
        pass
    else:
        step.close()


_live: "weakref.WeakSet[LLM]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for llm in list(_live):
        llm._close_abandoned()


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
