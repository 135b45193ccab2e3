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

A streamed answer (`Http1.stream`) hands its body on as it comes (`Stream.read`), with no
timer of its own: its caller times the progress (llm.progress). Closing a stream before
its end closes its connection, which is how a server learns that nobody reads the answer.

Failures are the standard library's: `TimeoutError`, `ConnectionError` (a reply that is
not HTTP too) and other `OSError`s, `ValueError` for a body in an unknown encoding; the
transport turns them into the openai SDK's errors.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import math
import socket
import ssl as _ssl
import zlib
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Http1", "Stream", "available", "header_pairs"]

_KEEP_IDLE = 1000   # idle connections kept per client; more are closed
_DNS_TTL = 10.0     # seconds a host's looked-up addresses are used (aiohttp's default)


def available() -> bool:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return False
    return True


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: at most one request on it at a time. The answer's
    header block and body are kept in bytearrays, which the garbage collector does not
    track; the connection is also its request's timer callback (see `Http1.post`)."""

    __slots__ = ("transport", "parser", "waiter", "timer", "head", "body", "framed",
                 "headers_done", "active", "answered", "closed", "reused", "timeout",
                 "deadline", "streaming", "reader", "ended", "keep")

    def __init__(self, parser_class, timeout: float):
        self.parser = parser_class(self)
        self.transport: Any = None
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.head = bytearray()   # b"name:value\r\n" per header
        self.body = bytearray()
        self.framed = False         # a Content-Length or Transfer-Encoding header came
        self.headers_done = False
        self.active = False         # bytes came in since the timer last looked
        self.answered = False       # bytes came in for the request in flight
        self.closed = False
        self.reused = False
        self.timeout = timeout      # for each wait for bytes
        self.deadline = math.inf    # for the whole answer (loop time)
        self.streaming = False      # the body is read as it comes (see Stream)
        self.reader: asyncio.Future | None = None   # a Stream waiting for more of the body
        self.ended = False          # a streamed body is complete
        self.keep = False           # ... and its connection may serve another request

    def start(self, waiter: asyncio.Future, deadline: float) -> None:
        self.waiter, self.deadline = waiter, deadline
        self.head.clear()
        self.body.clear()
        self.framed = self.headers_done = self.active = self.answered = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.headers_done and not self.framed:   # a body without a length ends here
            self._complete(keep=False)
        else:
            waiter.set_exception(ConnectionError(
                "the server closed the connection before the answer was complete"))

    def data_received(self, data: bytes) -> None:
        self.active = self.answered = True
        if self.waiter is None and not self.streaming:   # bytes nobody asked for: not reusable
            self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except Exception as exc:   # noqa: BLE001 - httptools' parser errors, or a callback's
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionError(f"the reply is not HTTP/1.1 ({exc})"))
            self.transport.close()

    def __call__(self) -> None:
        """The request's timer: no byte for `timeout` seconds, or the whole answer past its
        deadline, fails the request; bytes meanwhile re-arm it."""
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        loop = waiter.get_loop()
        now = loop.time()
        if now >= self.deadline:
            waiter.set_exception(TimeoutError("no whole answer in time"))
        elif not self.active:
            waiter.set_exception(TimeoutError(f"no byte of the answer for {self.timeout:g} s"))
        else:
            self.active = False
            self.timer = loop.call_at(min(now + self.timeout, self.deadline), self,
                                      context=_QUIET)

    # httptools' callbacks (each one defined is a bound method the parser keeps)
    def on_header(self, name: bytes, value: bytes) -> None:
        self.head += b"%s:%s\r\n" % (name, value)
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        if self.streaming and self.parser.get_status_code() >= 200:
            waiter, self.waiter = self.waiter, None   # the stream reads the body from here
            if waiter is not None and not waiter.done():
                waiter.set_result((self.parser.get_status_code(), bytes(self.head), b"", True))

    def on_body(self, body: bytes) -> None:
        self.body += body
        if self.streaming:
            self._wake()

    def on_message_complete(self) -> None:
        if self.streaming and self.waiter is None:
            self.ended, self.keep = True, self.parser.should_keep_alive()
            self._wake()
        elif self.parser.get_status_code() >= 200:
            self._complete(keep=self.parser.should_keep_alive())
        else:   # an informational 1xx: the answer is still to come
            self.start(self.waiter, self.deadline)

    def _wake(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    def _complete(self, *, keep: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), bytes(self.head),
                               bytes(self.body), keep))


# The context the timers run in: they read no context variable, and one shared context
# spares a copy of the caller's per request.
_QUIET = contextvars.Context()


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
        self._lookup: asyncio.Task | None = None
        self._address_time: float | None = None   # None: a literal IP, never looked up again
        try:
            ip = ipaddress.ip_address(self._host)
        except ValueError:
            self._addresses: list | None = None
        else:
            self._addresses = [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
                                socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                                (self._host, self._port))]

    async def post(self, path: str, body: bytes, *, whole: float | None = None
                   ) -> tuple[int, bytes, bytes]:
        """(status, header block, body) of POST `path` with the JSON `body` (`header_pairs`
        reads the block); `whole` bounds the whole exchange, connecting included (seconds),
        `timeout` each wait for bytes."""
        request = b"POST %s%s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            self._prefix, path.encode("ascii"), self._head, len(body), body)
        loop = asyncio.get_running_loop()
        deadline = math.inf if whole is None else loop.time() + whole
        while True:
            conn = self._idle_connection() or await self._connect(deadline - loop.time())
            waiter = loop.create_future()
            conn.start(waiter, deadline)
            conn.transport.write(request)
            # the connection is the timer's callback: one TimerHandle is all a request adds
            conn.timer = loop.call_at(min(loop.time() + self.timeout, deadline), conn,
                                      context=_QUIET)
            try:
                status, head, content, keep = await waiter
            except ConnectionError:
                self._drop(conn)
                if conn.reused and not conn.answered:   # closed while idle: once more, anew
                    continue
                raise
            except BaseException:   # timed out or cancelled: the connection is unusable
                self._drop(conn)
                raise
            finally:
                conn.waiter = None
                conn.timer.cancel()
                conn.timer = None
            break
        if keep:
            self._give_back(conn)
        else:
            self._drop(conn)
        return status, head, _decoded(head, content)

    async def stream(self, path: str, body: bytes) -> "Stream":
        """POST `path` and return once the answer's headers are in: its status and headers,
        and its body to read as it comes. Not timed (the caller times the progress)."""
        request = b"POST %s%s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            self._prefix, path.encode("ascii"), self._head, len(body), body)
        loop = asyncio.get_running_loop()
        while True:
            conn = self._idle_connection() or await self._connect(math.inf)
            waiter = loop.create_future()
            conn.start(waiter, math.inf)
            conn.streaming, conn.ended, conn.keep = True, False, False
            conn.transport.write(request)
            try:
                status, head, _, _ = await waiter
            except ConnectionError:
                self._drop(conn)
                if conn.reused and not conn.answered:   # closed while idle: once more, anew
                    continue
                raise
            except BaseException:
                self._drop(conn)
                raise
            finally:
                conn.waiter = None
            return Stream(self, conn, status, head)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn.reused = True
                return conn
            self._open.discard(conn)
        return None

    async def _connect(self, left: float) -> _Connection:
        """A new connection to the first of the host's addresses that takes one, as
        `create_connection` would, but from addresses looked up once per `_DNS_TTL`
        seconds (a 500-wide fan-out opens 500 connections at once: one look-up, not 500
        in the loop's thread pool) and with no resolution step of its own."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(min(self.timeout, left)):
            fresh = self._addresses_fresh(loop)
            addresses = self._addresses if fresh else await self._look_up(loop)
            sock = await self._first_socket(loop, addresses)
            _, conn = await loop.create_connection(
                self._new_connection, sock=sock, ssl=self._ssl,
                server_hostname=self._host if self._tls else None)
        self._open.add(conn)
        return conn

    def _addresses_fresh(self, loop) -> bool:
        return bool(self._addresses) and (self._address_time is None
                                          or loop.time() < self._address_time + _DNS_TTL)

    async def _look_up(self, loop) -> list:
        """The host's addresses; callers at the same moment share one look-up."""
        if self._lookup is None:
            self._lookup = loop.create_task(loop.getaddrinfo(
                self._host, self._port, type=socket.SOCK_STREAM))
        lookup = self._lookup
        try:
            # shielded: a caller that times out must not cancel the others' look-up
            self._addresses = await asyncio.shield(lookup)
            self._address_time = loop.time()
        finally:
            if lookup.done() and self._lookup is lookup:
                self._lookup = None
        return self._addresses

    async def _first_socket(self, loop, addresses: list) -> socket.socket:
        error: OSError | None = None
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
            except BaseException:
                sock.close()
                raise
        if self._address_time is not None:   # a name: look it up again, the host may have moved
            self._addresses = None
        raise error or OSError(f"no address for {self._host}")

    def _new_connection(self) -> _Connection:
        return _Connection(self._parser, self.timeout)

    def _give_back(self, conn: _Connection) -> None:
        conn.reused = conn.streaming = False
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


class Stream:
    """The body of a streamed answer, read piece by piece; `close()` ends it (the
    connection is kept for another request only when the body was read to its end)."""

    def __init__(self, owner: Http1, conn: _Connection, status: int, head: bytes):
        self._owner, self._conn = owner, conn
        self.status, self.head = status, head
        coding = next((v.lower() for k, v in header_pairs(head)
                       if k.lower() == "content-encoding"), "")
        if coding not in ("", "identity", "gzip", "x-gzip", "deflate"):
            self.close()
            raise ValueError(f"the reply is encoded as {coding!r}")
        self._inflate = zlib.decompressobj(47) if coding not in ("", "identity") else None

    async def read(self) -> bytes:
        """The next piece of the body (b"" once it is complete)."""
        conn = self._conn
        while not conn.body and not conn.ended:
            if conn.closed:
                raise ConnectionError("the server closed the connection before the answer "
                                      "was complete")
            conn.reader = asyncio.get_running_loop().create_future()
            await conn.reader
        piece = bytes(conn.body)
        conn.body.clear()
        if self._inflate is not None and piece:
            try:
                piece = self._inflate.decompress(piece)
            except zlib.error:
                raise ValueError("the reply's compressed body is corrupt") from None
        return piece

    def close(self) -> None:
        conn, self._conn.reader = self._conn, None
        if conn.ended and conn.keep and not conn.body and not conn.closed:
            self._owner._give_back(conn)
        else:
            self._owner._drop(conn)


def header_pairs(head: bytes) -> list[tuple[str, str]]:
    """The (name, value) pairs of a header block from `Http1.post`."""
    pairs = []
    for line in head.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        pairs.append((name.decode("latin-1"), value.strip().decode("latin-1")))
    return pairs


def _decoded(head: bytes, content: bytes) -> bytes:
    if b"ncoding:" not in head.lower():   # no Content-Encoding (nor Transfer-)
        return content
    for name, value in header_pairs(head):
        if name.lower() == "content-encoding":
            coding = value.lower()
            if coding in ("gzip", "x-gzip", "deflate"):
                try:   # 32 + 15: a gzip or a zlib header, told apart by the decoder
                    return zlib.decompress(content, 47)
                except zlib.error:
                    if coding != "deflate":
                        raise ValueError("the reply's gzip body is corrupt") from None
                    return zlib.decompress(content, -15)   # raw deflate, as some servers send
            if coding not in ("", "identity"):
                raise ValueError(f"the reply is encoded as {coding!r}")
    return content
