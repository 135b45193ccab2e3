"""Find the user's own local OpenAI-compatible server before falling back to the embedded model.

With nothing configured, `endpoints` asks `found()` once per process: each usual port on
127.0.0.1 (Ollama 11434, LM Studio 1234, llama.cpp 8080, vLLM 8000) gets a TCP connect
of at most 0.2 s and, when something listens, one GET of /v1/models (0.8 s). The first
server that lists a chat model wins, with its best chat model (embedding, rerank and
speech models left out; then an instruct/chat name, then the larger size in the name).

FLOWMAGIC_DISCOVER=0 turns it off (the test suite does, so a developer's Ollama cannot
change a test); FLOWMAGIC_DISCOVER_PORTS="11434,8080" or "9000=vLLM" picks the ports.

What a server lists is untrusted: anyone on the machine can bind one of these ports. An id
that is not a model name of the safe alphabet (`model.names`: no line break, brace, quote,
control character, at most 200 characters) is dropped, and one line per server says so, so
it never reaches a configuration cell, a magic line, the store or the panel.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import urllib.request
from dataclasses import dataclass, field

from ..model.names import is_model_name, model_name_problem

__all__ = ["Server", "PORTS", "ports", "scan", "found", "chosen", "best_chat_model", "enabled",
           "forget", "list_models", "model_ids", "chat_models"]

PORTS: tuple[tuple[int, str], ...] = ((11434, "Ollama"), (1234, "LM Studio"),
                                      (8080, "llama.cpp"), (8000, "vLLM"))
_NOT_CHAT = re.compile(r"embed|bge|minilm|e5-|gte-|rerank|whisper|tts|clip|nomic|colbert|"
                       r"dall-e|moderation|davinci|babbage", re.I)
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([bm])\b", re.I)

_lock = threading.Lock()
_cache: list | None = None
_announced = False
_refused: set[str] = set()   # base URLs whose bad ids were reported
_refused_lock = threading.Lock()   # not _lock: found() holds that while it scans


@dataclass
class Server:
    kind: str                      # "Ollama", "LM Studio", ...
    base_url: str                  # http://127.0.0.1:PORT/v1
    models: list[str] = field(default_factory=list)

    @property
    def model(self) -> str | None:
        return best_chat_model(self.models)


def enabled() -> bool:
    return os.environ.get("FLOWMAGIC_DISCOVER", "1").strip().lower() not in ("0", "no", "false", "off")


def ports() -> list[tuple[int, str]]:
    """The (port, kind) pairs to look at: FLOWMAGIC_DISCOVER_PORTS, else PORTS."""
    raw = os.environ.get("FLOWMAGIC_DISCOVER_PORTS", "").strip()
    if not raw:
        return list(PORTS)
    known = dict(PORTS)
    out = []
    for item in raw.split(","):
        port, _, kind = item.strip().partition("=")
        if port.isdigit():
            out.append((int(port), kind or known.get(int(port), "server")))
    return out


def _size(name: str) -> float:
    m = _SIZE.search(name.replace("_", "-"))
    if not m:
        return 0.0
    return float(m.group(1)) * (1.0 if m.group(2).lower() == "b" else 0.001)


def chat_models(ids: list[str]) -> list[str]:
    """The ids that can run a node (embedding, rerank, speech, image and moderation models
    left out)."""
    return [m for m in ids if not _NOT_CHAT.search(m)]


def best_chat_model(models: list[str]) -> str | None:
    """The model to plan with: not an embedding/rerank/speech one; an instruct or chat
    name first, then the larger parameter count in the name, then the order listed."""
    chat = chat_models(models)
    if not chat:
        return None
    order = {m: i for i, m in enumerate(chat)}
    return min(chat, key=lambda m: (not re.search(r"instruct|chat|-it\b|:latest", m, re.I),
                                    -_size(m), order[m]))


def _listening(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def list_models(base_url: str, timeout: float, api_key: str = "") -> list[str] | None:
    """The model ids an OpenAI-compatible server lists (GET /models), or None when it cannot."""
    request = urllib.request.Request(f"{base_url}/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read(4_000_000))
    except (OSError, ValueError):
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ids = [m["id"] for m in items if isinstance(m, dict) and m.get("id")]
    ids = [str(i) if isinstance(i, int) and not isinstance(i, bool) else i for i in ids]
    return model_ids(base_url, ids)


def model_ids(base_url: str, ids: list) -> list[str]:
    """The ids that are model names; the others dropped with one line (once per server)."""
    good = [i for i in ids if is_model_name(i)]
    if len(good) < len(ids):
        with _refused_lock:
            first = base_url not in _refused
            _refused.add(base_url)
        if first:
            bad = next(i for i in ids if not is_model_name(i))
            print(f"flowmagic: ignored {len(ids) - len(good)} of the {len(ids)} model ids "
                  f"{base_url} lists, which are not model names ({model_name_problem(bad)}); "
                  "a server you do not know may be listening on that port", flush=True)
    return good


def scan(connect_timeout: float = 0.2, http_timeout: float = 0.8) -> list[Server]:
    """Every OpenAI-compatible server on the usual local ports that lists models."""
    out = []
    for port, kind in ports():
        if not _listening(port, connect_timeout):
            continue
        base_url = f"http://127.0.0.1:{port}/v1"
        models = list_models(base_url, http_timeout)
        if models is not None:
            out.append(Server(kind, base_url, models))
    return out


def found() -> list[Server]:
    """`scan()` once per process (empty when FLOWMAGIC_DISCOVER=0)."""
    global _cache
    if not enabled():
        return []
    with _lock:
        if _cache is None:
            _cache = scan()
        return list(_cache)


def chosen() -> Server | None:
    """The first server found with a chat model; the first time, one line says so."""
    global _announced
    server = next((s for s in found() if s.model), None)
    if server is not None and not _announced:
        _announced = True
        print(f"flowmagic: using {server.kind} at {server.base_url} with its model "
              f"{server.model} (found running; set FLOWMAGIC_DISCOVER=0 for the embedded "
              "model, or configure an endpoint)", flush=True)
    return server


def forget() -> None:
    """Scan again, and say again what is used, on the next call (tests, a new server)."""
    global _cache, _announced
    with _lock:
        _cache, _announced = None, False
    with _refused_lock:
        _refused.clear()
