"""The completions' HTTP/1.1 client (flowmagic.llm.http1) against a server that writes its
replies byte by byte: every framing HTTP/1.1 allows reaches the caller, and a kept-alive
connection the server dropped is not a failure."""

import asyncio
import gzip
import json
import socket
import socketserver
import sys
import threading
import zlib

import pytest

import flowmagic
from flowmagic.llm import LLM

from conftest import fast_llm

def _ask_in_turn(llm: LLM, *questions: str) -> list:
    """The questions one after another on one event loop (so one pool of connections)."""
    async def ask():
        return [await llm.complete(q, cache=False) for q in questions]

    return asyncio.run(ask())


REPLY = {"id": "c1", "object": "chat.completion", "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "framed answer"},
                      "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}


def _chunked(data: bytes, size: int = 9) -> bytes:
    pieces = [data[i:i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _framed(kind: str) -> tuple[bytes, bool]:
    """(the bytes of one reply, whether the server closes the connection after it)."""
    body = json.dumps(REPLY).encode()
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if kind == "length":
        return ok + b"Content-Length: %d\r\n\r\n%s" % (len(body), body), False
    if kind == "chunked":
        return ok + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body), False
    if kind == "gzip":
        packed = gzip.compress(body)
        return ok + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (
            len(packed), packed), False
    if kind == "chunked-deflate":
        return ok + b"Content-Encoding: deflate\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(
            zlib.compress(body)), False
    if kind == "until-close":   # no length at all: the body ends with the connection
        return ok + b"Connection: close\r\n\r\n" + body, True
    if kind == "continue-first":   # an informational answer before the real one
        return b"HTTP/1.1 100 Continue\r\n\r\n" + ok + b"Content-Length: %d\r\n\r\n%s" % (
            len(body), body), False
    raise ValueError(kind)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, kind: str, drop_every_second: bool = False):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.kind, self.drop_every_second = kind, drop_every_second
        self.requests: list[tuple[int, bytes]] = []   # (connection number, request body)
        self.connections = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server = self.server
        with server.lock:
            server.connections += 1
            number = server.connections
        served = 0
        while True:
            line = self.rfile.readline()
            if not line:
                return
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = self.rfile.read(length)
            with server.lock:
                server.requests.append((number, body))
            served += 1
            if server.drop_every_second and served == 2:
                # the keep-alive race: the server gave up on the idle connection just as
                # the client sent its next request on it
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            data, close = _framed(server.kind)
            self.wfile.write(data)
            self.wfile.flush()
            if close:
                return


@pytest.mark.parametrize("kind", ["length", "chunked", "gzip", "chunked-deflate", "until-close",
                                  "continue-first"])
def test_every_http11_framing_of_a_reply_reaches_the_caller(kind):
    with _Server(kind) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        # the second on the kept-alive connection, or on a new one after "until-close"
        for reply in _ask_in_turn(LLM(), "first", "second"):
            assert (reply.text, reply.input_tokens, reply.output_tokens) == ("framed answer", 7, 3)
        assert [json.loads(body)["messages"][0]["content"] for _, body in server.requests] == [
            "first", "second"]
        connections = {number for number, _ in server.requests}
        assert len(connections) == (2 if kind == "until-close" else 1)


def test_a_kept_alive_connection_the_server_dropped_is_not_a_failed_attempt():
    with _Server("length", drop_every_second=True) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm(backoff_base=5.0)   # a retry of the door would show as seconds here
        first, second = _ask_in_turn(llm, "first", "second")
        assert first.text == second.text == "framed answer"
        attempts = [row["response"]["attempts"] for row in llm.store.recent_calls(2)]
        assert attempts == [1, 1]
        # sent on the kept-alive connection, dropped there, sent again on a new one
        assert [(n, json.loads(b)["messages"][0]["content"]) for n, b in server.requests] == [
            (1, "first"), (1, "second"), (2, "second")]


_LOOKUPS: list[str] = []   # hosts passed to socket.getaddrinfo while a test listens


def _count_lookups(event: str, args: tuple) -> None:
    if event == "socket.getaddrinfo" and _LOOKUPS and _LOOKUPS[0] == "on":
        _LOOKUPS.append(str(args[0]))


def test_a_fan_out_to_a_host_name_looks_it_up_once():
    """20 calls at once open 20 connections to "localhost": one address look-up serves
    them all (as aiohttp's cache did), and an address that refuses (::1, where the server
    does not listen) falls through to the next one."""
    sys.addaudithook(_count_lookups)   # audit hooks stay for the process: it only counts
    with _Server("length") as server:
        port = server.server_address[1]
        flowmagic.configure(base_url=f"http://localhost:{port}/v1", model="m")
        llm = LLM(concurrency=100)

        async def fan():
            return await asyncio.gather(*(llm.complete(f"q{i}", cache=False) for i in range(20)))

        _LOOKUPS[:] = ["on"]
        try:
            replies = asyncio.run(fan())
        finally:
            looked_up, _LOOKUPS[:] = _LOOKUPS[1:], []
    assert [r.text for r in replies] == ["framed answer"] * 20
    assert len({n for n, _ in server.requests}) == 20, server.requests   # one connection each
    assert looked_up == ["localhost"], looked_up
