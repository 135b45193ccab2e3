"""The loopback server's asyncio engine: one event loop and the httptools parser.

The default engine (`http.server`, a thread per connection) is simple and serves every fault.
A benchmark that opens hundreds of connections at once needs a server that adds nothing of its
own: with a thread per connection, 500 threads take turns on one interpreter lock and the
last request of a fan-out is read late. Here one loop reads every connection, the reply is
built when its request is complete and leaves in one write when its latency has passed since
its arrival, timed to the microsecond (epoll's own timeout is whole milliseconds).

The requests go through the same `LoopbackServer.handle` as the threads' (records, latency,
faults, replies), with an `Exchange` in place of a `BaseHTTPRequestHandler`. Faults that hold
a connection open ("hang", "trickle", "stall") need a thread to wait in, and are refused by this engine.
"""

from __future__ import annotations

import asyncio
import io
import selectors
import socket
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

import httptools

from .._internal.waiting import readable

__all__ = ["Engine", "Exchange", "UNSERVED_FAULTS"]

UNSERVED_FAULTS = ("hang", "trickle", "stall")
_BACKLOG = 4096   # a fan-out of 500 opens 500 connections at once
_EPOLL = getattr(selectors, "EpollSelector", None)


if _EPOLL is not None:
    class _FineSelector(_EPOLL):
        """epoll, but a timed wait is a select() on the epoll descriptor: microseconds, where
        epoll_wait rounds a timeout up to the next millisecond (so a 123.4 ms latency would
        end at 124)."""

        def select(self, timeout: float | None = None) -> list:
            if timeout is not None and timeout > 0:
                readable(self.fileno(), timeout)
                timeout = 0
            return super().select(timeout)
else:  # pragma: no cover - not Linux
    _FineSelector = selectors.DefaultSelector


class _Headers:
    """The request's headers as http.server gives them: items() in order, get() by any case."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs
        self._by_name = {k.lower(): v for k, v in pairs}

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    def get(self, name: str, default: Any = None) -> Any:
        return self._by_name.get(name.lower(), default)


class Exchange:
    """One request and its reply, with the part of BaseHTTPRequestHandler's interface that
    `LoopbackServer` uses. The reply is collected, not sent: the engine sends it when due."""

    defers_reply = True

    def __init__(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
                 arrived: tuple[float, float]) -> None:
        self.command, self.path, self.headers = method, path, _Headers(headers)
        self.rfile, self.wfile = io.BytesIO(body), self
        self.close_connection = False
        self.loopback_due: float | None = None
        self.on_sent: Callable[[], None] | None = None  # the server closes its record
        self._arrived = arrived
        self._out: list[bytes] = []

    def arrival(self) -> tuple[float, float]:
        """(epoch, monotonic) when the request's first byte was read."""
        return self._arrived


    # -- the handler interface ---------------------------------------------------------------
    def send_response(self, code: int, message: str | None = None) -> None:
        # the reason phrases the thread engine's handler sends (http.server's own table)
        reason = message or BaseHTTPRequestHandler.responses.get(code, ("",))[0]
        self._out.append(f"HTTP/1.1 {code} {reason}\r\nServer: flowmagic-loopback\r\n"
                         f"Date: {formatdate(usegmt=True)}\r\n".encode("latin-1"))

    def send_header(self, key: str, value: str) -> None:
        self._out.append(f"{key}: {value}\r\n".encode("latin-1"))

    def end_headers(self) -> None:
        self._out.append(b"\r\n")

    def write(self, data: bytes) -> None:
        self._out.append(data)

    def flush(self) -> None:
        pass

    def reply(self) -> bytes:
        return b"".join(self._out)


class _Connection(asyncio.Protocol):
    """One client connection: parse requests, hand each to the server, send replies when due."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._reset()

    def _reset(self) -> None:
        self.url, self.headers, self.body = b"", [], []
        self.arrived = (0.0, 0.0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.engine.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.engine.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            self.transport.close()

    # -- httptools callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()
        self.arrived = (time.time(), time.monotonic())

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        ex = Exchange(self.parser.get_method().decode(), self.url.decode("latin-1"), self.headers,
                      b"".join(self.body), self.arrived)
        self.engine.owner.handle(ex)
        keep = self.parser.should_keep_alive() and not ex.close_connection
        loop, due = self.engine.loop, ex.loopback_due
        wait = 0.0 if due is None else due - time.monotonic()
        if wait > 0:
            loop.call_at(loop.time() + wait, self._send, ex, keep)
        else:
            self._send(ex, keep)

    def _send(self, ex: Exchange, keep: bool) -> None:
        if ex.on_sent is not None:  # even when the client has gone: it is out of flight
            ex.on_sent()
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(ex.reply())
        if not keep:
            self.transport.close()


class Engine:
    """An event loop in a thread of its own serving `owner` on 127.0.0.1:`port`."""

    def __init__(self, owner: Any, port: int = 0) -> None:
        self.owner, self.port = owner, port
        self.loop = asyncio.SelectorEventLoop(_FineSelector())
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Engine:
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self._server = self.loop.run_until_complete(self.loop.create_server(
                lambda: _Connection(self), "127.0.0.1", self.port, backlog=_BACKLOG))
            self.port = self._server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="loopback-asyncio", daemon=True)
        self._thread.start()
        started.wait()
        return self

    def stop(self) -> None:
        """Close the listener and every connection (pending replies are dropped), end the loop."""
        def close() -> None:
            self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            # after the aborts' own callbacks, which close the sockets
            self.loop.call_soon(self.loop.stop)

        if self._thread is None:
            return
        self.loop.call_soon_threadsafe(close)
        self._thread.join(timeout=5)
        self._thread = None
        self.loop.close()
