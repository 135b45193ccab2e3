"""What code run in a workdir changed there, and the workdir put right after it: the modes of
what was there put back, new files without executable bits, links out of it deleted."""

from __future__ import annotations

import os
import stat

from . import bwrap, confined

__all__ = ["snapshot", "settle", "changes"]


def settle(root: str, before: dict[str, tuple]) -> list[str]:
    """After code ran in `root` (by a session, say): the modes of what was there put back,
    new files without executable bits, links out of it deleted; the files made or changed."""
    return changes(root, before)[0]


def snapshot(root: str) -> dict[str, tuple]:
    """What is under a workdir before code runs there, for `settle` (or `changes`) after it
    ran: relative path -> (type, size, mtime, inode, mode) of everything under `root`: every
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


def changes(root: str, before: dict[str, tuple]) -> tuple[list[str], list[str]]:
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
