"""Chat calls: one completion (cached, logged, retried, streamed when someone watches),
an answer cut at the token limit continued, and a local server's calls queued and timed on
their progress (see `client`'s docstring for the whole contract)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from . import endpoints as _endpoints
from . import queue as _queue
from .cache_keys import cache_key, dump_messages, dump_params, valid_unicode
from .connections import Connections
from .endpoints import Endpoint, scrub
from .failures import (Retryable, ToolsUnsupportedError, output_error, refused, retryable,
                       server_where, status_message)
from .progress import NoProgress, follow
from .usage import cached_count, call_cost, checked_usage, request_chars
from .wire import WITH_USAGE, StreamReader, read_completion, request_body
from ..errors import EndpointError, ModelOutputError, TruncatedError
from .._internal.aio import run_blocking
from ..json_extract import extract_json, join_continued

__all__ = ["ChatCalls", "Reply", "LOCAL_MAX_TOKENS", "CONTINUE_PROMPT"]

# The embedded model rambles until it is stopped, so every call on it is capped (a caller
# may lower the cap); a configured endpoint gets the model's own limit unless the caller
# names one.
LOCAL_MAX_TOKENS = 512
CONTINUE_PROMPT = ("Your answer stopped at the length limit. Continue it exactly where it "
                   "stopped, mid-word if need be: no repetition, no preamble, no apology.")

_MODES = ("json_schema", "json_object", "text")


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


class ChatCalls(Connections):
    """The chat half of `LLM`."""

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
            messages, messages_json = dump_messages(   # (a lone surrogate cannot go over HTTP)
                [{"role": "user", "content": messages}] if isinstance(messages, str) else messages)
            endpoint, model_name = _endpoints.resolve(model)
            if not model_name:
                model_name = await self._first_model(endpoint)
            if max_tokens is None and endpoint.local:
                # Uncapped, SmolLM2 ran to the end of its context (3,669 tokens) and the server
                # kept generating after the client gave up.
                max_tokens = LOCAL_MAX_TOKENS
            log = _log_row(endpoint, model_name, messages, messages_json,
                           (temperature, seed, max_tokens, schema, tools), run_id, node_id, purpose)
            if cache and self._may_hit(state, log["cache_key"]):
                hit = await self._cache_get(state, log["cache_key"])
                if hit is not None:
                    call_id = await self._log(state, defer_log, _hit_row(log, hit))
                    return _replayed(hit, call_id, log, on_text)
            # a paid call whose answer could not be kept: refuse it first
            self.store.check_writable()
            call, started = (endpoint, model_name, messages, schema, temperature, seed, max_tokens,
                             on_text, tools or None), time.perf_counter()
            try:
                try:   # the first attempt without the retry loop's coroutine (most calls)
                    raw, attempts = await self._call_once(*call, state=state, on_wait=on_wait), 1
                except Retryable as first:
                    raw, attempts = await self._call_with_retries(*call, first=first,
                                                                  on_wait=on_wait)
            except EndpointError as exc:
                self.store.log_call(**log, error=str(exc), latency_s=time.perf_counter() - started)
                raise
            reply, error = self._answer(raw, attempts, time.perf_counter() - started, call, log, cache)
            reply.call_id = await self._log(state, defer_log, log)
            if error is not None:
                raise _failed(reply, error)
            return reply
        finally:
            state["active"] -= 1

    def _answer(self, raw: tuple, attempts: int, latency: float, call: tuple, log: dict,
                cache: bool) -> tuple[Reply, str | None]:
        """The reply to a call that was answered (its `call_id` still None) and the error
        when the answer is not the JSON asked for; `log` gets the call's row: its payload is
        what a replay meets, an unusable answer included."""
        endpoint, model_name, messages, schema = call[:4]
        text, finish, tokens_in, tokens_out, tool_calls, cached_in = raw
        # an endpoint echoing the key: not kept, not passed on
        text = scrub(valid_unicode(text))
        answer_chars = len(text) + (len(json.dumps(tool_calls)) if tool_calls else 0)
        tokens_in, tokens_out, by_size = checked_usage(
            endpoint, model_name, (tokens_in, tokens_out),
            (request_chars(messages), answer_chars), self._by_size)
        cached_in = cached_count(cached_in, tokens_in, by_size)
        cost = call_cost(endpoint, model_name, tokens_in, tokens_out, cached_in)
        data, error = None, None
        if schema is not None:
            try:
                data = valid_unicode(extract_json(text, finish_reason=finish))
            except ModelOutputError as exc:
                error = str(exc)
        payload = {"text": text, "data": data, "finish_reason": finish,
                   "input_tokens": tokens_in, "output_tokens": tokens_out, "attempts": attempts}
        if tool_calls:
            payload["tool_calls"] = tool_calls
        if by_size:
            payload["usage_by_size"] = True
        # A replay must meet the same answer, an unusable one included, not call again.
        cached = (payload if error is None else {**payload, "error": error}) if cache else None
        log.update(response=payload, input_tokens=tokens_in, output_tokens=tokens_out,
                   cached_tokens=cached_in, latency_s=latency, cost_usd=cost, error=error,
                   cache_payload=cached)
        return Reply(text, data, log["model"], tokens_in, tokens_out, latency, cost or 0.0, False,
                     None, finish, log["cache_key"], tool_calls or None, priced=cost is not None,
                     cached_tokens=cached_in), error

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
                total.data = valid_unicode(extract_json(text, finish_reason=total.finish_reason))
            except ModelOutputError as exc:
                after = f" (after {total.continuations} continuations)" if total.continuations else ""
                raise output_error(f"{exc}{after}", first, total.input_tokens,
                                    total.output_tokens, total.cost_usd, text) from None
        return total

    def complete_sync(self, messages: list[dict] | str, **kwargs) -> Reply:
        """`complete` for scripts; from inside a running loop it uses a worker thread."""
        return run_blocking(lambda: self.complete(messages, **kwargs), close=self.aclose)

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
            except Retryable as exc:
                last = exc
        if endpoint.self_hosted:   # it answered, so it is up: what it said is the news
            raise EndpointError(f"{server_where(endpoint)} failed {self.max_retries + 1} "
                                f"times ({last}); see its log, then re-run")
        where = "the embedded model" if endpoint.local else endpoint.base_url
        raise EndpointError(
            f"{where} failed {self.max_retries + 1} times ({last}); "
            "check that the server is up and the model name is right, then re-run")

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
            kwargs = request_body(model, messages, schema, mode, temperature, seed, max_tokens)
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
                        return read_completion(await self._transport.post_json(
                            client, "/chat/completions", kwargs, whole=whole))
                    finally:
                        slot.release()
                async with slot:
                    if on_text is None:   # the transport's own timer bounds it: no second one
                        return await self._send(client, kwargs, None, whole)
                    async with asyncio.timeout(whole):
                        return await self._send(client, kwargs, on_text)
            except TimeoutError:
                raise Retryable(f"no answer within {self.timeout:g} s") from None
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
                raise retryable(exc, self.timeout) or EndpointError(
                    status_message(endpoint, model, exc)) from None
            except (openai.APIConnectionError, openai.APIResponseValidationError, ValueError,
                    AttributeError) as exc:
                raise retryable(exc, self.timeout) from None

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
            return read_completion(await self._transport.post_json(
                client, "/chat/completions", kwargs, whole=whole))
        reader = StreamReader(on_text)
        async with contextlib.aclosing(self._transport.post_stream(
                client, "/chat/completions", {**kwargs, **WITH_USAGE})) as events:
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
                reader = StreamReader(on_text)
                events = self._transport.post_stream(client, "/chat/completions",
                                                     {**kwargs, **WITH_USAGE}, patient=True)
                try:
                    await follow(events, reader.take, first_token_s=self.first_token_s,
                                 stall_s=self.stall_s, answer_s=self.answer_s)
                except NoProgress as exc:   # not sent again: it would queue behind itself
                    raise EndpointError(exc.line(server_where(endpoint), ahead)) from None
                except openai.APIConnectionError as exc:
                    if refused(exc):   # nothing listens: retrying cannot help
                        raise EndpointError(
                            f"cannot connect to {server_where(endpoint)} (connection refused): "
                            "start the server, or check its address (FLOWMAGIC_BASE_URL or "
                            "configure(base_url=...))") from None
                    raise
        finally:
            queue.leave()
        answer = reader.answer()
        if answer[1] is None and not answer[4]:
            raise Retryable(f"{server_where(endpoint)} ended the answer before it was finished "
                            "(a llama-cpp-python server does when another client's request "
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


def _log_row(endpoint: Endpoint, model_name: str, messages: list, messages_json: str,
             asked: tuple, run_id, node_id, purpose) -> dict:
    """A call's log row as far as it is known before the call (`Store.log_call`'s keyword
    arguments), its cache key included; `asked` is (temperature, seed, max_tokens, schema,
    tools), of which those given are the call's parameters."""
    temperature, seed, max_tokens, schema, tools = asked
    params = {k: v for k, v in (("temperature", temperature), ("seed", seed),
                                ("max_tokens", max_tokens), ("schema", schema),
                                ("tools", tools or None)) if v is not None}
    params_json = dump_params(params)
    key = cache_key(endpoint.identity, model_name, messages, params,
                    messages_json=messages_json, params_json=params_json)
    return {"endpoint": endpoint.identity, "model": f"{endpoint.name}:{model_name}",
            "messages": messages, "messages_json": messages_json, "params": params,
            "params_json": params_json, "cache_key": key, "run_id": run_id, "node_id": node_id,
            "purpose": purpose}


def _hit_row(log: dict, hit: dict) -> dict:
    return {**log, "response": hit, "cached": True, "input_tokens": hit["input_tokens"],
            "output_tokens": hit["output_tokens"], "error": hit.get("error")}


def _failed(reply: Reply, error: str) -> Exception:
    """The error of an answered call whose answer is not the JSON asked for."""
    return output_error(error, reply.call_id, reply.input_tokens, reply.output_tokens,
                        reply.cost_usd, reply.text)


def _replayed(hit: dict, call_id, log: dict, on_text) -> Reply:
    """The reply a cache hit gives, or its replayed failure raised."""
    if hit.get("error"):
        exc = output_error(hit["error"], call_id, 0, 0, 0.0, hit.get("text") or "")
        exc.cached = True   # a replayed failure: a retry needs another seed
        raise exc
    if on_text:
        on_text(hit["text"])
    return Reply(hit["text"], hit.get("data"), log["model"], hit["input_tokens"],
                 hit["output_tokens"], 0.0, 0.0, True, call_id, hit.get("finish_reason"),
                 log["cache_key"], hit.get("tool_calls"))
