"""The hot path's HTTP/1.1: one JSON POST over a kept-alive connection, and nothing else.

A wide fan-out sends hundreds of completions at once from one core, and everything an
HTTP library builds per request is paid that many times, and kept alive as long as the
request is in flight (a full garbage collection then walks it all). Measured with 500
concurrent POSTs against the loopback server: aiohttp 0.40-0.47 ms of CPU and ~80
objects tracked by the garbage collector per request; this client 0.19-0.21 ms and
~32, about the raw-socket floor of the benchmark (0.22-0.25 ms, ~36).

What it does per request: take an idle connection (or open one), write the request in
one `write` (its header block is built once per client), let httptools (llhttp, the C
parser of Node.js; uvicorn's) call back per header and body piece, and wake the caller
once the message is complete. What it keeps: connections per client in a list, reused
last-in first-out, O(1) a request; a connection the server closed is dropped when it is
next taken. A request on a reused connection that the server had closed before any byte
of the answer came back is sent once more on a new connection, as urllib3 and httpx do.

Timeouts: `timeout` bounds the connect and each wait for bytes (as aiohttp's
sock_connect / sock_read did), with one timer per request that re-arms itself when bytes
came in meanwhile, not one per read. Bodies may be Content-Length, chunked, or end at
the connection's close; gzip and deflate bodies are decoded. Proxies are not handled
here: the transport sends proxied endpoints through aiohttp.

Failures are the standard library's: `TimeoutError`, `ConnectionError` (a reply that is
not HTTP too) and other `OSError`s, `ValueError` for a body in an unknown encoding; the
transport turns them into the openai SDK's errors.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import zlib
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Http1", "available"]

_KEEP_IDLE = 1000   # idle connections kept per client; more are closed


def available() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: at most one request on it at a time."""

    __slots__ = ("transport", "parser", "waiter", "timer", "headers", "body", "eof_body",
                 "active", "answered", "closed", "reused")

    def __init__(self, parser_class):
        self.parser = parser_class(self)
        self.transport: Any = None
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.headers: list = []
        self.body: list = []
        self.eof_body = False   # the answer has no length: it ends when the connection does
        self.active = False     # bytes came in since the timer last looked
        self.answered = False   # bytes came in for the request in flight
        self.closed = False
        self.reused = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.eof_body:   # a body without a length ends here
            self._complete(keep=False)
        else:
            waiter.set_exception(ConnectionError(
                "the server closed the connection before the answer was complete"))

    def data_received(self, data: bytes) -> None:
        self.active = self.answered = True
        if self.waiter is None:   # bytes nobody asked for: the connection is not reusable
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except Exception as exc:   # noqa: BLE001 - httptools' parser errors, or a callback's
            if not self.waiter.done():
                self.waiter.set_exception(ConnectionError(f"the reply is not HTTP/1.1 ({exc})"))
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.headers, self.body, self.eof_body = [], [], False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        names = {name.lower() for name, _ in self.headers}
        self.eof_body = b"content-length" not in names and b"transfer-encoding" not in names

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.eof_body = False
        if self.parser.get_status_code() >= 200:   # not an informational 1xx: the answer
            self._complete(keep=self.parser.should_keep_alive())

    def _complete(self, *, keep: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), self.headers,
                               b"".join(self.body), keep))


class Http1:
    """POST JSON bodies to one origin (`base`: scheme, host, port and path prefix)."""

    def __init__(self, base: str, headers: dict[str, str], timeout: float,
                 ssl_context: _ssl.SSLContext | None = None):
        import httptools

        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base!r}")
        self._parser = httptools.HttpResponseParser
        self._host, self._tls = parts.hostname, parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/").encode("ascii")
        self._ssl = (ssl_context or _ssl.create_default_context()) if self._tls else None
        self.timeout = timeout
        host = parts.netloc.rpartition("@")[2]   # never the userinfo
        fields = {"Host": host, "Accept": "application/json",
                  "Accept-Encoding": "gzip, deflate", **headers,
                  "Content-Type": "application/json", "Connection": "keep-alive"}
        lines = []
        for name, value in fields.items():
            if any(c in f"{name}{value}" for c in "\r\n\0"):
                raise ValueError(f"the header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))   # as http.client does
        self._head = b"".join(lines)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def post(self, path: str, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body) of POST `path` with the JSON `body`."""
        request = b"POST %s%s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            self._prefix, path.encode("ascii"), self._head, len(body), body)
        while True:
            conn = await self._take()
            try:
                status, headers, content, keep = await self._exchange(conn, request)
            except ConnectionError:
                if conn.reused and not conn.answered:   # closed while idle: once more, anew
                    continue
                raise
            break
        if keep:
            self._give_back(conn)
        else:
            self._drop(conn)
        return status, headers, _decoded(headers, content)

    async def _take(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn.reused = True
                return conn
            self._open.discard(conn)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            _, conn = await loop.create_connection(
                lambda: _Connection(self._parser), self._host, self._port, ssl=self._ssl,
                server_hostname=self._host if self._tls else None)
        self._open.add(conn)
        return conn

    async def _exchange(self, conn: _Connection, request: bytes):
        loop = asyncio.get_running_loop()
        waiter = conn.waiter = loop.create_future()
        conn.active = conn.answered = False
        conn.transport.write(request)
        conn.timer = loop.call_at(loop.time() + self.timeout, self._expire, conn, waiter)
        try:
            return await waiter
        except BaseException:   # timed out, cancelled, or broken: the connection is unusable
            self._drop(conn)
            raise
        finally:
            conn.waiter = None
            conn.timer.cancel()
            conn.timer = None

    def _expire(self, conn: _Connection, waiter: asyncio.Future) -> None:
        """No byte for `timeout` seconds: the request fails; bytes meanwhile: wait on."""
        if waiter.done():
            return
        if conn.active:
            conn.active = False
            loop = asyncio.get_running_loop()
            conn.timer = loop.call_at(loop.time() + self.timeout, self._expire, conn, waiter)
            return
        waiter.set_exception(TimeoutError(f"no byte of the answer for {self.timeout:g} s"))

    def _give_back(self, conn: _Connection) -> None:
        conn.reused = False
        if len(self._idle) < _KEEP_IDLE:
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn.transport is not None:
            conn.transport.close()

    async def close(self) -> None:
        """Close every connection (in flight ones too), and let the loop finish closing them."""
        conns, self._open, self._idle = list(self._open), set(), []
        for conn in conns:
            try:
                conn.transport.close()
            except RuntimeError:   # its loop is closed (at exit): the socket ends with the process
                pass
        if conns:
            await asyncio.sleep(0)


def _decoded(headers: list[tuple[bytes, bytes]], content: bytes) -> bytes:
    for name, value in headers:
        if name.lower() == b"content-encoding":
            coding = value.strip().lower()
            if coding in (b"gzip", b"x-gzip", b"deflate"):
                try:   # 32 + 15: a gzip or a zlib header, told apart by the decoder
                    return zlib.decompress(content, 47)
                except zlib.error:
                    if coding != b"deflate":
                        raise ValueError("the reply's gzip body is corrupt") from None
                    return zlib.decompress(content, -15)   # raw deflate, as some servers send
            if coding not in (b"", b"identity"):
                raise ValueError(f"the reply is encoded as {coding.decode('latin-1')!r}")
    return content
