"""WAL checkpoints in a thread of their own, so that no commit waits for a disk sync.

In WAL mode with `synchronous=NORMAL` a commit only appends to the write-ahead log: it is
durable against the process dying (the OS has the bytes) without a sync. The syncs happen
at checkpoints, which copy the log back into the database file; SQLite runs one inside the
commit that takes the log past 1,000 pages, so every hundred commits or so one commit
waited 10-60 ms for the disk (on the event loop, in a run: a stall of every node in
flight). The writing connection turns that off (`PRAGMA wal_autocheckpoint=0`) and tells
a `Checkpointer` about its commits; after every `every` of them (about SQLite's own 1,000
pages) a thread of its own, on its own connection, runs a PASSIVE checkpoint, which never
blocks a writer or a reader.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["Checkpointer"]


class Checkpointer:
    """`committed()` after each commit, under the writer's lock; `close()` stops the thread
    (a last checkpoint runs when the last connection to the file closes, as SQLite does by
    itself)."""

    def __init__(self, path: Path, every: int = 128):
        self.path = path
        self.every = every
        self._count = 0
        self._due = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def committed(self) -> None:
        self._count += 1
        if self._count >= self.every:
            self._count = 0
            if self._thread is None or not self._thread.is_alive():   # a forked child too
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"flowmagic-checkpoint {self.path}")
                self._thread.start()
            self._due.set()

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error:
            return   # the writer keeps working; SQLite checkpoints when it closes
        try:
            db.execute("PRAGMA busy_timeout=5000")
            while True:
                self._due.wait()
                self._due.clear()
                if self._closed:
                    return
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    pass   # busy or gone: the next one catches up
        finally:
            db.close()

    def stop(self) -> None:
        """Tell the thread to end (for a store collected without close())."""
        self._closed = True
        self._due.set()

    def close(self) -> None:
        self.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
