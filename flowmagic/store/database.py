"""The store's SQLite file: where it is, opening it (a damaged file moved aside, a read-only
one opened for reading), its migrations, and the locked, guarded statements every table's
methods go through; each SQLite failure is one `StoreError` line that says what to do."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

from .._internal.checkpoint import Checkpointer
from ..errors import StoreError
from .migrations import MIGRATIONS
from .scrub import known_secrets, scrub_rows

__all__ = ["Database", "home"]

_FIX_HOME = "set FLOWMAGIC_HOME to a writable folder"


def home() -> Path:
    """The flowmagic home folder ($FLOWMAGIC_HOME or ~/.flowmagic), created on demand."""
    path = Path(os.environ.get("FLOWMAGIC_HOME") or Path.home() / ".flowmagic").expanduser()
    if path.exists() and not path.is_dir():
        raise StoreError(f"FLOWMAGIC_HOME {path} is a file, not a folder; {_FIX_HOME}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot use {path} as the flowmagic home ({exc.strerror or exc}); "
                         f"{_FIX_HOME}") from None
    return path


_DAMAGED = ("file is not a database", "malformed", "database corrupt")
_READ_ONLY = ("readonly", "read-only", "unable to open database file")


class Database:
    """The SQLite file of a `Store`: one connection, one lock (see `Store` for what a
    damaged or read-only file does)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else home() / "flowmagic.db"
        self.read_only = False
        self.notice: str | None = None
        self._checkpoints: Checkpointer | None = None
        self._lock = threading.RLock()
        self._keys: Any = None   # which keys the cache holds (calls.CacheKeys)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            if not any(k in str(exc).lower() for k in _DAMAGED):
                raise self._error(exc, "open") from None
            backup = self._move_aside()
            self.notice = (f"the store at {self.path} was damaged ({exc}); it was moved to "
                           f"{backup} and a new one started (`sqlite3 {backup} .recover` may "
                           "get old runs back)")
            print(f"flowmagic: {self.notice}", file=sys.stderr)
            try:
                self._open()
            except sqlite3.Error as again:
                raise self._error(again, "open") from None

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot open the flowmagic store at {self.path} "
                             f"({exc.strerror or exc}); {_FIX_HOME}") from None
        if self.path.is_dir():
            raise StoreError(f"the flowmagic store {self.path} is a folder, not a file; "
                             f"{_FIX_HOME}")
        try:
            self._keys = None   # a new connection counts its data_version anew
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            # Checkpoints (the only disk syncs in WAL mode) run in a thread, not in a commit.
            self._db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpoints = Checkpointer(self.path)
            weakref.finalize(self, self._checkpoints.stop)
        except sqlite3.OperationalError as exc:
            if not any(k in str(exc).lower() for k in _READ_ONLY) or not self.path.is_file():
                raise
            self._open_read_only(exc)

    def _open_read_only(self, why: Exception) -> None:
        """A store we may read but not write (a read-only file, folder or mount)."""
        with contextlib.suppress(sqlite3.Error, AttributeError):
            self._db.close()
        uri = self.path.resolve().as_uri()
        for options in ("mode=ro", "mode=ro&immutable=1"):   # immutable: no -shm possible
            try:
                self._db = sqlite3.connect(f"{uri}?{options}", uri=True,
                                           check_same_thread=False, isolation_level=None)
                done = {row[0] for row in self._db.execute("SELECT name FROM _migrations")}
                break
            except sqlite3.OperationalError:
                continue
        else:
            raise StoreError(f"cannot open the flowmagic store at {self.path} ({why}); "
                             f"{_FIX_HOME}")
        if {fn.__name__ for fn in MIGRATIONS} - done:
            raise StoreError(f"the store at {self.path} is read-only and needs an upgrade "
                             f"flowmagic cannot write ({why}); make it writable or {_FIX_HOME}")
        self.read_only = True

    def _move_aside(self) -> Path:
        with contextlib.suppress(sqlite3.Error, AttributeError):
            self._db.close()
        backup = self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            for suffix in ("", "-wal", "-shm"):
                part = Path(f"{self.path}{suffix}")
                if part.exists():
                    part.rename(f"{backup}{suffix}")
        except OSError as exc:
            raise StoreError(f"the store at {self.path} is damaged and cannot be moved aside "
                             f"({exc.strerror or exc}); move it away yourself or "
                             f"{_FIX_HOME}") from None
        return backup

    def _error(self, exc: sqlite3.Error, doing: str) -> StoreError:
        """One line for a SQLite failure: what happened and what to do."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        low = text.lower()
        if "full" in low:
            msg = (f"the disk holding the store {self.path} is full ({text}); free some space "
                   "and run again")
        elif self.read_only or any(k in low for k in ("readonly", "read-only")):
            msg = (f"the store at {self.path} is read-only, so flowmagic can show what it holds "
                   f"but cannot {doing}; make it writable or {_FIX_HOME}")
        elif any(k in low for k in _DAMAGED):
            msg = (f"the store at {self.path} is damaged ({text}); move it aside "
                   f"(mv {self.path} {self.path}.bak; `sqlite3 {self.path}.bak .recover` may "
                   "get old runs back) and run again")
        elif "locked" in low or "busy" in low:
            msg = (f"the store at {self.path} stayed locked by another process for 5 s "
                   f"({text}); wait for it to finish and run again")
        else:
            msg = f"the store at {self.path} failed to {doing} ({text}); {_FIX_HOME} if it persists"
        return StoreError(msg)

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc, doing) from None

    @contextlib.contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        """BEGIN ... COMMIT under the lock; on failure a rollback that cannot hide the cause
        (SQLite has already rolled back after "database or disk is full")."""
        with self._lock, self._guard(doing):
            self._check_writable(doing)
            self._db.execute("BEGIN")
            try:
                yield self._db
                self._db.execute("COMMIT")
                self._committed()
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    def _check_writable(self, doing: str) -> None:
        if self.read_only:
            raise self._error(sqlite3.OperationalError("read-only"), doing)

    def check_writable(self) -> None:
        """Raise StoreError now when nothing could be recorded (before a paid call)."""
        self._check_writable("record model calls or runs")

    # -- schema -------------------------------------------------------------
    def _migrate(self) -> None:
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL)"
            )
            done = {row[0] for row in self._db.execute("SELECT name FROM _migrations")}
            known = {fn.__name__ for fn in MIGRATIONS}
            if done - known:
                raise StoreError(
                    f"the store at {self.path} was written by a newer flowmagic "
                    f"(migrations {sorted(done - known)}); upgrade flowmagic or set FLOWMAGIC_HOME"
                )
            for fn in MIGRATIONS:
                if fn.__name__ in done:
                    continue
                self._db.execute("BEGIN")
                try:
                    fn(self._db)
                    self._db.execute(
                        "INSERT INTO _migrations VALUES (?, ?)", (fn.__name__, time.time())
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._db.execute("ROLLBACK")
                    raise

    def columns(self, table: str) -> list[str]:
        with self._lock, self._guard("read its schema"):
            return [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.close()
        with self._lock:
            self._db.close()

    def _committed(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.committed()

    def _execute(self, sql: str, args: tuple = (), doing: str = "record this") -> sqlite3.Cursor:
        """One write (secrets scrubbed from its texts) or one small read."""
        write = not sql.lstrip().upper().startswith("SELECT")
        with self._lock, self._guard(doing):
            if not write:
                return self._db.execute(sql, args)
            self._check_writable(doing)
            cursor = self._db.execute(sql, self._scrubbed(args))
            self._committed()
            return cursor

    def _executemany(self, db: sqlite3.Connection, sql: str, rows: list[tuple]) -> None:
        db.executemany(sql, scrub_rows(rows, known_secrets()))

    @staticmethod
    def _scrubbed(args: tuple) -> tuple:
        return scrub_rows([args], known_secrets())[0]

    def _query(self, sql: str, args: tuple = (), doing: str = "read") -> list[dict]:
        with self._lock, self._guard(doing):
            cur = self._db.execute(sql, args)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    def _loads(self, text: str | None, table: str, key: Any) -> Any:
        """A JSON column; a damaged one is one line naming the row and how to drop it."""
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise StoreError(
                f"the store at {self.path} holds damaged JSON in table {table} ({key}); "
                f"delete that row (sqlite3 {self.path} \"DELETE FROM {table} WHERE {key}\") "
                "or move the store aside, then run again") from None
