"""The HTTP under the LLM door: which client the openai SDK sends with, and the raw calls.

The SDK stays the door's HTTP layer (its status errors, timeouts and connection errors
are what users see), but the hot path avoids what a wide fan-out pays per request:
- the pool: with `aiohttp` installed (the `openai[aiohttp]` extra) requests go through
  the SDK's `DefaultAioHttpClient`, whose connector hands out a kept-alive connection in
  O(1); httpx's pool rescans every connection on each request and close, which on a
  500-wide fan-out cost more CPU than everything else in the client;
- the request transform and the reply models: `post` with `cast_to=object` sends the
  body as it is and returns the JSON as plain dicts (no pydantic models per reply);
- the TLS set-up: one SSL context per process, not one per client (~20 ms each, and the
  door builds a client per event loop).

`LLM(transport=...)` takes another `Transport` (the benchmark's zero-latency stand-in
replaces the HTTP call and nothing else).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, AsyncIterator

__all__ = ["Transport", "aiohttp_available"]

# The door's own caps decide how many requests run at once, not the pool (aiohttp's
# connector would cap at 100 when given no limit).
_CONNECTIONS = 100_000
_KEEPALIVE = 1000


@functools.lru_cache(maxsize=1)
def aiohttp_available() -> bool:
    try:
        import aiohttp  # noqa: F401
        from openai import DefaultAioHttpClient
        DefaultAioHttpClient  # noqa: B018 - the name exists from openai 1.8x on
    except ImportError:
        return False
    return True


def _httpx():
    """The httpx module the installed SDK is built on (httpx2 in openai 3.x, httpx before)."""
    import openai
    base = openai.DefaultAsyncHttpxClient.__mro__[1]   # httpx's AsyncClient
    return importlib.import_module(base.__module__.split(".")[0])


@functools.lru_cache(maxsize=1)
def _ssl_context():
    return _httpx().create_ssl_context()


class Transport:
    """How the LLM door reaches an endpoint: the openai SDK's client, and two raw calls."""

    def client(self, base_url: str, api_key: str, timeout: float):
        """An AsyncOpenAI for one endpoint on the running loop, with no SDK retries (the
        door retries, with its own backoff and Retry-After handling)."""
        import openai

        httpx = _httpx()
        options: dict[str, Any] = {"timeout": timeout, "verify": _ssl_context(),
                                   "limits": httpx.Limits(max_connections=_CONNECTIONS,
                                                          max_keepalive_connections=_KEEPALIVE)}
        if aiohttp_available():
            http_client = openai.DefaultAioHttpClient(**options)
        else:
            http_client = openai.DefaultAsyncHttpxClient(**options)
        return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                  timeout=timeout, http_client=http_client)

    async def post_json(self, client, path: str, body: dict) -> Any:
        """POST `body` as it is; the reply's JSON as plain Python values. HTTP failures
        raise the SDK's errors (APIStatusError, APITimeoutError, APIConnectionError)."""
        return await client.post(path, body=body, cast_to=object)

    async def post_stream(self, client, path: str, body: dict) -> AsyncIterator[Any]:
        """POST `body` with `stream: true`; each server-sent event's JSON as plain values."""
        from openai import AsyncStream

        stream = await client.post(path, body={**body, "stream": True}, cast_to=object,
                                   stream=True, stream_cls=AsyncStream[object])
        async for event in stream:
            yield event
