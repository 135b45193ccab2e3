"""Run model-written Python isolated by the operating system.

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

Where the parts are: `sandbox_launch` (the share folder, the command line, waiting and
killing), `workdir_changes` (what the code changed, the workdir put right),
`sandbox_process` (`spawn`: a long-lived sandboxed interpreter) and `code_blocks`
(`extract_code`: the Python of a model's answer).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError, SandboxError
from ..llm.endpoints import scrub
from ..settings import SANDBOXES, check_sandbox
from . import bwrap, confined
from .sandbox_launch import (Launch, Request, input_pairs, read_clipped, wait_or_kill,
                             write_share)
from .workdir_changes import changes, snapshot

__all__ = ["SandboxResult", "SandboxStatus", "run_code", "arun_code", "sandbox_status",
           "check_sandbox", "TESTS_FAILED", "SANDBOXES"]

TESTS_FAILED = 97      # the child's exit status when the code ran but a test failed


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


def _number(name: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise ConfigError(f"sandbox {name} must be a number >= {low}, not {value!r}")
    return float(value)


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
        result = _run("import sys; print('ok', sys.version_info[0])", Request(timeout=20.0),
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


def _run(code: str, req: Request, sandbox: str) -> SandboxResult:
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
        inputs = input_pairs(req.inputs)
        if inside and os.geteuid() == 0:
            ids = bwrap.sandbox_ids(workdir)
        share = os.path.join(scratch, "share")
        write_share(share, code, req, workdir, ids, inside)
        before = snapshot(workdir)
        launch = Launch(scratch, share, workdir, inputs, req, ids, inside)
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
            timed_out = wait_or_kill(proc, info_r, req.timeout)
        duration = time.monotonic() - started
        if handed:
            bwrap.hand_back(workdir)
            handed = False
        files, removed = changes(workdir, before)
        rc = proc.returncode
        ok = rc == 0 and not timed_out
        stage = None if ok else "timeout" if timed_out else "tests" if rc == TESTS_FAILED else "code"
        return SandboxResult(ok, rc, scrub(read_clipped(out_path, req.output_limit)),
                             scrub(read_clipped(err_path, req.output_limit)), timed_out,
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
    req = Request(
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
