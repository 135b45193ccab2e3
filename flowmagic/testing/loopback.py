"""A loopback OpenAI-compatible HTTP server for tests and benchmarks.

The replies themselves (default responder, schema examples, embeddings, usage, stream
chunks) are built in `loopback_replies`, the handle on a child-process server is in
`loopback_spawn`, the options and their command line in `loopback_options`, slots in
`loopback_slots`; this module serves the replies with latency and faults.

In-process::

    with LoopbackServer(latency=(0.1, 0.3), faults={"429": 0.1}) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="sk-test")

``engine="asyncio"`` serves from one event loop instead of a thread per connection
(`loopback_asyncio`: for hundreds of connections at once, as a benchmark opens; it serves
every fault but "hang" and "trickle").

In its own process, so it does not share the GIL with the code being measured::

    handle = LoopbackServer.spawn(latency=(0.1, 0.8), seed=1)   # or
    python -m flowmagic.testing.loopback --latency 0.1:0.8 --seed 1 --port 0   # prints the base URL

Endpoints: POST /v1/chat/completions (JSON, or SSE with ``stream: true``), GET /v1/models,
POST /v1/embeddings, GET /_stats, POST /_reset. A responder returns the answer's text or a
dict ("content", "tool_calls", "finish_reason", "usage": counts of any type that replace the
word counts, or None for a reply that reports no usage at all).

Everything is a pure function of the request body, so runs are reproducible whatever the
arrival order: the latency is a hash of (seed, body); the fault is a hash of (seed, body,
attempt), where attempt counts earlier requests with the same body, so a retry can succeed.
A chat request's latency runs from its arrival (its headers read) to its reply's first byte:
the server reads the body, records it and builds the reply inside that time, so what it
does itself is not added to it (a benchmark's bound is the sum of these latencies).

Faults (chat completions only): "429" (with Retry-After), "500", "hang" (no answer for
``hang_s`` or until stop(), then the connection closes), "truncated" (Content-Length larger
than the bytes sent, then close; a stream stops without its terminator), "garbage" (HTTP 200
whose body is not JSON), "length" (a valid completion with finish_reason "length" and half
the text), "401" (the key was refused). ``fail_first=N`` gives the first N attempts of each body
the fault ``fail_kind`` (default "500"). Hostile ones: "trickle" (a valid answer sent in 20 pieces
``trickle_s`` apart, so no single read waits long), "echo" (HTTP 400 whose message repeats the
request's headers, the key included, as some proxies do), "stall" (a stream that sends its
first events, then nothing for ``hang_s``; a plain answer hangs as "hang" does). Authorization
headers are recorded as "REDACTED", never as the key.

As a local model server (`loopback_slots`): ``slots=N`` serves N chat requests at a time and
holds the others in its queue (their latency starts when they get a slot; ``max_in_flight`` is
the most it held at once; GET /props reports ``total_slots`` as llama.cpp's server does), and
``stream_s`` spaces a stream's events, a slow but steady writer. A request whose client went
away is noticed before the next piece of its answer is sent; the seconds it held a slot are
abandoned work (``stats()["abandoned_s"]``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ..errors import ConfigError
from .loopback_replies import (embeddings_reply, normalise_reply, stream_chunks, usage_counts, default_responder,
                               embed_text, schema_example)
from .loopback_asyncio import UNSERVED_FAULTS, Engine
from .loopback_options import ENGINES, FAULT_KINDS, cli_args, parse_faults, parse_latency, parser
from .loopback_slots import Slots, peer_closed
from .loopback_spawn import SpawnedLoopback

__all__ = [
    "FAULT_KINDS",
    "LoopbackServer",
    "SpawnedLoopback",
    "default_responder",
    "embed_text",
    "main",
    "schema_example",
]

_STALL_AFTER = 3   # events a stalling stream sends before it stops
_TRICKLE_PIECES = 20
_SECRET_HEADERS = {"authorization", "api-key", "x-api-key"}


def _unit(*parts: Any) -> float:
    """A stable number in [0, 1) from the parts (unlike hash(), independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _canon(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)




class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so httpx reuses connections
    disable_nagle_algorithm = True
    # Buffered, so a reply's headers and body leave in one write (http.server flushes after
    # each request; the streaming and trickling paths flush where a client must see bytes).
    wbufsize = 1 << 16
    timeout = 60  # an idle keep-alive connection closes on its own
    server_version = "flowmagic-loopback"

    defers_reply = False  # the reply is written as it is made (LoopbackServer waits first)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
        pass

    def arrival(self) -> tuple[float, float]:
        """(epoch, monotonic) of the request's arrival: now, its headers just read."""
        return time.time(), time.monotonic()

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.owner.handle(self)

    def do_POST(self) -> None:  # noqa: N802
        self.server.owner.handle(self)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connections must not overflow the listen backlog

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that closed its connection (it gave up, or left a stream) is no error
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup; loopback needs none.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request: Any, client_address: Any) -> None:
        # Tracked (unlike ThreadingMixIn's daemon threads) so stop() can unblock and join them.
        t = threading.Thread(target=self._serve_one, args=(request, client_address),
                             name="loopback-conn", daemon=True)
        with self.owner._lock:
            self.owner._conns[t] = request
        t.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self.owner._lock:
                self.owner._conns.pop(threading.current_thread(), None)


class LoopbackServer:
    """An OpenAI-compatible server on 127.0.0.1 with deterministic latency, faults and replies."""

    def __init__(self, *, responder: Callable[[dict], str | dict] | None = None,
                 latency: Any = 0.0, seed: int = 0, faults: dict | None = None, fail_first: int = 0,
                 fail_kind: str = "500", reject_json_schema: bool = False, retry_after: float = 0.05,
                 hang_s: float = 30.0, trickle_s: float = 0.5,
                 dims: int = 64, model: str = "loopback", port: int = 0,
                 embedder: Callable[[str], list[float]] | None = None,
                 models: list[str] | None | bool = None, engine: str = "threads",
                 slots: int | None = None, stream_s: float = 0.0) -> None:
        self.responder = responder or default_responder
        self.embedder = embedder   # text -> vector for /embeddings (default: hashed bag of words)
        self.latency = parse_latency(latency)
        self.faults = parse_faults(faults)
        self.fail_kind = str(fail_kind)
        if self.fail_kind not in FAULT_KINDS:
            raise ConfigError(f"fail_kind {fail_kind!r} is not one of {list(FAULT_KINDS)}")
        self.seed, self.fail_first, self.reject_json_schema = seed, int(fail_first), reject_json_schema
        self.retry_after, self.hang_s, self.dims = retry_after, hang_s, dims
        self.trickle_s = float(trickle_s)
        if engine not in ENGINES:
            raise ConfigError(f"engine {engine!r} is not one of {list(ENGINES)}")
        held = [k for k in UNSERVED_FAULTS if self.faults.get(k) or (fail_first and self.fail_kind == k)]
        if engine == "asyncio" and held:
            raise ConfigError(f"the asyncio engine does not serve the fault(s) {held}; "
                              "use engine='threads' for them")
        if engine == "asyncio" and (slots or stream_s):
            raise ConfigError("the asyncio engine has no slots nor paced streams; "
                              "use engine='threads' for them")
        self.stream_s = float(stream_s)
        self.engine = engine
        self.model, self.port = model, port
        # what GET /models lists: `model` alone by default; False: no /models route (404)
        self.models = [model] if models is None else models
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        try:
            self.slots = Slots(int(slots) if slots is not None else None, self._stopping)
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        self._conns: dict[threading.Thread, Any] = {}
        self._httpd: _HTTPServer | None = None
        self._engine: Engine | None = None
        self._thread: threading.Thread | None = None
        self.in_flight = 0
        self.reset()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LoopbackServer:
        if self.engine == "asyncio" and self._engine is None:
            self._stopping.clear()
            self._engine = Engine(self, self.port).start()
            atexit.register(self.stop)
        elif self.engine == "threads" and self._httpd is None:
            self._stopping.clear()
            self._httpd = _HTTPServer(("127.0.0.1", self.port), _Handler)
            self._httpd.owner = self
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name="loopback-server", daemon=True)
            self._thread.start()
            atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Stop serving, wake hanging handlers, close every connection and join every thread."""
        engine, self._engine = self._engine, None
        if engine is not None:
            self._stopping.set()
            engine.stop()
            atexit.unregister(self.stop)
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            conns = list(self._conns.items())
        for _thread, sock in conns:
            try:  # unblocks a handler waiting for the next request on a keep-alive connection
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread, _sock in conns:
            thread.join(timeout=5)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        atexit.unregister(self.stop)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        if self._engine is not None:
            return f"http://127.0.0.1:{self._engine.port}/v1"
        if self._httpd is None:
            raise RuntimeError("the loopback server is not running; call start() or use it in a with block")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    # -- recording -------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget recorded requests, counts and attempt numbers (requests in flight still count)."""
        with self._lock:
            self.requests: list[dict] = []
            self.calls = 0
            self.max_in_flight = self.in_flight
            self.fault_counts = {kind: 0 for kind in FAULT_KINDS}
            self._attempts: dict[str, int] = {}

    def stats(self, bodies: bool = False) -> dict:
        """Counters plus one summary per request (with body and headers when bodies=True)."""
        hidden = () if bodies else ("body", "headers")
        with self._lock:
            left = [r for r in self.requests if r.get("abandoned")]
            return {"calls": self.calls, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                    "faults": dict(self.fault_counts), "slots": self.slots.count,
                    "abandoned": len(left),
                    "abandoned_s": sum(r.get("served_s") or 0.0 for r in left),
                    "requests": [{k: v for k, v in r.items() if k not in hidden} for r in self.requests]}

    def _record(self, h: _Handler, path: str, body: Any, arrived: float) -> dict:
        headers = {k.lower(): "REDACTED" if k.lower() in _SECRET_HEADERS else v for k, v in h.headers.items()}
        rec = {"method": h.command, "path": path, "body": body, "headers": headers,
               "had_auth": any(k.lower() in _SECRET_HEADERS and v.strip() for k, v in h.headers.items()),
               "arrived": arrived, "finished": None, "status": None, "attempt": None, "fault": None,
               "latency_s": None, "served_s": None, "abandoned": False}
        with self._lock:
            self.requests.append(rec)
        return rec

    # -- HTTP --------------------------------------------------------------------------------
    def handle(self, h: _Handler) -> None:
        """Answer one request: `h` is the thread engine's handler or the asyncio engine's
        Exchange (the same interface)."""
        method, h.loopback_rec, h.loopback_due = h.command, None, None
        arrived, h.loopback_t0 = h.arrival()
        full = h.path.split("?", 1)[0].rstrip("/")
        path = full[3:] if full.startswith("/v1/") else full  # the route; the record keeps `full`
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if method == "POST" else b""
        if path in ("/_stats", "/_reset"):
            if path == "/_reset" and method == "POST":
                self.reset()
            self._send_json(h, 200, self.stats(bodies="bodies=1" in h.path))
            return
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = None
        rec = self._record(h, full, raw.decode("utf-8", "replace") if body is None else body, arrived)
        route = {("POST", "/chat/completions"): self._chat, ("GET", "/models"): self._models,
                 ("POST", "/embeddings"): self._embeddings,
                 ("GET", "/props"): self._props}.get((method, path))
        h.loopback_rec, h.loopback_chat, h.loopback_slot, status = rec, False, None, 0
        try:
            if route is None:
                status = self._send_error(h, 404, f"no route for {method} {h.path}", "not_found")
            elif not isinstance(body, dict):
                status = self._send_error(h, 400, "the request body is not a JSON object", "invalid_request")
            else:
                status = route(h, body, rec)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            h.close_connection = rec["abandoned"] = True
        finally:
            self._settle(h, status)
            self._leave_slot(h, rec)

    def _leave_slot(self, h: _Handler, rec: dict) -> None:
        """Give a chat request's slot back, with the seconds it held it."""
        start, h.loopback_slot = h.loopback_slot, None
        if start is not None:
            rec["served_s"] = time.monotonic() - start
            self.slots.give_back()

    def _gone(self, h: _Handler) -> bool:
        """True (and the request marked abandoned) when its client has gone away."""
        if not peer_closed(h):
            return False
        h.close_connection = True
        if h.loopback_rec is not None:
            h.loopback_rec["abandoned"] = True
        return True

    def _settle(self, h: _Handler, status: int, answered: bool = False) -> None:
        """Close the request's record once, before its last bytes leave: a client that has its
        reply must already see it counted in `calls`, `in_flight` and `requests`. The asyncio
        engine sends a reply later than it is made, and closes the record then."""
        rec, h.loopback_rec = getattr(h, "loopback_rec", None), None
        if rec is None:
            return
        if h.defers_reply:
            h.on_sent = lambda: self._close(rec, status, h.loopback_chat, answered)
        else:
            self._close(rec, status, h.loopback_chat, answered)

    def _close(self, rec: dict, status: int, chat: bool, answered: bool) -> None:
        with self._lock:
            rec["status"], rec["finished"] = status, time.time()
            if chat:
                self.in_flight -= 1
                self.calls += answered

    def _wait_due(self, h: _Handler) -> bool:
        """Wait until the request's latency has passed since it arrived (see _delay); False
        when stop() cut the wait short (the connection is then closed without a reply)."""
        if h.defers_reply:  # the asyncio engine holds the bytes until they are due
            return not self._stopping.is_set()
        due, h.loopback_due = getattr(h, "loopback_due", None), None
        left = 0.0 if due is None else due - time.monotonic()
        if self._stopping.wait(left) if left > 0 else self._stopping.is_set():
            h.close_connection = True
            return False
        return not self._gone(h)

    def _send_bytes(self, h: _Handler, status: int, payload: bytes, ctype: str = "application/json",
                    headers: dict | None = None, truncated: bool = False, answered: bool = False,
                    trickle: bool = False) -> int:
        if not self._wait_due(h):
            return 0
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        # "truncated" promises more bytes than it sends, then closes: the client sees a short read.
        h.send_header("Content-Length", str(len(payload) + (64 if truncated else 0)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()
        self._settle(h, status, answered)
        if trickle:
            self._trickle(h, [payload])
        else:
            h.wfile.write(payload)
        if truncated:
            h.close_connection = True
        return status

    def _trickle(self, h: _Handler, parts: list[bytes]) -> None:
        """The bytes in _TRICKLE_PIECES pieces, `trickle_s` apart (stop() cuts it short)."""
        data = b"".join(parts)
        size = max(1, -(-len(data) // _TRICKLE_PIECES))
        for i in range(0, len(data), size):
            if i and self._stopping.wait(self.trickle_s):
                h.close_connection = True
                return
            h.wfile.write(data[i:i + size])
            h.wfile.flush()

    def _send_json(self, h: _Handler, status: int, obj: Any, **kw: Any) -> int:
        return self._send_bytes(h, status, json.dumps(obj).encode(), **kw)

    def _send_error(self, h: _Handler, status: int, message: str, code: str,
                    headers: dict | None = None) -> int:
        err = {"error": {"message": message, "type": code, "code": code, "param": None}}
        return self._send_json(h, status, err, headers=headers)

    def _send_stream(self, h: _Handler, chunks: list[dict], truncated: bool,
                     trickle: bool = False, stall: bool = False) -> None:
        if not self._wait_due(h):
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        if truncated:  # half the events, no terminating chunk, then close
            events, h.close_connection = events[: max(1, len(events) // 2)], True
        gap = self.trickle_s if trickle else self.stream_s
        for i, data in enumerate(events):
            if i == len(events) - 1:
                self._settle(h, 200, answered=not truncated)
            if i and (gap and self._stopping.wait(gap) or self._gone(h)):
                h.close_connection = True
                return
            if stall and i == min(_STALL_AFTER, len(events) - 1):   # then nothing, then close
                self._stopping.wait(self.hang_s)
                h.close_connection = True
                return
            h.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
            if gap or stall or i == 0:  # the first event at once, as a real server's first token
                h.wfile.flush()
        if not truncated:
            h.wfile.write(b"0\r\n\r\n")

    # -- endpoints ---------------------------------------------------------------------------
    def _delay(self, h: _Handler, body: dict, rec: dict) -> None:
        """Set when the reply is due: the request's latency after its arrival. The reply is
        built meanwhile and waits for it in _wait_due before its first byte."""
        if callable(self.latency):
            delay = max(0.0, float(self.latency(body)))
        else:
            lo, hi = self.latency
            delay = lo + (hi - lo) * _unit(self.seed, "latency", _canon(body))
        rec["latency_s"] = delay
        h.loopback_due = h.loopback_t0 + delay

    def _pick_fault(self, key: str, attempt: int) -> str | None:
        if attempt < self.fail_first:
            return self.fail_kind
        u, total = _unit(self.seed, "fault", key, attempt), 0.0
        for kind in FAULT_KINDS:
            total += self.faults.get(kind, 0.0)
            if u < total:
                return kind
        return None

    def _chat(self, h: _Handler, body: dict, rec: dict) -> int:
        key = _canon(body)
        with self._lock:
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
            self.in_flight += 1   # held: in the queue for a slot, or served
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            h.loopback_chat = True  # _settle() takes it out of flight
        if self.slots.count is not None:   # its latency starts with its slot, not its arrival
            if not self.slots.take():
                h.close_connection = True
                return 0
            h.loopback_t0 = time.monotonic()
        h.loopback_slot = time.monotonic()
        fault = self._pick_fault(key, attempt)
        rec["attempt"], rec["fault"] = attempt, fault
        if fault:
            with self._lock:
                self.fault_counts[fault] += 1
        self._delay(h, body, rec)
        return self._answer_chat(h, body, fault)

    def _answer_chat(self, h: _Handler, body: dict, fault: str | None) -> int:
        if fault == "429":
            return self._send_error(h, 429, "rate limited (loopback fault injection); retry later",
                                    "rate_limit_exceeded", headers={"Retry-After": f"{self.retry_after:g}"})
        if fault == "500":
            return self._send_error(h, 500, "internal error (loopback fault injection)", "server_error")
        if fault == "401":
            return self._send_error(h, 401, "incorrect API key (loopback fault injection)", "invalid_api_key")
        if fault == "echo":   # a proxy that quotes the request back, secrets and all
            # the credential first, as a proxy complaining about it would (and so that an
            # error message cut at any length still holds the key for the scrub to hide)
            items = sorted(h.headers.items(), key=lambda kv: kv[0].lower() != "authorization")
            seen = "; ".join(f"{k}: {v}" for k, v in items)
            return self._send_error(h, 400, f"bad request; headers were: {seen}", "invalid_request")
        if fault == "hang" or fault == "stall" and not body.get("stream"):
            if self._wait_due(h):
                self._stopping.wait(self.hang_s)
            h.close_connection = True
            return 0
        fmt = body.get("response_format")
        if self.reject_json_schema and isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            return self._send_error(h, 500, "response_format type 'json_schema' is not supported by this "
                                    "server (like llama-cpp-python); use 'json_object' with a 'schema'",
                                    "internal_server_error")
        try:
            msg, finish, usage = normalise_reply(self.responder(body), body)
        except Exception as exc:  # a broken test responder should fail loudly, not hang the client
            return self._send_error(h, 500, f"responder raised {exc!r}", "responder_error")
        if fault == "length":
            msg["content"] = (msg.get("content") or "")[: len(msg.get("content") or "") // 2]
            finish, usage = "length", usage_counts(body, msg, {})
        return self._reply_chat(h, body, msg, finish, usage, fault)

    def _reply_chat(self, h: _Handler, body: dict, msg: dict, finish: str, usage: dict | None,
                    fault: str | None) -> int:
        stream = bool(body.get("stream"))
        if fault == "garbage":
            payload = b"data: {not json\n\n" if stream else b"<html>upstream said: not json {</html>"
            return self._send_bytes(h, 200, payload, "text/event-stream" if stream else "application/json")
        base = {"id": "chatcmpl-" + hashlib.sha256(_canon(body).encode()).hexdigest()[:24],
                "created": int(time.time()), "model": body.get("model") or self.model,
                "system_fingerprint": "loopback"}
        if stream:
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_stream(h, stream_chunks(base, msg, finish, usage, with_usage), fault == "truncated",
                              trickle=fault == "trickle", stall=fault == "stall")
        else:
            if self.stream_s and h.loopback_due is not None:   # written at a stream's pace
                pieces = len(stream_chunks(base, msg, finish, usage, False))
                h.loopback_due += self.stream_s * max(0, pieces - 1)
            reply = {**base, "object": "chat.completion",
                     "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}]}
            if usage is not None:
                reply["usage"] = usage
            self._send_json(h, 200, reply, truncated=fault == "truncated", answered=fault != "truncated",
                            trickle=fault == "trickle")
        return 200

    def _props(self, h: _Handler, body: dict, rec: dict) -> int:
        """The server's properties as llama.cpp's server reports them (only with slots)."""
        if self.slots.count is None:
            return self._send_error(h, 404, "no route for GET /props", "not_found")
        return self._send_json(h, 200, {"total_slots": self.slots.count, "model_alias": self.model})

    def _models(self, h: _Handler, body: dict, rec: dict) -> int:
        if self.models is False:
            return self._send_error(h, 404, "this server does not list its models", "not_found")
        listed = [{"id": m, "object": "model", "created": 0, "owned_by": "flowmagic-loopback"}
                  for m in self.models]
        return self._send_json(h, 200, {"object": "list", "data": listed})

    def _embeddings(self, h: _Handler, body: dict, rec: dict) -> int:
        self._delay(h, body, rec)
        return self._send_json(h, 200, embeddings_reply(body, self.dims, self.model, self.embedder))

    # -- another process ---------------------------------------------------------------------
    @classmethod
    def spawn(cls, *, startup_timeout: float = 20.0, **options: Any) -> SpawnedLoopback:
        """Run a server in a child process (same options, minus callables); returns its handle."""
        argv = [sys.executable, "-m", "flowmagic.testing.loopback", *cli_args(options), "--exit-on-stdin-eof"]
        return SpawnedLoopback(argv, startup_timeout)


def main(argv: list[str] | None = None) -> int:
    import signal

    args = parser().parse_args(argv)
    server = LoopbackServer(latency=args.latency, seed=args.seed, faults=args.faults or None,
                            fail_first=args.fail_first, fail_kind=args.fail_kind,
                            reject_json_schema=args.reject_json_schema,
                            retry_after=args.retry_after, hang_s=args.hang_s,
                            trickle_s=args.trickle_s, dims=args.dims,
                            model=args.model, port=args.port, engine=args.engine,
                            slots=args.slots, stream_s=args.stream_s).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    if args.exit_on_stdin_eof:  # the parent died or called stop(): do not outlive it
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print(server.base_url, flush=True)
    deadline = time.monotonic() + args.lifetime if args.lifetime > 0 else math.inf
    try:
        while not done.wait(0.2) and time.monotonic() < deadline:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
