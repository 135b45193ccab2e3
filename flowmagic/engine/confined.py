"""The one door through which flowmagic, on the host, touches the files under a folder that
model-written code can write (a run's workspace).

Model code can leave anything there: symlinks to the user's files, FIFOs, sockets, trees
thousands of levels deep or wide, files of gigabytes. Whatever it left, going through this
module never reaches a file outside the folder, never blocks on a FIFO, never recurses:

- Every name is opened one component at a time from a descriptor of the folder
  (`openat` with `O_NOFOLLOW`, `O_DIRECTORY` for folders), so no symlink is followed, not
  even one swapped in between a check and a use; the root itself is the only path resolved.
- Only regular files are read or written: a file is opened with `O_NONBLOCK` (a FIFO opens
  at once instead of waiting for a writer) and `fstat` of the open descriptor decides.
- `walk` visits every entry, iteratively, holding one directory descriptor at a time
  (it climbs back through "..", checked to be the folder it came from): a depth of 50,000 or
  a million entries costs time in proportion, never a RecursionError, and nothing is
  skipped. Callers cap what they *report*, never what is checked.
- Names flowmagic is asked to write are checked first (`parts`): relative, no "." or "..",
  no empty or NUL component, at most `MAX_NAME_BYTES` bytes a component and `MAX_DEPTH`
  levels; a bad one is one line (WorkspaceError), never an OSError or a RecursionError.

Everything here raises WorkspaceError (a FlowError) for what the folder's contents or a
name make impossible; the caller decides whether that fails a node or is skipped.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import subprocess
import stat
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from ..errors import WorkspaceError

__all__ = ["MAX_NAME_BYTES", "MAX_DEPTH", "Entry", "parts", "walk", "file_stat",
           "read_bytes", "read_head", "write_bytes", "make_dirs", "exists", "opened",
           "write_stream", "remove_tree"]

MAX_NAME_BYTES = 255   # of one component, as Linux file systems allow
MAX_DEPTH = 32         # folders of a name flowmagic writes (a deliverable, an input)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {stat.S_IFLNK: "a symlink", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
          stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFDIR: "a folder"}


@dataclass(frozen=True)
class Entry:
    """One entry met by `walk`. `dir_fd` is its folder's descriptor, open only until the
    walk moves on (for `os.chown(name, dir_fd=...)` and the like)."""
    rel: str
    name: str
    dir_fd: int
    stat: os.stat_result


def _short(rel: str) -> str:
    return rel if len(rel) <= 80 else f"{rel[:60]}…({len(rel)} characters)"


def parts(rel: str) -> list[str]:
    """The components of a relative name flowmagic may create, or WorkspaceError (one line)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise WorkspaceError(f"file name {rel!r} is empty or not text; give a relative file name")
    if rel.startswith("/"):
        raise WorkspaceError(f"file name {_short(rel)!r} is absolute; give a name relative "
                             "to the workspace")
    out = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in out):
        raise WorkspaceError(f"file name {_short(rel)!r} leaves the workspace (it holds "
                             "'.' or '..'); give a plain relative name")
    if len(out) > MAX_DEPTH:
        raise WorkspaceError(f"file name {_short(rel)!r} is {len(out)} levels deep; at most "
                             f"{MAX_DEPTH} are kept")
    for p in out:
        if len(p.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise WorkspaceError(f"file name {_short(rel)!r} has a part over "
                                 f"{MAX_NAME_BYTES} bytes, which no file system here takes")
    return out


def _open_root(root: str | os.PathLike) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspaceError(f"cannot open the workspace {root} ({exc.strerror})") from None


def _refused(rel: str, exc: OSError) -> WorkspaceError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return WorkspaceError(f"{_short(rel)!r} goes through a symlink or a file in the "
                              "workspace; flowmagic never follows one")
    return WorkspaceError(f"cannot open {_short(rel)!r} in the workspace ({exc.strerror})")


@contextlib.contextmanager
def _folder(root, names: list[str], rel: str, *, create: bool = False) -> Iterator[int]:
    """A descriptor of the folder `names` under `root`, reached without following a link
    (made, with its parents, when `create`)."""
    fd = _open_root(root)
    try:
        for name in names:
            if create:
                with contextlib.suppress(FileExistsError):
                    try:
                        os.mkdir(name, 0o755, dir_fd=fd)
                    except OSError as exc:
                        if exc.errno != errno.EEXIST:
                            raise _refused(rel, exc) from None
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError as exc:
                raise _refused(rel, exc) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _split(rel: str) -> tuple[list[str], str]:
    names = [p for p in str(rel).split("/") if p]
    if not names or any(p in (".", "..") or "\x00" in p for p in names):
        raise WorkspaceError(f"{_short(str(rel))!r} is not a file name in the workspace")
    return names[:-1], names[-1]


@contextlib.contextmanager
def _open_file(root, rel: str, flags: int = _READ, mode: int = 0o644) -> Iterator[tuple[int, os.stat_result]]:
    """(descriptor, fstat) of the regular file `rel`; WorkspaceError for anything else."""
    folders, name = _split(rel)
    with _folder(root, folders, rel, create=bool(flags & os.O_CREAT)) as dfd:
        try:
            fd = os.open(name, flags, mode, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ENXIO:   # a socket, or a FIFO opened to write with no reader
                try:
                    kind = _KINDS.get(stat.S_IFMT(os.stat(name, dir_fd=dfd, follow_symlinks=False)
                                                 .st_mode), "not a regular file")
                except OSError:
                    kind = "not a regular file"
                raise WorkspaceError(f"{_short(rel)!r} in the workspace is {kind}; "
                                     "flowmagic reads and writes regular files only") from None
            raise _refused(rel, exc) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
                raise WorkspaceError(f"{_short(rel)!r} in the workspace is {kind}; flowmagic "
                                     "reads and writes regular files only")
            yield fd, st
        finally:
            os.close(fd)


def file_stat(root, rel: str) -> os.stat_result | None:
    """The stat of the regular file `rel`, None when there is none (or something else)."""
    try:
        with _open_file(root, rel) as (_, st):
            return st
    except WorkspaceError:
        return None


def exists(root, rel: str) -> bool:
    """Whether anything (a file, a folder, a link) is at `rel`, no link followed."""
    folders, name = _split(rel)
    try:
        with _folder(root, folders, rel) as dfd:
            os.stat(name, dir_fd=dfd, follow_symlinks=False)
            return True
    except (WorkspaceError, OSError):
        return False


def _read(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_bytes(root, rel: str, *, limit: int) -> bytes:
    """The bytes of the regular file `rel`; WorkspaceError when it is over `limit` bytes."""
    with _open_file(root, rel) as (fd, st):
        if st.st_size > limit:
            raise WorkspaceError(f"{_short(rel)!r} is {st.st_size:,} bytes, over the "
                                 f"{limit:,} flowmagic reads")
        data = _read(fd, limit + 1)
    if len(data) > limit:   # it grew while being read
        raise WorkspaceError(f"{_short(rel)!r} is over the {limit:,} bytes flowmagic reads")
    return data


def read_head(root, rel: str, size: int) -> tuple[bytes, int]:
    """(first `size` bytes, total size) of the regular file `rel`."""
    with _open_file(root, rel) as (fd, st):
        return _read(fd, size), st.st_size


def write_bytes(root, rel: str, data: bytes, *, replace: bool = True, mode: int = 0o644) -> None:
    """Write the regular file `rel` (its folders made as needed), never through a link.
    With `replace=False` an existing entry of that name is FileExistsError."""
    parts(rel)
    if not replace and exists(root, rel):
        raise FileExistsError(rel)
    with _open_file(root, rel, _WRITE | (0 if replace else os.O_EXCL), mode) as (fd, _):
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise WorkspaceError(f"cannot write {_short(rel)!r} in the workspace "
                                 f"({exc.strerror})") from None


@contextlib.contextmanager
def opened(root, rel: str) -> Iterator[io.BufferedReader]:
    """The regular file `rel`, open for reading as a binary file object."""
    with _open_file(root, rel) as (fd, _):
        with open(fd, "rb", closefd=False) as fh:
            yield fh


def write_stream(root, rel: str, source: BinaryIO, *, mode: int = 0o644) -> None:
    """Write the regular file `rel` from a binary file object, as `write_bytes` does."""
    parts(rel)
    with _open_file(root, rel, _WRITE, mode) as (fd, _):
        try:
            os.ftruncate(fd, 0)
            with open(fd, "wb", closefd=False) as out:
                shutil.copyfileobj(source, out, 1 << 20)
        except OSError as exc:
            raise WorkspaceError(f"cannot write {_short(rel)!r} ({exc.strerror})") from None


def make_dirs(root, rel: str) -> None:
    """The folder `rel` and its parents, never through a link."""
    with _folder(root, parts(rel), rel, create=True):
        pass


def remove_tree(path: str | os.PathLike) -> None:
    """Delete the folder `path` and everything under it, no link followed, however deep
    (Python 3.11's rmtree recurses once a level: coreutils' rm does not)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", os.fspath(path)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)


# --------------------------------------------------------------------------------- walking
def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _names(fd: int) -> list[str]:
    try:
        return sorted(os.listdir(fd), reverse=True)   # popped from the end: in name order
    except OSError:
        return []


def _climb(fd: int, root, path: list[str], idents: list[tuple[int, int]]) -> int | None:
    """The parent of the folder `fd` (whose names from the root are `path` + one), checked to
    be the one the walk came from; if it was moved meanwhile, reached again from the root."""
    try:
        up = os.open("..", _DIR, dir_fd=fd)
    except OSError:
        up = None
    finally:
        os.close(fd)
    if up is not None and _ident(os.fstat(up)) == idents[-1]:
        return up
    if up is not None:
        os.close(up)
    try:
        with _folder(root, path, "/".join(path)) as again:
            if _ident(os.fstat(again)) == idents[-1]:
                return os.dup(again)
    except WorkspaceError:
        pass
    return None


def walk(root, *, prune: Callable[[str], bool] | None = None) -> Iterator[Entry]:
    """Every entry under `root` (not itself), folders before what they hold, names in order,
    no symlink followed; folders whose name `prune(name)` is true are listed, not entered."""
    fd = _open_root(root)
    path: list[str] = []
    idents = [_ident(os.fstat(fd))]
    pending = [_names(fd)]
    try:
        while True:
            if not pending[-1]:
                pending.pop()
                idents.pop()
                if not pending:
                    return
                path.pop()
                fd = _climb(fd, root, path, idents)
                if fd is None:   # the tree moved under the walk: what was left is gone with it
                    return
                continue
            name = pending[-1].pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            yield Entry("/".join((*path, name)), name, fd, st)
            if not stat.S_ISDIR(st.st_mode) or (prune is not None and prune(name)):
                continue
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                continue
            if _ident(os.fstat(child)) != _ident(st):   # swapped since it was looked at
                os.close(child)
                continue
            inside = _names(child)
            if not inside:   # nothing to visit: no need to climb back out of it
                os.close(child)
                continue
            os.close(fd)
            fd = child
            path.append(name)
            idents.append(_ident(st))
            pending.append(inside)
    finally:
        if fd is not None:
            os.close(fd)
