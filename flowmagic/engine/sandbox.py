"""Run model-written Python in a separate, fenced-in process; pull code out of model output.

`run_code` never executes anything in the calling process. The code runs in a new
interpreter (`python -I -B -X utf8`, plus `-S` unless `site_packages=True`) in its own
session, with a fresh temporary working directory (deleted afterwards), a minimal
environment (PATH, LANG, HOME and TMPDIR pointing at the work dir: no API keys), stdin
closed, and a wall-clock timeout after which the whole process group is killed.

The fences are set up by a prelude that runs inside the child before the model's code:
- resource limits (address space, CPU seconds, file size, open files);
- an empty network namespace (`unshare(CLONE_NEWNET)` through libc: this works when the
  child may create namespaces, e.g. as root; `SandboxResult.network` says which fence held);
- an audit hook (`sys.addaudithook`, which cannot be removed) that refuses network
  connections and name lookups, writes and renames outside the work dir, starting
  processes, raising limits, and calling C functions through ctypes.
The prelude, not a `preexec_fn`, does this because `preexec_fn` is unsafe when the caller
has threads (the executor does). Audit hooks are a Python-level fence: the namespace, the
limits, the separate process and the empty environment are the ones the OS enforces.
"""

from __future__ import annotations

import ast
import asyncio
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import textwrap
from dataclasses import asdict, dataclass

from ..errors import ConfigError, SandboxError

__all__ = ["SandboxResult", "run_code", "arun_code", "extract_code", "TESTS_FAILED"]

TESTS_FAILED = 97  # the child's exit status when the code ran but a test failed

# Runs as `python -c _PRELUDE solution.py tests.py isolation_file limits...`.
_PRELUDE = r'''
import os, sys
def _fm_setup(argv):
    sol, tests, report, mem_mb, cpu_s, fsize_mb, nofile = argv
    try:
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full file is an OSError, not a kill
        for lim, val in ((resource.RLIMIT_AS, int(mem_mb) << 20), (resource.RLIMIT_CPU, int(cpu_s)),
                         (resource.RLIMIT_FSIZE, int(fsize_mb) << 20),
                         (resource.RLIMIT_NOFILE, int(nofile)), (resource.RLIMIT_CORE, 0)):
            hard = resource.getrlimit(lim)[1]
            val = val if hard == resource.RLIM_INFINITY else min(val, hard)
            resource.setrlimit(lim, (val, val))
    except ImportError:
        pass
    network = "guard"
    try:
        import ctypes
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0:  # CLONE_NEWNET
            network = "namespace"
    except (ImportError, OSError, AttributeError):
        pass
    with open(report, "w") as fh:
        fh.write(network)
    work = os.path.realpath(os.getcwd())
    writes = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    path_events = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.chmod", "os.chown",
                   "os.link", "os.symlink", "os.truncate", "os.utime", "shutil.rmtree",
                   "shutil.move", "sqlite3.connect"}
    deny = {"socket.connect": "network access", "socket.sendto": "network access",
            "socket.sendmsg": "network access", "socket.getaddrinfo": "network access",
            "socket.gethostbyname": "network access", "socket.gethostbyaddr": "network access",
            "subprocess.Popen": "starting processes", "os.system": "starting processes",
            "os.exec": "starting processes", "os.posix_spawn": "starting processes",
            "os.spawn": "starting processes", "os.fork": "starting processes",
            "os.forkpty": "starting processes", "resource.setrlimit": "changing limits",
            "resource.prlimit": "changing limits", "ctypes.dlsym": "calling C through ctypes",
            "ctypes.dlsym/handle": "calling C through ctypes",
            "ctypes.call_function": "calling C through ctypes"}
    def inside(p):
        if isinstance(p, int) or p in (":memory:", "", b""):
            return True
        full = os.path.realpath(os.fsdecode(p))
        return full == work or full.startswith(work + os.sep) or full == os.devnull
    me = str(os.getpid())
    def other_process(p):
        # /proc/<pid>/environ of the parent holds the API keys this child's env was cleared of
        if isinstance(p, int):
            return False
        parts = os.path.realpath(os.fsdecode(p)).split(os.sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != me
    def refuse(what, detail=""):
        raise PermissionError(f"flowmagic sandbox: {what} is not allowed{detail}")
    def hook(event, args):
        if event == "open":
            if isinstance(args[2], int) and args[2] & writes and not inside(args[0]):
                refuse("writing outside the work dir", f" ({args[0]!r})")
            if other_process(args[0]):
                refuse("reading another process's /proc files", f" ({args[0]!r})")
            if not inside(args[0]) and os.path.isdir(args[0]):
                # its descriptor would let dir_fd= calls (unseen by this hook) write there
                refuse("opening a directory outside the work dir", f" ({args[0]!r})")
        elif event == "os.chdir":
            # relative paths are checked from the work dir, so it stays the cwd (else a
            # dir_fd of the work dir plus "../" from a subdirectory would reach outside)
            if isinstance(args[0], int) or os.path.realpath(os.fsdecode(args[0])) != work:
                refuse("changing the working directory")
        elif event in path_events:
            paths = args[1:2] if event == "os.symlink" else args
            for p in paths:
                if isinstance(p, (str, bytes, os.PathLike)) and not inside(p):
                    refuse(f"{event} outside the work dir", f" ({p!r})")
        elif event in deny:
            refuse(deny[event])
        elif event in ("os.kill", "os.killpg") and args[0] != os.getpid():
            refuse("signalling other processes")
    sys.addaudithook(hook)
    import posix
    def no_nodes(*a, **k):
        refuse("creating fifos and device nodes")
    # No audit event covers these: a fifo outside, or (as root) a disk's device node inside.
    os.mkfifo = os.mknod = posix.mkfifo = posix.mknod = no_nodes
    import socket
    def no_connection(*a, **k):
        refuse("network access")
    socket.create_connection = no_connection  # belt and braces: fail before any syscall
    return sol, tests
def _fm_print_tb(exc):
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != "<string>"]
    text = "".join(traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc))
    print("Traceback (most recent call last):\n" + text, end="", file=sys.stderr)  # no prelude frames
def _fm_run(path, name, ns):
    with open(path, encoding="utf-8") as fh:
        src = fh.read()
    import linecache
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # source in tracebacks
    try:
        exec(compile(src, name, "exec"), ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        _fm_print_tb(exc)
        return False
    return True
def _fm_main():
    sol, tests = _fm_setup(sys.argv[1:])
    sys.argv = ["solution.py"]
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    if not _fm_run(sol, "solution.py", ns):
        sys.exit(1)
    if not tests:
        return
    before = set(ns)
    failed = [] if _fm_run(tests, "tests.py", ns) else ["tests.py"]
    names = [k for k in ns if k not in before and k.startswith("test") and callable(ns[k])
             and getattr(getattr(ns[k], "__code__", None), "co_filename", "") == "tests.py"]
    for name in names:
        try:
            ns[name]()
        except BaseException as exc:
            print(f"FAILED {name}:", file=sys.stderr)
            _fm_print_tb(exc)
            failed.append(name)
    if failed:
        print(f"flowmagic sandbox: {len(failed)} test(s) failed: {', '.join(failed)}", file=sys.stderr)
        sys.stdout.flush()
        sys.exit(97)  # TESTS_FAILED
_fm_main()
'''


@dataclass
class SandboxResult:
    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    stage: str | None = None   # None when ok; else "code", "tests" or "timeout"
    network: str = "guard"     # "namespace" when the code ran with no network interfaces

    def to_dict(self) -> dict:
        return asdict(self)

    def error(self, limit: int = 1500) -> str:
        """Why it failed, for feedback: the timeout, or the end of stderr (the traceback)."""
        if self.ok:
            return ""
        if self.timed_out:
            return f"the code did not finish within {self.duration_s:.1f} s and was killed"
        tail = self.stderr.strip()[-limit:] or f"exit status {self.returncode} with no error output"
        return tail


def _clip(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters; the middle is marked as cut."""
    if len(text) <= limit:
        return text
    half = max(limit // 2, 1)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _read_clipped(path: str, limit: int) -> str:
    """The file's text clipped to `limit`, reading only its head and tail (it may be huge)."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        if size <= limit * 4:
            return _clip(fh.read().decode("utf-8", "replace"), limit)
        head = fh.read(limit * 2)
        fh.seek(size - limit * 2)
        tail = fh.read()
    text = head.decode("utf-8", "replace") + "\n" + tail.decode("utf-8", "replace")
    half = max(limit // 2, 1)
    return f"{text[:half]}\n[... {size - limit} bytes cut ...]\n{text[-half:]}"


def _check(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise ConfigError(f"sandbox {name} must be a number >= {low}, not {value!r}")
    return float(value)


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the child; kill its process group on timeout. True when it timed out.

    The child is left unreaped (WNOWAIT) until its group is killed, so the group id
    cannot have been reused by an unrelated process when we signal it.
    """
    deadline = time.monotonic() + timeout
    delay, timed_out = 0.002, False
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers too, not only the leader
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def run_code(code: str, *, timeout: float = 10.0, tests: str | None = None,
             memory_mb: int = 512, site_packages: bool = False, output_limit: int = 20_000,
             file_limit_mb: int = 16, max_open_files: int = 64,
             workdir: str | os.PathLike | None = None) -> SandboxResult:
    """Run `code` (then `tests`, in the same namespace) in a fenced child process.

    `tests` may be plain statements (asserts) and/or `test*` functions, which are called
    in order after the file runs. `site_packages=True` lets the code import installed
    packages such as numpy. stdout and stderr are each clipped to `output_limit` characters.
    `workdir` (kept afterwards) is the working directory and the only writable place;
    without it a fresh folder is made and deleted.
    """
    if not isinstance(code, str):
        raise SandboxError(f"run_code takes the code as a str, not {type(code).__name__}")
    timeout = _check("timeout", timeout, 0.01)
    memory_mb = int(_check("memory_mb", memory_mb, 32))
    root = tempfile.mkdtemp(prefix="flowmagic-sandbox-")
    try:
        work = os.path.realpath(workdir) if workdir is not None else os.path.join(root, "work")
        if workdir is None:
            os.mkdir(work)
        paths = {k: os.path.join(root, k) for k in ("solution.py", "tests.py", "network",
                                                   "stdout", "stderr")}
        for key, text in (("solution.py", code), ("tests.py", tests or "")):
            with open(paths[key], "w", encoding="utf-8") as fh:
                fh.write(text)
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
               "HOME": work, "TMPDIR": work, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        flags = ["-I", "-B", "-X", "utf8"] + ([] if site_packages else ["-S"])
        argv = [sys.executable, *flags, "-c", _PRELUDE, paths["solution.py"],
                paths["tests.py"] if tests and tests.strip() else "", paths["network"],
                str(memory_mb), str(math.ceil(timeout) + 1), str(int(file_limit_mb)),
                str(int(max_open_files))]
        started = time.monotonic()
        with open(paths["stdout"], "wb") as out, open(paths["stderr"], "wb") as err:
            try:
                proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start {sys.executable} for the sandbox ({exc}); "
                                   "check that the interpreter still exists") from None
            timed_out = _wait(proc, timeout)
        duration = time.monotonic() - started
        network = "guard"
        if os.path.exists(paths["network"]):
            with open(paths["network"]) as fh:
                network = fh.read().strip() or "guard"
        rc = proc.returncode
        ok = rc == 0 and not timed_out
        stage = None if ok else "timeout" if timed_out else "tests" if rc == TESTS_FAILED else "code"
        return SandboxResult(ok, rc, _read_clipped(paths["stdout"], output_limit),
                             _read_clipped(paths["stderr"], output_limit), timed_out,
                             duration, stage, network)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def arun_code(code: str, **kwargs) -> SandboxResult:
    """`run_code` in a worker thread, so an event loop keeps running meanwhile."""
    return await asyncio.to_thread(run_code, code, **kwargs)


# ---------------------------------------------------------------------------- extraction
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n`]*$")
_PY_LANGS = {"python", "py", "python3", "py3", "ipython", "python3.11", "pycon"}


def _looks_like_code(src: str) -> bool:
    """Parses as Python and does something: bare values (JSON, `42`, a word) do not count."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return any(not isinstance(s, ast.Expr) or isinstance(s.value, (ast.Call, ast.Await))
               for s in tree.body)


def extract_code(text: str) -> list[str]:
    """The Python code blocks of a model's answer, in order.

    Blocks fenced as python (```python, ```py, ~~~python ...) are taken as they are; an
    unlabelled fence is taken when its body parses as Python and is more than a bare
    value. A python fence left open at the end (a cut-off answer) is taken too.
    """
    if not isinstance(text, str):
        return []
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body, i = [], i + 1
        closed = False
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                i += 1
                break
            body.append(lines[i])
            i += 1
        src = textwrap.dedent("\n".join(body)).strip("\n")
        if not src.strip():
            continue
        if lang in _PY_LANGS or (lang == "" and closed and _looks_like_code(src)):
            blocks.append(src + "\n")
    return blocks
