"""SQLite store: every model call, the response cache, runs and their node states.

One file, `$FLOWMAGIC_HOME/flowmagic.db` (default `~/.flowmagic`), in WAL mode so a
notebook and a CLI can read it at once. The schema grows by numbered migration
functions (`migrations.py`), each recorded in `_migrations`, as simonw/llm does. Nothing
here ever receives an API key: callers pass messages and parameters, never headers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .database import home
from .migrations import MIGRATIONS
from .runs import Runs
from .scrub import add_secret_source
from .transcripts import Transcripts
from .transfer import Transfer

__all__ = ["close_stores", "Store", "get_store", "home", "MIGRATIONS", "add_secret_source"]


class Store(Runs, Transfer, Transcripts):
    """A thread-safe handle on the SQLite file (one connection, one lock).

    Every SQLite failure leaves as one `StoreError` line that says what and how to fix it.
    A file that is not a database (or is damaged beyond opening) is moved aside, with its
    WAL, to `flowmagic.db.damaged-<time>` and a new store begins (`self.notice` says where
    the old one went). A store that cannot be written is opened read-only: what it holds
    can be read, and every write says why it cannot be made.

    Its tables' methods live with their concept: `database` (the file, its opening and
    statements), `calls` (call log and cache), `runs` (runs, nodes, events, updates),
    `transcripts` (tool calls, orchestrator messages), `transfer` (moving runs between
    stores).
    """


_shared: dict[Path, Store] = {}
_shared_lock = threading.Lock()


def get_store(path: str | os.PathLike | None = None) -> Store:
    """The process-wide store for a path (default: the current FLOWMAGIC_HOME)."""
    key = Path(path) if path else home() / "flowmagic.db"
    with _shared_lock:
        if key not in _shared:
            _shared[key] = Store(key)
        return _shared[key]


def close_stores() -> None:
    """Close every process-wide store and forget it (the next `get_store` opens its file
    again). For a process that moves between homes, a test suite with a home per test:
    each store holds its database, journal and shared-memory descriptors until closed."""
    with _shared_lock:
        stores = list(_shared.values())
        _shared.clear()
    for store in stores:
        store.close()
