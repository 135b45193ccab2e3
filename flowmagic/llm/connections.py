"""What an `LLM` holds to reach its endpoints: per event loop, its HTTP clients, the
semaphores that cap requests (process-wide, per endpoint, a requests-per-minute pace, a
caller's gate) and the store reads and writes of one loop turn, batched; their closing when
the loop ends or the process exits; the backoff between attempts and an endpoint's first
model, which chat and embedding calls share. httpx clients and semaphores belong to one
loop, so each loop gets its own."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import random
import time
import weakref
from typing import Any, Awaitable, Callable

from . import discovery
from .endpoints import Endpoint, resolve, scrub
from ..errors import ConfigError, FlowError
from ..store import Store, get_store

__all__ = ["Connections"]


class Connections:
    """The connection half of `LLM` (`client.LLM.__init__` sets the attributes it reads)."""

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

    def warm(self, model: str | None = None) -> None:
        """Have what the first call to `model` waits for start now, in the background: the
        embedded server, when `model` is served by it (a flow calls this before it is planned;
        see `local.start_soon`). A model that cannot be resolved is left to that call to
        report."""
        try:
            endpoint = resolve(model)[0]
        except FlowError:
            return
        if endpoint.local:
            from .local import start_soon
            start_soon()

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

    # -- what chat and embedding calls share --------------------------------------
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

    def _backoff(self, attempt: int, error: Exception | None) -> float:
        ceiling = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        delay = random.uniform(ceiling / 2, ceiling)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, min(retry_after, 60.0))
        return delay


async def _close_with_loop(llm: "Connections", loop: asyncio.AbstractEventLoop):
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


_live: "weakref.WeakSet[Connections]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for llm in list(_live):
        llm._close_abandoned()
