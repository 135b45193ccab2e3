"""The HTTP under the LLM door: the client for an endpoint, and the hot path's raw POST.

The openai SDK stays the door's HTTP layer for what is not per node (listing models,
embeddings, streamed answers), and its error classes are what callers see everywhere.
A plain completion, the call a run makes once per node, skips what the SDK does per
request that a wide fan-out cannot afford on one core: building an options model and
request headers, transforming the body against the SDK's types, httpx's pool (which
rescans every connection on each request and close), and pydantic models of the reply.
The body goes out through `http1.Http1` (httptools' parser under asyncio, one per
client): half aiohttp's CPU and objects per request, measured. An endpoint reached
through a proxy (HTTP(S)_PROXY) goes through one aiohttp session per client instead (the
`openai[aiohttp]` extra, a dependency of flowmagic); without httptools and aiohttp, the
SDK's `post`. Both pools hand out a kept-alive connection in O(1). Failures become the
SDK's errors: `APIStatusError` subclasses built by the SDK's own client from the status,
headers and body, `APITimeoutError`, `APIConnectionError`.

One SSL context per process, not one per client (~20 ms each, and the door builds a
client per event loop). `LLM(transport=...)` takes another `Transport`: the benchmark's
zero-latency stand-in replaces the HTTP call and nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
from typing import Any, AsyncIterator

from . import http1

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


class Client:
    """The SDK's AsyncOpenAI for one endpoint on one loop (attributes such as `models` and
    `embeddings` are its own), plus the aiohttp session of the hot path."""

    def __init__(self, sdk, timeout: float):
        self.sdk = sdk
        self.timeout = timeout
        self.base = str(sdk.base_url).rstrip("/")
        headers = {**sdk.default_headers, **sdk.auth_headers}
        self.headers = {k: v for k, v in headers.items() if isinstance(v, str)}
        self.proxy = _env_proxy(self.base)
        self._session = None
        self._http1: Any = None   # http1.Http1, built on first use; False: not usable here

    def __getattr__(self, name: str):
        return getattr(self.sdk, name)

    def session(self):
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=_ssl_context()),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                              sock_read=self.timeout))
        return self._session

    def http1(self):
        """The lean HTTP/1.1 client of the hot path, or None where it does not apply: no
        httptools, a proxy to go through, or headers it refuses (aiohttp then says why)."""
        if self._http1 is None:
            self._http1 = False
            if self.proxy is None and http1.available():
                try:
                    self._http1 = http1.Http1(self.base, self.headers, self.timeout,
                                              _ssl_context())
                except ValueError:
                    pass
        return self._http1 or None

    async def close(self) -> None:
        lean, self._http1 = self._http1, None
        if lean:
            await lean.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        await self.sdk.close()

    def abandon(self) -> None:
        """Close the client after its event loop has closed (at process exit): the sessions
        are marked closed without that loop, and their sockets end with the process."""
        try:
            asyncio.run(self.close())
        except Exception:   # noqa: BLE001 - at exit, closing is best effort
            pass


class Transport:
    """How the LLM door reaches an endpoint: a `Client`, and two raw calls."""

    def client(self, base_url: str, api_key: str, timeout: float) -> Client:
        """A client for one endpoint on the running loop, with no SDK retries (the door
        retries, with its own backoff and Retry-After handling)."""
        import openai

        httpx = _httpx()
        options: dict[str, Any] = {"timeout": timeout, "verify": _ssl_context(),
                                   "limits": httpx.Limits(max_connections=_CONNECTIONS,
                                                          max_keepalive_connections=_KEEPALIVE)}
        http_client = (openai.DefaultAioHttpClient(**options) if aiohttp_available()
                       else openai.DefaultAsyncHttpxClient(**options))
        return Client(openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                         timeout=timeout, http_client=http_client), timeout)

    async def post_json(self, client: Client, path: str, body: dict, *,
                        whole: float | None = None) -> Any:
        """POST `body` as it is; the reply's JSON as plain Python values. `whole` bounds the
        whole answer in seconds (TimeoutError, or the SDK's APITimeoutError, past it).
        Failures raise the SDK's errors (APIStatusError and its subclasses, APITimeoutError,
        APIConnectionError); a body that is not JSON raises ValueError."""
        import openai

        url = client.base + path
        lean = client.http1()
        if lean is None:
            async with asyncio.timeout(whole):
                return await self._post_library(client, path, url, body)
        _log.debug("Sending HTTP Request: POST %s", url)
        try:
            status, head, content = await lean.post(path, json.dumps(body).encode(),
                                                    whole=whole)
        except TimeoutError as exc:
            raise openai.APITimeoutError(request=_request(url)) from exc
        except OSError as exc:   # refused, reset, closed early, TLS, not HTTP
            raise openai.APIConnectionError(request=_request(url)) from exc
        _log.debug("HTTP Response: POST %s %d", url, status)
        if status >= 400:
            raise _status_error(client, url, status, content, http1.header_pairs(head))
        return json.loads(content)

    async def _post_library(self, client: Client, path: str, url: str, body: dict) -> Any:
        """`post_json` through aiohttp (an endpoint behind a proxy), or the SDK's `post`."""
        if not aiohttp_available():
            return await client.sdk.post(path, body=body, cast_to=object)
        import aiohttp
        import openai

        _log.debug("Sending HTTP Request: POST %s", url)
        try:
            async with client.session().post(url, data=json.dumps(body).encode(),
                                             headers=client.headers,
                                             proxy=client.proxy) as response:
                content = await response.read()
                status, headers = response.status, response.headers
        except TimeoutError as exc:   # aiohttp's read and connect timeouts are TimeoutErrors
            raise openai.APITimeoutError(request=_request(url)) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise openai.APIConnectionError(request=_request(url)) from exc
        _log.debug("HTTP Response: POST %s %d %s", url, status, response.reason or "")
        if status >= 400:
            raise _status_error(client, url, status, content, headers.items())
        return json.loads(content)

    def post_stream(self, client: Client, path: str, body: dict, *,
                    patient: bool = False) -> AsyncIterator[Any]:
        """POST `body` with `stream: true`; each server-sent event's JSON as plain values,
        through `http1.Http1.stream` (else the SDK's stream). `aclose()` (or leaving it by an
        error or a cancellation) closes the response, and with it the connection: a server
        stops generating for a closed one. `patient`: no read timeout of the client's own
        (the caller times the progress); the lean client has none for streams."""
        body = {**body, "stream": True}
        lean = client.http1()
        if lean is not None:
            return _Events(client, lean, path, json.dumps(body).encode())
        return self._sdk_stream(client, path, body, patient)

    @staticmethod
    async def _sdk_stream(client: Client, path: str, body: dict, patient: bool):
        from openai import AsyncStream

        options = {"timeout": _httpx().Timeout(None, connect=client.timeout)} if patient else {}
        stream = await client.sdk.post(path, body=body, cast_to=object, options=options,
                                       stream=True, stream_cls=AsyncStream[object])
        try:
            async for event in stream:
                yield event
        finally:
            await stream.close()


class _Events:
    """The server-sent events of a streamed answer over `http1`, as plain values. A class,
    not an async generator: nothing is left for the event loop to finalize when a stream
    is left early (a loop closed by hand would report it as a pending task)."""

    def __init__(self, client: Client, lean, path: str, body: bytes):
        self._client, self._lean, self._path, self._body = client, lean, path, body
        self._url = client.base + path
        self._stream: http1.Stream | None = None
        self._buffer = b""
        self._done = False

    def __aiter__(self) -> "_Events":
        return self

    async def __anext__(self) -> Any:
        import openai

        try:
            if self._stream is None:
                await self._open()
            while not self._done:
                event = self._next_event()
                if event is not None:
                    return event
                if self._done:   # [DONE]
                    break
                piece = await self._stream.read()
                if not piece:
                    raise ConnectionError("the stream ended without its last event")
                self._buffer += piece
        except TimeoutError as exc:
            raise openai.APITimeoutError(request=_request(self._url)) from exc
        except OSError as exc:   # refused, reset, closed early, not HTTP
            raise openai.APIConnectionError(request=_request(self._url)) from exc
        raise StopAsyncIteration

    async def _open(self) -> None:
        _log.debug("Sending HTTP Request: POST %s (streamed)", self._url)
        self._stream = await self._lean.stream(self._path, self._body)
        status = self._stream.status
        _log.debug("HTTP Response: POST %s %d", self._url, status)
        if status >= 400:
            content = b""
            while len(content) < 1_000_000 and (piece := await self._stream.read()):
                content += piece
            self._stream.close()
            raise _status_error(self._client, self._url, status, content,
                                http1.header_pairs(self._stream.head))

    def _next_event(self) -> Any:
        """The next complete event's JSON from the buffer (None: none complete yet)."""
        while True:
            buffer = self._buffer.replace(b"\r\n", b"\n")
            block, sep, rest = buffer.partition(b"\n\n")
            if not sep:
                self._buffer = buffer
                return None
            self._buffer = rest
            data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n")
                              if line.startswith(b"data:"))
            if not data:   # a comment (": ping") or a field other than data
                continue
            if data.strip() == b"[DONE]":
                self._done = True
                return None
            event = json.loads(data)
            if isinstance(event, dict) and "error" in event and "choices" not in event:
                raise ValueError(f"the server sent an error: {str(event['error'])[:200]}")
            return event

    async def aclose(self) -> None:
        self._done = True
        if self._stream is not None:
            self._stream.close()


# A child of the SDK's logger: OPENAI_LOG=debug shows these requests beside the SDK's own
# (URLs only; headers, and so the API key, are never logged).
_log = logging.getLogger("openai.flowmagic")

# aiohttp has already decoded the body: these would make httpx decode or measure it again.
_BODY_HEADERS = {"content-encoding", "transfer-encoding", "content-length"}


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP(S)_PROXY, NO_PROXY), as httpx would
    use it; looked up once per client, not per request as aiohttp's trust_env does."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    if not parts.hostname or proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


def _status_error(client: Client, url: str, status: int, content: bytes, headers):
    """The SDK's own error for an HTTP error status (`APIStatusError` and its subclasses,
    `RateLimitError` with the Retry-After header...), built by the SDK from the reply."""
    return client.sdk._make_status_error_from_response(_httpx().Response(
        status, content=content, request=_request(url),
        headers=[(k, v) for k, v in headers if k.lower() not in _BODY_HEADERS]))


def _request(url: str):
    return _httpx().Request("POST", url)
