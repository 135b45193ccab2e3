"""Run model-written Python isolated by the operating system; pull code out of model output.

The contract
------------
`run_code(code, *, workdir=None, inputs=(), timeout=10.0, memory_mb=512, max_processes=64,
file_limit_mb=64, output_limit=20_000, site_packages=False, tests=None, sandbox="bwrap")`
runs `code`, then `tests` in the same namespace (asserts and/or `test*` functions, called in
order), in a new Python interpreter, never in the calling process, and returns a
`SandboxResult`: ok, returncode, stdout and stderr (each clipped to `output_limit`
characters and scrubbed of the configured API keys), timed_out, duration_s, stage (None when
ok, else "code", "tests" or "timeout"), isolation ("bwrap" or "none"), workdir, and `files`:
the regular files (paths relative to workdir) the code created or changed there.
`arun_code` is the same in a worker thread, for an event loop.

- `workdir`: the code's working directory and the only host path it can write. None: a
  fresh temporary directory, deleted afterwards. Given: kept, with what the code left there,
  except symlinks it made that point outside it (on the host they would lead to your files;
  they are deleted and named in `removed_links`).
- `inputs`: host files or directories the code may read, bound read-only at their own paths.
- `readonly`: files or folders inside `workdir` bound read-only over themselves (a run's
  inputs): the code can read them, never change, replace, delete or chmod them. Each must be
  a regular file or a folder, not a link (bwrap only).
- `site_packages=True`: the calling interpreter's site-packages are importable (read-only).
- limits: `timeout` seconds of wall clock, after which the whole sandbox is killed,
  grandchildren and setsid daemons included; CPU seconds (timeout + 1) and `memory_mb` of
  address space per process; `max_processes` processes and threads in all; `file_limit_mb`
  per file written (stdout and stderr included); a private /tmp of memory_mb / 2.

`sandbox="bwrap"` (the default) runs it under bubblewrap (see `bwrap.py` for the exact
view): new user, pid, network, ipc, uts and cgroup namespaces, the system read-only, no
network, an empty home, no view of the host's processes or of the user's files beyond the
workdir and the inputs, no API key in its environment, and `--die-with-parent`. As root the
code runs as an unused uid with no capabilities (see `bwrap.py`). `sandbox_status()` says
whether bubblewrap can run here and, if not, why and what to do, in one line; `run_code`
raises SandboxError with that line rather than running the code any other way.

`sandbox="none"` is the documented opt-out for machines without bubblewrap: the code runs in
a plain child process with the same limits and an environment without keys, but with the
user's rights (it can read and write the user's files). It prints a warning on every run.
"""

from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError, SandboxError
from ..json_extract import FENCE_LINE
from .._internal.text import keep_ends
from .._internal.waiting import readable
from ..llm.endpoints import scrub
from ..settings import SANDBOXES, check_sandbox
from . import bwrap, confined, seccomp

__all__ = ["snapshot", "settle", "SandboxResult", "SandboxStatus", "SandboxProcess", "run_code", "arun_code", "spawn",
           "sandbox_status",
           "check_sandbox", "extract_code", "TESTS_FAILED", "SANDBOXES"]

TESTS_FAILED = 97      # the child's exit status when the code ran but a test failed
NONE_WARNING = ("flowmagic: sandbox='none': model-written code runs WITHOUT isolation, with "
                "your rights over your files; install bubblewrap and use sandbox='bwrap'")
_HERE = os.path.dirname(os.path.abspath(__file__))
_CHILD = os.path.join(_HERE, "sandbox_child.py")
_SESSION_CHILD = os.path.join(_HERE, "session_child.py")
_HOST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}   # bwrap's own: no keys


@dataclass
class SandboxResult:
    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    stage: str | None = None      # None when ok; else "code", "tests" or "timeout"
    isolation: str = "bwrap"      # "bwrap", or "none" when the user opted out
    workdir: str | None = None    # None when it was a temporary one, now deleted
    files: list[str] = field(default_factory=list)          # created or changed, relative
    removed_links: list[str] = field(default_factory=list)  # symlinks out of workdir, deleted
    output_bytes: int = 0         # of the longer of stdout and stderr, before clipping

    def to_dict(self) -> dict:
        return asdict(self)

    def error(self, limit: int = 1500) -> str:
        """Why it failed, for feedback: the timeout, or the end of stderr (the traceback)."""
        if self.ok:
            return ""
        if self.timed_out:
            return f"the code did not finish within {self.duration_s:.1f} s and was killed"
        tail = self.stderr.strip()[-limit:]
        if tail:
            return tail
        code = self.returncode or 0
        if code < 0 or code > 128:
            number = -code if code < 0 else code - 128
            try:
                return f"the code was killed by {signal.Signals(number).name} (a limit was hit)"
            except ValueError:
                pass
        return f"exit status {code} with no error output"


@dataclass(frozen=True)
class SandboxStatus:
    available: bool
    reason: str   # one line: why code cannot run here and what to do ("" when it can)
    mode: str     # "user namespace", "root, as an unused uid", or "" when unavailable

    def __bool__(self) -> bool:
        return self.available


# ------------------------------------------------------------------------------ helpers
def _clip(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters; the middle is marked as cut."""
    return keep_ends(text, limit, "\n[... {n} characters cut ...]\n")


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


def _number(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise ConfigError(f"sandbox {name} must be a number >= {low}, not {value!r}")
    return float(value)


def snapshot(root: str) -> dict[str, tuple]:
    """What is under a workdir before code runs there, for `settle` after it ran."""
    return _snapshot(root)


def settle(root: str, before: dict[str, tuple]) -> list[str]:
    """After code ran in `root` (by a session, say): the modes of what was there put back,
    new files without executable bits, links out of it deleted; the files made or changed."""
    return _changes(root, before)[0]


def _snapshot(root: str) -> dict[str, tuple]:
    """relative path -> (type, size, mtime, inode, mode) of everything under `root`: every
    entry, however many and however deep, no symlink followed (engine.confined.walk)."""
    return {e.rel: (stat.S_IFMT(e.stat.st_mode), e.stat.st_size, e.stat.st_mtime_ns,
                    e.stat.st_ino, stat.S_IMODE(e.stat.st_mode)) for e in confined.walk(root)}


def _points_out(entry: confined.Entry, root: str, real_root: str) -> bool:
    path = os.path.join(root, entry.rel)
    try:
        return not bwrap.is_within(os.path.realpath(path, strict=True), real_root)
    except (OSError, RecursionError, ValueError):   # dangling, a loop, too long: not kept either
        return True


def _set_mode(entry: confined.Entry, mode: int) -> None:
    """chmod the entry itself, through a descriptor checked to be it (never a link)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(entry.name, flags, dir_fd=entry.dir_fd)
    except OSError:
        return
    try:
        if os.fstat(fd).st_ino == entry.stat.st_ino:
            os.fchmod(fd, mode)
    except OSError:
        pass
    finally:
        os.close(fd)


def _changes(root: str, before: dict[str, tuple]) -> tuple[list[str], list[str]]:
    """(files created or changed, symlinks pointing out of root that were deleted), after
    the modes are put back: what was there gets the mode it had, a new file loses its
    executable and set-id bits (nothing the code wrote is left ready to run)."""
    files, removed = [], []
    real_root = os.path.realpath(root)
    modes = {info[3]: info[4] for info in before.values()}
    for entry in confined.walk(root):
        kind, mode = stat.S_IFMT(entry.stat.st_mode), stat.S_IMODE(entry.stat.st_mode)
        old = modes.get(entry.stat.st_ino)
        if kind in (stat.S_IFREG, stat.S_IFDIR) and old is not None and old != mode:
            _set_mode(entry, old)
        elif kind == stat.S_IFREG and old is None and mode & 0o7111:
            _set_mode(entry, mode & ~0o7111)
        info = before.get(entry.rel)
        if info is not None and info[:4] == (kind, entry.stat.st_size, entry.stat.st_mtime_ns,
                                             entry.stat.st_ino):
            continue
        if kind == stat.S_IFREG:
            files.append(entry.rel)
        elif kind == stat.S_IFLNK and _points_out(entry, root, real_root):
            try:
                os.unlink(entry.name, dir_fd=entry.dir_fd)
                removed.append(entry.rel)
            except OSError:
                pass
    return sorted(files), sorted(removed)


# ------------------------------------------------------------------------------ status
_status: SandboxStatus | None = None
_status_lock = threading.Lock()


def _unavailable(why: str) -> SandboxStatus:
    return SandboxStatus(False, f"code execution is off: {why}; or opt out of isolation with "
                                "sandbox='none' (unsafe, see the README)", "")


def _probe() -> SandboxStatus:
    if not sys.platform.startswith("linux"):
        return _unavailable(f"model-written code runs only under bubblewrap, which needs Linux "
                            f"(this is {sys.platform}): run flowmagic on Linux, or in WSL2 on Windows")
    if shutil.which("bwrap") is None:
        return _unavailable("bubblewrap is not installed: install it (apt-get install "
                            "bubblewrap, dnf install bubblewrap, pacman -S bubblewrap)")
    root = os.geteuid() == 0
    if root and shutil.which("setpriv") is None:
        return _unavailable("as root the sandbox drops to an unused uid with setpriv, which is "
                            "missing: install util-linux")
    try:
        result = _run("import sys; print('ok', sys.version_info[0])", _Request(timeout=20.0),
                      "bwrap")
    except SandboxError as exc:
        return _unavailable(str(exc))
    if result.ok and result.stdout.strip() == "ok 3":
        return SandboxStatus(True, "", "root, as an unused uid" if root else "user namespace")
    line = (result.stderr.strip().splitlines() or [result.error()])[-1][:200]
    return _unavailable(f"bubblewrap cannot start a sandbox here ({line}): allow unprivileged "
                        "user namespaces (sysctl kernel.unprivileged_userns_clone=1, or a "
                        "container runtime that permits them)")


def sandbox_status(*, refresh: bool = False) -> SandboxStatus:
    """Whether bubblewrap can run code here (checked once by starting a sandbox, then cached)."""
    global _status
    with _status_lock:
        if _status is None or refresh:
            _status = _probe()
        return _status


# ------------------------------------------------------------------------------ running
@dataclass
class _Request:
    workdir: str | None = None
    inputs: tuple = ()
    timeout: float = 10.0
    memory_mb: int = 512
    max_processes: int = 64
    file_limit_mb: int = 64
    max_open_files: int = 256
    output_limit: int = 20_000
    site_packages: bool = False
    tests: str | None = None
    readonly: tuple = ()


def _inputs(paths) -> list[tuple[str, str]]:
    """(real host path, path inside) of each declared input; one line for a missing one."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    pairs = []
    for path in paths or ():
        inside = os.path.abspath(os.fspath(path))
        if not os.path.exists(inside):
            raise SandboxError(f"input {inside} does not exist; declare only existing files "
                               "or directories as inputs")
        real = os.path.realpath(inside)
        if os.geteuid() == 0 and not os.stat(real).st_mode & stat.S_IROTH:
            raise SandboxError(f"input {inside} is not readable by others, and as root the "
                               "sandbox reads it as an unused uid: chmod o+r it")
        pairs.append((real, inside))
    return pairs


def _readonly(paths, workdir: str) -> list[str]:
    """The paths inside `workdir` to bind read-only over themselves: each a file or a folder
    inside it, never a link (bubblewrap, as root, would follow one anywhere)."""
    out = []
    for path in paths or ():
        path = os.path.abspath(os.fspath(path))
        if not bwrap.is_within(path, workdir) or path == workdir:
            raise SandboxError(f"{path} is not inside the workdir {workdir}; only files inside "
                               "it can be made read-only there")
        try:
            kind = stat.S_IFMT(os.lstat(path).st_mode)
        except OSError:
            continue   # gone: nothing to protect
        if kind not in (stat.S_IFREG, stat.S_IFDIR):
            raise SandboxError(f"{path} is not a regular file or a folder; it cannot be made "
                               "read-only in the sandbox")
        out.append(path)
    return out


def _seccomp_file(scratch: str) -> int | None:
    """A descriptor of the seccomp filter for bwrap to load, or None on other machines."""
    program = seccomp.program()
    if not program:
        return None
    path = os.path.join(scratch, "seccomp.bpf")
    with open(path, "wb") as fh:
        fh.write(program)
    return os.open(path, os.O_RDONLY)


def _write_share(share: str, code: str, req: _Request, workdir: str,
                 ids: tuple[int, int] | None, inside: bool, session: bool = False) -> dict:
    """The child script, the code, its tests and the config, in the read-only share dir
    (for a session: both child scripts, and no code: cells come through its pipe)."""
    os.makedirs(share, mode=0o755)
    base = bwrap.SHARE if inside else share
    for name, text in (() if session else (("solution.py", code), ("tests.py", req.tests or ""))):
        with open(os.path.join(share, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    shutil.copyfile(_CHILD, os.path.join(share, "sandbox_child.py"))
    if session:
        shutil.copyfile(_SESSION_CHILD, os.path.join(share, "session_child.py"))
    uid, gid = ids or (os.getuid(), os.getgid())
    bwrap.passwd_files(share, uid, gid)
    config = {"workdir": workdir, "memory_mb": int(req.memory_mb),
              # a session's cells set their own CPU limit (session_child.py)
              "cpu_s": None if session else math.ceil(req.timeout) + 1,
              "file_limit_mb": int(req.file_limit_mb),
              "max_open_files": int(req.max_open_files),
              # outside a user namespace the count would include all of the user's processes
              "max_processes": int(req.max_processes) if inside else None,
              "site_dirs": bwrap.site_dirs() if req.site_packages else [],
              "output_limit": int(req.output_limit),
              "sweep": inside,   # a session may kill what its cells left: /proc is its own
              "solution": f"{base}/solution.py",
              "tests": f"{base}/tests.py" if req.tests and req.tests.strip() else ""}
    with open(os.path.join(share, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    for name in os.listdir(share):
        os.chmod(os.path.join(share, name), 0o644)
    return config


def _child_env(inside: bool, home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
            "TMPDIR": "/tmp" if inside else os.path.dirname(home), "USER": "sandbox",
            "LOGNAME": "sandbox", "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": os.path.join(os.path.dirname(home), "matplotlib"),
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _read_info(fd: int, proc: subprocess.Popen, buffer: bytearray) -> bool:
    """Read what bwrap wrote on its info fd; True at end of file."""
    while readable(fd, 0):
        chunk = os.read(fd, 4096)
        if not chunk:
            return True
        buffer.extend(chunk)
    return False


def _namespace_init(info: bytes, proc: subprocess.Popen) -> int | None:
    """A pidfd (or pid) of the sandbox's pid 1, checked to be bwrap's own child."""
    try:
        pid = int(json.loads(info.decode())["child-pid"])
        with open(f"/proc/{pid}/stat") as fh:
            parent = int(fh.read().rsplit(")", 1)[1].split()[1])
    except (ValueError, KeyError, OSError, IndexError):
        return None
    if parent != proc.pid:
        return None
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _kill_all(proc: subprocess.Popen, init_fd: int | None) -> None:
    """Kill the sandbox: its pid 1 first (the kernel then kills every process of the
    namespace, setsid ones too), then bwrap's process group."""
    if init_fd is not None:
        try:
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(proc: subprocess.Popen, info_fd: int | None, timeout: float) -> bool:
    """Wait for the sandbox; kill all of it at the timeout. True when it timed out.

    bwrap is left unreaped (WNOWAIT) until then, so neither its pid nor its process group
    can have been reused when they are signalled.
    """
    deadline = time.monotonic() + timeout
    delay, timed_out, info, init_fd, info_done = 0.002, False, bytearray(), None, info_fd is None
    try:
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if not info_done:
                info_done = _read_info(info_fd, proc, info)
                if info_done:
                    init_fd = _namespace_init(bytes(info), proc)
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        _kill_all(proc, init_fd)
        proc.wait()
    finally:
        if init_fd is not None:
            os.close(init_fd)
    return timed_out


class _Launch:
    """The command line of one sandbox, and the descriptors bwrap is handed (the caller
    closes `info_r`, `info_w` and `filter_fd`)."""

    def __init__(self, scratch: str, share: str, workdir: str, inputs: list, req: _Request,
                 ids: tuple[int, int] | None, inside: bool, script: str = "sandbox_child.py"):
        python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
        self.info_r = self.info_w = self.filter_fd = None
        if inside:
            self.info_r, self.info_w = os.pipe()
            self.filter_fd = _seccomp_file(scratch)
            self.argv = bwrap.command(
                python=python, share_dir=share, workdir=workdir, inputs=inputs,
                extra_ro=bwrap.runtime_dirs(python) + (bwrap.site_dirs() if req.site_packages
                                                       else []),
                tmp_mb=max(int(req.memory_mb) // 2, 16), info_fd=self.info_w,
                env=_child_env(True, bwrap.HOME), ids=ids, seccomp_fd=self.filter_fd,
                script=script, readonly=_readonly(req.readonly, workdir))
            self.cwd, self.env = "/", _HOST_ENV
            self.fds = ((self.info_w,) if self.filter_fd is None
                        else (self.info_w, self.filter_fd))
        else:
            print(NONE_WARNING, file=sys.stderr)
            home = os.path.join(scratch, "tmp", "home")
            os.makedirs(home)
            self.argv = [python, "-I", "-S", "-B", "-X", "utf8", os.path.join(share, script),
                         os.path.join(share, "config.json")]
            self.cwd, self.env, self.fds = workdir, _child_env(False, home), ()


def _run(code: str, req: _Request, sandbox: str) -> SandboxResult:
    inside = sandbox == "bwrap"
    scratch = tempfile.mkdtemp(prefix="flowmagic-sandbox-")
    temporary = req.workdir is None
    workdir = os.path.join(scratch, "work") if temporary else os.path.abspath(req.workdir)
    ids = None
    handed = False
    info_r = info_w = filter_fd = None
    try:
        if temporary:
            os.mkdir(workdir)
        elif not os.path.isdir(workdir):
            raise SandboxError(f"workdir {workdir} is not a directory; create it first")
        inputs = _inputs(req.inputs)
        if inside and os.geteuid() == 0:
            ids = bwrap.sandbox_ids(workdir)
        share = os.path.join(scratch, "share")
        _write_share(share, code, req, workdir, ids, inside)
        before = _snapshot(workdir)
        launch = _Launch(scratch, share, workdir, inputs, req, ids, inside)
        argv, cwd, env, fds = launch.argv, launch.cwd, launch.env, launch.fds
        info_r, info_w, filter_fd = launch.info_r, launch.info_w, launch.filter_fd
        if ids is not None:
            bwrap.hand_over(workdir, ids)
            handed = True
        out_path, err_path = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        started = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=err, start_new_session=True,
                                        pass_fds=fds)
            except OSError as exc:
                raise SandboxError(f"could not start {argv[0]} for the sandbox ({exc}); check "
                                   "that it is installed") from None
            if info_w is not None:
                os.close(info_w)
                info_w = None
            timed_out = _wait(proc, info_r, req.timeout)
        duration = time.monotonic() - started
        if handed:
            bwrap.hand_back(workdir)
            handed = False
        files, removed = _changes(workdir, before)
        rc = proc.returncode
        ok = rc == 0 and not timed_out
        stage = None if ok else "timeout" if timed_out else "tests" if rc == TESTS_FAILED else "code"
        return SandboxResult(ok, rc, scrub(_read_clipped(out_path, req.output_limit)),
                             scrub(_read_clipped(err_path, req.output_limit)), timed_out,
                             duration, stage, sandbox, None if temporary else workdir,
                             files, removed,
                             max(os.path.getsize(out_path), os.path.getsize(err_path)))
    finally:
        if handed:
            bwrap.hand_back(workdir)
        for fd in (info_r, info_w, filter_fd):
            if fd is not None:
                os.close(fd)
        confined.remove_tree(scratch)   # (the code may have left a tree 10,000 deep)


def run_code(code: str, *, workdir: str | os.PathLike | None = None, inputs=(),
             timeout: float = 10.0, memory_mb: int = 512, max_processes: int = 64,
             file_limit_mb: int = 64, output_limit: int = 20_000, site_packages: bool = False,
             tests: str | None = None, sandbox: str = "bwrap",
             max_open_files: int = 256, readonly=()) -> SandboxResult:
    """Run `code` (then `tests`) isolated from this process; see the module docstring."""
    if not isinstance(code, str):
        raise SandboxError(f"run_code takes the code as a str, not {type(code).__name__}")
    check_sandbox(sandbox)
    req = _Request(
        workdir=os.fspath(workdir) if workdir is not None else None, inputs=inputs,
        timeout=_number("timeout", timeout, 0.01),
        memory_mb=int(_number("memory_mb", memory_mb, 32)),
        max_processes=int(_number("max_processes", max_processes, 1)),
        file_limit_mb=int(_number("file_limit_mb", file_limit_mb, 1)),
        max_open_files=int(_number("max_open_files", max_open_files, 16)),
        output_limit=int(_number("output_limit", output_limit, 100)),
        site_packages=bool(site_packages), tests=tests, readonly=tuple(readonly or ()))
    if sandbox == "bwrap":
        status = sandbox_status()
        if not status.available:
            raise SandboxError(status.reason)
    return _run(code, req, sandbox)


async def arun_code(code: str, **kwargs) -> SandboxResult:
    """`run_code` in a worker thread, so an event loop keeps running meanwhile."""
    return await asyncio.to_thread(run_code, code, **kwargs)


# ------------------------------------------------------------------------ long-lived
class SandboxProcess:
    """A long-lived interpreter in a sandbox (see `spawn`): `stdin` and `stdout` are its
    pipes; `lend()` gives it the workdir while it runs code (as root), `kill()` ends all of
    it. It dies with the thread that spawned it (bwrap's --die-with-parent)."""

    def __init__(self, proc: subprocess.Popen, scratch: str, workdir: str,
                 ids: tuple[int, int] | None, isolation: str, init_fd: int | None):
        self.proc, self.scratch, self.workdir = proc, scratch, workdir
        self.ids, self.isolation, self._init_fd = ids, isolation, init_fd
        self.stdin, self.stdout = proc.stdin, proc.stdout
        self._lock = threading.Lock()
        self._before: dict = {}
        self.changed: list[str] = []   # files made or changed by the last lent work

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def lend(self) -> "SandboxProcess":
        """`with process.lend():` around a piece of work: the workdir belongs to the sandbox's
        uid meanwhile (as root), and afterwards, as after `run_code`, modes are put back,
        symlinks out of it deleted, and `changed` lists the files the work made or changed."""
        return self

    def __enter__(self):
        self._before = snapshot(self.workdir)
        if self.ids is not None:
            bwrap.hand_over(self.workdir, self.ids)
        return self

    def __exit__(self, *exc) -> None:
        if self.ids is not None:
            bwrap.hand_back(self.workdir)
        self.changed = settle(self.workdir, self._before)

    def errors(self, limit: int = 600) -> str:
        """The end of what bwrap and the interpreter wrote on stderr (why it did not start)."""
        try:
            return _read_clipped(os.path.join(self.scratch, "stderr"), limit).strip()
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill every process of the sandbox and forget its files; safe to call twice."""
        with self._lock:
            if self.proc.returncode is None:
                _kill_all(self.proc, self._init_fd)
                self.proc.wait()
            if self._init_fd is not None:
                os.close(self._init_fd)
                self._init_fd = None
            for pipe in (self.stdin, self.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            shutil.rmtree(self.scratch, ignore_errors=True)


def _await_init(info_r: int, proc: subprocess.Popen, seconds: float = 20.0) -> int | None:
    """A pidfd of the sandbox's pid 1, once bwrap has said which it is (None if it did not)."""
    info, deadline = bytearray(), time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if readable(info_r, 0.05):
            chunk = os.read(info_r, 4096)
            if not chunk:
                break
            info.extend(chunk)
            if info.rstrip().endswith(b"}"):
                break
    return _namespace_init(bytes(info), proc) if info else None


def spawn(script: str, *, workdir: str | os.PathLike, inputs=(), memory_mb: int = 2048,
          max_processes: int = 64, file_limit_mb: int = 64, max_open_files: int = 256,
          output_limit: int = 20_000, site_packages: bool = True,
          sandbox: str = "bwrap", readonly=()) -> SandboxProcess:
    """Start `script` ("session_child.py", a child script of this folder) in a sandbox with
    the same view and limits as `run_code`, except CPU time, which the script sets per piece
    of work; it reads its config and talks over its stdin and stdout."""
    check_sandbox(sandbox)
    inside = sandbox == "bwrap"
    if inside:
        status = sandbox_status()
        if not status.available:
            raise SandboxError(status.reason)
    workdir = os.path.abspath(os.fspath(workdir))
    if not os.path.isdir(workdir):
        raise SandboxError(f"workdir {workdir} is not a directory; create it first")
    req = _Request(workdir=workdir, inputs=inputs, memory_mb=int(memory_mb),
                   max_processes=int(max_processes), file_limit_mb=int(file_limit_mb),
                   max_open_files=int(max_open_files), output_limit=int(output_limit),
                   site_packages=bool(site_packages), readonly=tuple(readonly or ()))
    scratch = tempfile.mkdtemp(prefix="flowmagic-session-")
    launch = None
    try:
        ids = bwrap.sandbox_ids(workdir) if inside and os.geteuid() == 0 else None
        share = os.path.join(scratch, "share")
        _write_share(share, "", req, workdir, ids, inside, session=True)
        launch = _Launch(scratch, share, workdir, _inputs(req.inputs), req, ids, inside, script)
        with open(os.path.join(scratch, "stderr"), "wb") as err:
            try:
                proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=launch.env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=err, start_new_session=True, pass_fds=launch.fds)
            except OSError as exc:
                raise SandboxError(f"could not start {launch.argv[0]} for the sandbox ({exc}); "
                                   "check that it is installed") from None
        if launch.info_w is not None:
            os.close(launch.info_w)
            launch.info_w = None
        init_fd = _await_init(launch.info_r, proc) if launch.info_r is not None else None
        return SandboxProcess(proc, scratch, workdir, ids, sandbox, init_fd)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        for fd in ((launch.info_r, launch.info_w, launch.filter_fd) if launch else ()):
            if fd is not None:
                os.close(fd)


# ---------------------------------------------------------------------------- extraction
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
        m = FENCE_LINE.match(lines[i])
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
