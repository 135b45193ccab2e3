"""A long-lived interpreter in a sandbox (a flow's Python session): `spawn` starts it with the
view and limits of `run_code`; `SandboxProcess` lends it the workdir and kills all of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time

from ..errors import SandboxError
from .._internal.waiting import readable
from ..settings import check_sandbox
from . import bwrap
from .sandbox import sandbox_status
from .sandbox_launch import (Launch, Request, input_pairs, kill_all, namespace_init, read_clipped,
                             write_share)
from .workdir_changes import settle, snapshot

__all__ = ["SandboxProcess", "spawn"]


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
            return read_clipped(os.path.join(self.scratch, "stderr"), limit).strip()
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill every process of the sandbox and forget its files; safe to call twice."""
        with self._lock:
            if self.proc.returncode is None:
                kill_all(self.proc, self._init_fd)
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
    return namespace_init(bytes(info), proc) if info else None


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
    req = Request(workdir=workdir, inputs=inputs, memory_mb=int(memory_mb),
                   max_processes=int(max_processes), file_limit_mb=int(file_limit_mb),
                   max_open_files=int(max_open_files), output_limit=int(output_limit),
                   site_packages=bool(site_packages), readonly=tuple(readonly or ()))
    scratch = tempfile.mkdtemp(prefix="flowmagic-session-")
    launch = None
    try:
        ids = bwrap.sandbox_ids(workdir) if inside and os.geteuid() == 0 else None
        share = os.path.join(scratch, "share")
        write_share(share, "", req, workdir, ids, inside, session=True)
        launch = Launch(scratch, share, workdir, input_pairs(req.inputs), req, ids, inside, script)
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
