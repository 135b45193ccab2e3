"""Starting one sandbox: its share folder (child script, code, config), the bwrap command line
or the plain child of sandbox="none", and waiting for it, killing all of it at the timeout."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

from ..errors import SandboxError
from .._internal.text import keep_ends
from .._internal.waiting import readable
from . import bwrap, seccomp

__all__ = ["NONE_WARNING", "Request", "Launch", "input_pairs", "write_share", "wait_or_kill",
           "kill_all", "namespace_init", "read_clipped"]

NONE_WARNING = ("flowmagic: sandbox='none': model-written code runs WITHOUT isolation, with "
                "your rights over your files; install bubblewrap and use sandbox='bwrap'")
_HERE = os.path.dirname(os.path.abspath(__file__))
_CHILD = os.path.join(_HERE, "sandbox_child.py")
_SESSION_CHILD = os.path.join(_HERE, "session_child.py")
_HOST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}   # bwrap's own: no keys


def _clip(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters; the middle is marked as cut."""
    return keep_ends(text, limit, "\n[... {n} characters cut ...]\n")


def read_clipped(path: str, limit: int) -> str:
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


@dataclass
class Request:
    """What one sandbox is asked for: its workdir, inputs and limits (`run_code`'s arguments)."""

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


def input_pairs(paths) -> list[tuple[str, str]]:
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


def readonly_paths(paths, workdir: str) -> list[str]:
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


def write_share(share: str, code: str, req: Request, workdir: str,
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


def namespace_init(info: bytes, proc: subprocess.Popen) -> int | None:
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


def kill_all(proc: subprocess.Popen, init_fd: int | None) -> None:
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


def wait_or_kill(proc: subprocess.Popen, info_fd: int | None, timeout: float) -> bool:
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
                    init_fd = namespace_init(bytes(info), proc)
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        kill_all(proc, init_fd)
        proc.wait()
    finally:
        if init_fd is not None:
            os.close(init_fd)
    return timed_out


class Launch:
    """The command line of one sandbox, and the descriptors bwrap is handed (the caller
    closes `info_r`, `info_w` and `filter_fd`)."""

    def __init__(self, scratch: str, share: str, workdir: str, inputs: list, req: Request,
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
                script=script, readonly=readonly_paths(req.readonly, workdir))
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
