"""The bubblewrap command line of a sandbox, and what running as root adds to it.

`command(...)` builds the `bwrap` argv (see `flowmagic.engine.sandbox` for the contract):
new pid, network, ipc, uts and cgroup namespaces; an empty root with the system (/usr and
its /bin, /lib links, a few files of /etc) read-only; a fresh /proc showing only the
sandbox's processes; a minimal /dev; size-limited private /tmp and /dev/shm; the
interpreter (and, when asked, its site-packages) read-only at their own paths; the workdir
read-write and the declared inputs read-only at their own paths; nothing else of the host.

An unprivileged caller gets a new user namespace too (nested ones disabled). A process
limit (RLIMIT_NPROC) then counts only the sandbox's own processes, because the kernel
counts them per user namespace.

Root is different: a user namespace would map the code to uid 0 outside, which owns every
root file and is exempt from RLIMIT_NPROC. So as root bubblewrap builds the mounts with
full rights and then `setpriv` drops the code to an unused uid with no capabilities (the
"sandbox uid", one per workdir): it owns nothing on the host, and the process limit counts
its processes only. While code runs, the workdir is handed to that uid and handed back to
its owners afterwards (`hand_over` / `hand_back`).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import threading

from . import confined

__all__ = ["command", "runtime_dirs", "site_dirs", "sandbox_ids", "hand_over", "hand_back",
           "SHARE", "HOME", "is_within"]

SHARE = "/run/flowmagic"   # where the child script, the code and its config are seen inside
HOME = "/tmp/home"         # the code's (empty) home, on the private /tmp
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
        "/etc/localtime", "/etc/timezone")
_TOP_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")   # only what setpriv needs
_SHM_MB = 64


def _depth(path: str) -> int:
    return len([p for p in path.split(os.sep) if p])


def is_within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def _mount_parents(dests: list[str]) -> list[str]:
    """The directories bwrap must create to mount `dests`, outside every mount, by depth."""
    present = ["/usr", "/proc", "/dev", *dests]
    parents = set()
    for dest in dests:
        parent = os.path.dirname(dest)
        while parent not in ("/", "/tmp") and not any(is_within(parent, p) for p in present):
            parents.add(parent)
            parent = os.path.dirname(parent)
    return sorted(parents, key=lambda p: (_depth(p), p))


def runtime_dirs(python: str) -> list[str]:
    """Host directories the interpreter needs, beyond /usr (pyenv, conda, a build in /opt)."""
    dirs = []
    for path in (os.path.realpath(sys.base_prefix), os.path.dirname(python)):
        if not is_within(path, "/usr") and not any(is_within(path, d) for d in dirs):
            dirs.append(path)
    return dirs


def site_dirs() -> list[str]:
    """The calling interpreter's site-packages directories (never a project directory)."""
    found: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or ".")
        if os.path.basename(path) in ("site-packages", "dist-packages") and os.path.isdir(path):
            if path not in found:
                found.append(path)
    return found


def command(*, python: str, share_dir: str, workdir: str, inputs: list[tuple[str, str]],
            extra_ro: list[str], tmp_mb: int, info_fd: int, env: dict[str, str],
            ids: tuple[int, int] | None, seccomp_fd: int | None,
            script: str = "sandbox_child.py", readonly: list[str] = ()) -> list[str]:
    """The bwrap argv; `ids` is (uid, gid) to drop to as root, None for a user namespace;
    `seccomp_fd` a file holding the filter of `seccomp.program()`, if any; `script` the
    child script in the share dir that Python runs.

    `inputs` are (host path, path inside) pairs; everything else is bound at its own path.
    """
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--new-session", "--info-fd", str(info_fd), "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if ids is None:
        argv += ["--unshare-user", "--disable-userns"]
    else:
        argv += ["--cap-drop", "ALL"]
        for cap in _ROOT_CAPS:
            argv += ["--cap-add", cap]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LINKS:
        host = "/" + name
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    argv += ["--perms", "0755", "--dir", "/etc"]   # bwrap would make it 0700
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--ro-bind", os.path.join(share_dir, "passwd"), "/etc/passwd",
             "--ro-bind", os.path.join(share_dir, "group"), "/etc/group",
             "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(tmp_mb << 20), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(_SHM_MB << 20), "--tmpfs", "/dev/shm"]
    binds = [("--ro-bind", d, d) for d in extra_ro]
    binds += [("--ro-bind", share_dir, SHARE), ("--bind", os.path.realpath(workdir), workdir)]
    binds += [("--ro-bind", host, inside) for host, inside in inputs]
    binds += [("--ro-bind", path, path) for path in readonly]
    # bwrap would copy the host's modes onto the directories it makes for the mount points
    # (/root is 0700): make them 0755 first, so the sandbox's user can reach the mounts
    for path in _mount_parents([b[2] for b in binds]):
        argv += ["--perms", "0755", "--dir", path]
    # parents before children, so a workdir inside an input (or /tmp) is not hidden
    for flag, source, dest in sorted(binds, key=lambda b: _depth(b[2])):
        argv += [flag, source, dest]
    argv += ["--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv.append("--")
    if ids is not None:
        argv += [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={ids[0]}",
                 f"--regid={ids[1]}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--"]
    return argv + [python, "-I", "-S", "-B", "-X", "utf8", f"{SHARE}/{script}",
                   f"{SHARE}/config.json"]


def passwd_files(share_dir: str, uid: int, gid: int) -> None:
    """An /etc/passwd and /etc/group that name only the sandbox's user (not the host's)."""
    with open(os.path.join(share_dir, "passwd"), "w") as fh:
        fh.write(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                 f"sandbox:x:{uid}:{gid}:flowmagic sandbox:{HOME}:/bin/sh\n")
    with open(os.path.join(share_dir, "group"), "w") as fh:
        fh.write(f"root:x:0:\nsandbox:x:{gid}:\n")


# ------------------------------------------------------------------------------- as root
def _id_window(map_file: str) -> tuple[int, int]:
    """(first, count) of ids to pick from: high in the largest range this process can use."""
    try:
        with open(map_file) as fh:
            ranges = [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except OSError:
        ranges = []
    start, _, count = max(ranges, key=lambda r: r[2], default=(0, 0, 1 << 32))
    if count >= 1 << 31:
        return 0x7E000000, 1 << 24     # far above any real user or subordinate range
    return start + count // 2, max(count - count // 2 - 1, 1)


def _unused(window: tuple[int, int], key: int, known) -> int:
    first, count = window
    for step in range(64):
        candidate = first + (key + step) % count
        try:
            known(candidate)
        except KeyError:
            return candidate
    return first + key % count


def sandbox_ids(workdir: str) -> tuple[int, int]:
    """(uid, gid) the code runs as when flowmagic runs as root: unused, one per workdir."""
    import grp   # POSIX only: imported here so that flowmagic imports where they do not exist
    import pwd

    st = os.stat(workdir)
    key = hash((st.st_dev, st.st_ino)) & 0x7FFFFFFF
    return (_unused(_id_window("/proc/self/uid_map"), key, pwd.getpwuid),
            _unused(_id_window("/proc/self/gid_map"), key, grp.getgrgid))


_handover_lock = threading.Lock()
_handed: dict[str, dict] = {}   # workdir -> {"count", "owners" by inode, "default"}


def hand_over(workdir: str, ids: tuple[int, int]) -> None:
    """Give the workdir's files to the sandbox uid (once while runs on it overlap)."""
    with _handover_lock:
        entry = _handed.get(workdir)
        if entry is not None:
            entry["count"] += 1
            return
        top = os.lstat(workdir)
        owners = {top.st_ino: (top.st_uid, top.st_gid)}
        os.chown(workdir, *ids, follow_symlinks=False)
        for item in confined.walk(workdir):
            owners[item.stat.st_ino] = (item.stat.st_uid, item.stat.st_gid)
            try:
                os.chown(item.name, *ids, dir_fd=item.dir_fd, follow_symlinks=False)
            except OSError:
                continue
        _handed[workdir] = {"count": 1, "owners": owners, "default": (top.st_uid, top.st_gid)}


def hand_back(workdir: str) -> None:
    """Give the workdir back to its owners when the last run on it ended (new files: the
    workdir's owner); set-user/group-id bits are cleared, so no run leaves a setuid file."""
    with _handover_lock:
        entry = _handed[workdir]
        entry["count"] -= 1
        if entry["count"]:
            return
        del _handed[workdir]
        owners, default = entry["owners"], entry["default"]
        top = os.lstat(workdir)
        os.chown(workdir, *owners.get(top.st_ino, default), follow_symlinks=False)
        for item in confined.walk(workdir):
            st = item.stat
            try:
                os.chown(item.name, *owners.get(st.st_ino, default), dir_fd=item.dir_fd,
                         follow_symlinks=False)
            except OSError:
                continue
