"""SQLite store: every model call, the response cache, runs and their node states.

One file, `$FLOWMAGIC_HOME/flowmagic.db` (default `~/.flowmagic`), in WAL mode so a
notebook and a CLI can read it at once. The schema grows by numbered migration
functions (`migrations.py`), each recorded in `_migrations`, as simonw/llm does. Nothing
here ever receives an API key: callers pass messages and parameters, never headers.
"""

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
from typing import Any, Callable, Iterable, Iterator

import orjson

from .._internal.checkpoint import Checkpointer
from .._internal.jsontext import encoder
from ..errors import StoreError
from ..model.status import RunState
from .migrations import MIGRATIONS

__all__ = ["close_stores", "Store", "get_store", "home", "MIGRATIONS", "add_secret_source"]

_FIX_HOME = "set FLOWMAGIC_HOME to a writable folder"
# Who can tell the store which texts are secrets (the endpoints' API keys): every string
# written is scrubbed of them, so no key reaches the file whatever the caller passed.
_secret_sources: list[Callable[[], Iterable[str]]] = []


def add_secret_source(source: Callable[[], Iterable[str]]) -> None:
    """Register a function returning the secrets (API keys) to scrub from every write."""
    if source not in _secret_sources:
        _secret_sources.append(source)


def _secrets() -> list[str]:
    found: set[str] = set()
    for source in _secret_sources:
        found.update(s for s in source() if s)
    return sorted(found, key=len, reverse=True)


def _scrub_args(args: tuple, secrets: list[str]) -> tuple:
    """The arguments of one write: no secret in any text, and no lone surrogate (a task
    typed with one would make SQLite refuse the whole write)."""
    if not secrets:   # the usual case (no key long enough to hide): only the text check
        return tuple(value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
                     if isinstance(value, str) and not value.isascii() else value
                     for value in args)
    out = []
    for value in args:
        if isinstance(value, str):
            for secret in secrets:
                if secret in value:
                    value = value.replace(secret, "[key hidden]")
            if not value.isascii():
                value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        out.append(value)
    return tuple(out)


def _scrub_rows(rows: list[tuple], secrets: list[str]) -> list[tuple]:
    """`_scrub_args` of every row, checked at once: the rows themselves when no text in them
    holds a secret or a lone surrogate, the usual case (one join and a few searches in C
    instead of a new tuple per row). A secret cannot hide across the joins: it is found in
    the joined text whenever it is in one of the texts."""
    texts = [value for row in rows for value in row if isinstance(value, str)]
    joined = "\x00".join(texts)
    if not any(secret in joined for secret in secrets):
        if joined.isascii():
            return rows
        try:
            joined.encode("utf-8")
            return rows
        except UnicodeEncodeError:
            pass
    return [_scrub_args(row, secrets) for row in rows]


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


# A run's row as `runs` holds it, with its status, last change and result from its
# `run_state` row when it has one (a run saved by an older flowmagic has none).
_RUNS = ("SELECT r.id, r.name, r.task, r.created, COALESCE(s.updated, r.updated) AS updated,"
         " COALESCE(s.status, r.status) AS status, r.workflow, r.candidates, r.settings,"
         " CASE WHEN s.run_id IS NULL THEN r.result ELSE s.result END AS result"
         " FROM runs r LEFT JOIN run_state s ON s.run_id = r.id")
# The kind of an events row that holds the events of one commit (two or more), its data
# a JSON list of [kind, node_id, data]: one row a commit instead of two a node (an emitted
# event's data is an object or null, never a list). `Store.events` lists them one by one.
_EVENTS = "events"
# The tables that hold one run, and what `export_run` / `merge` copy between stores (a
# run's state goes in its `runs` row: `_RUNS`).
_RUN_TABLES = ("runs", "nodes", "events", "updates", "calls", "tool_calls", "orchestrator")


# Built once: json.dumps with arguments builds an encoder on every call.
_encode = encoder(ensure_ascii=False, default=str)
_encode_ascii = encoder(ensure_ascii=True, default=str)


def _dumps(value: Any) -> str:
    text = _encode(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:   # lone surrogates: SQLite refuses them, \u escapes keep them
            text = _encode_ascii(value)
    return text


def _not_native(value: Any) -> Any:
    raise TypeError(type(value).__name__)


# What orjson writes other than json would (datetimes, dataclasses) goes to _dumps instead.
_STATE_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _dumps_state(value: Any) -> str:
    """JSON of a node's state or of a commit's events, written for every node of every
    run: orjson's, a tenth of `_dumps`'s time (json's float formatting alone is ~0.5 µs a
    number, six a node). The same values once parsed, with compact separators; what orjson
    refuses (a lone surrogate, a key that is not a string, an integer over 64 bits, a type
    json writes with str()) is `_dumps`'s. Only NaN and infinities differ: orjson writes
    null (a node's own numbers are never either: prices, token counts and estimates are
    checked finite; one anywhere else in a row would read back as None)."""
    try:
        return orjson.dumps(value, default=_not_native, option=_STATE_OPTIONS).decode()
    except TypeError:   # orjson.JSONEncodeError is one
        return _dumps(value)


_DAMAGED = ("file is not a database", "malformed", "database corrupt")
_READ_ONLY = ("readonly", "read-only", "unable to open database file")


class _CacheKeys:
    """The keys a store's cache holds, as of a data_version of its connection (see
    `Store.cache_may_hold`): a set, up to `CAP` keys (about 100 bytes each); past that,
    `may_hold` is always True and the look-ups query."""

    CAP = 200_000

    def __init__(self, keys: set[str] | None, top: int, version: int):
        self.keys, self.top, self.version = keys, top, version

    @classmethod
    def sync(cls, db: sqlite3.Connection, known: "_CacheKeys | None") -> "_CacheKeys":
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if known is not None and (version == known.version or known.keys is None):
            return known   # nobody else committed since (or the cache is too big to index)
        top = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM cache").fetchone()[0]
        if known is not None and top >= known.top:   # only new rows since: read those
            known.keys.update(k for (k,) in db.execute(
                "SELECT key FROM cache WHERE rowid > ?", (known.top,)))
            known.top, known.version = top, version
        else:   # the first time, or rows went away: read them all
            rows = db.execute("SELECT key FROM cache LIMIT ?", (cls.CAP + 1,)).fetchall()
            known = cls({k for (k,) in rows} if len(rows) <= cls.CAP else None, top, version)
        if known.keys is not None and len(known.keys) > cls.CAP:
            known.keys = None
        return known

    def may_hold(self, key: str) -> bool:
        return self.keys is None or key in self.keys

    def add(self, keys) -> None:
        if self.keys is not None:
            self.keys.update(keys)


class Store:
    """A thread-safe handle on the SQLite file (one connection, one lock).

    Every SQLite failure leaves as one `StoreError` line that says what and how to fix it.
    A file that is not a database (or is damaged beyond opening) is moved aside, with its
    WAL, to `flowmagic.db.damaged-<time>` and a new store begins (`self.notice` says where
    the old one went). A store that cannot be written is opened read-only: what it holds
    can be read, and every write says why it cannot be made.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else home() / "flowmagic.db"
        self.read_only = False
        self.notice: str | None = None
        self._checkpoints: Checkpointer | None = None
        self._lock = threading.RLock()
        self._keys: _CacheKeys | None = None   # which keys the cache holds (cache_may_hold)
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
        db.executemany(sql, _scrub_rows(rows, _secrets()))

    @staticmethod
    def _scrubbed(args: tuple) -> tuple:
        return _scrub_rows([args], _secrets())[0]

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

    # -- calls and cache ----------------------------------------------------
    _CALL_SQL = ("INSERT INTO calls (ts, endpoint, model, messages, params, response,"
                 " input_tokens, output_tokens, latency_s, cost_usd, cache_key, cached, error,"
                 " run_id, node_id, purpose, cached_tokens)"
                 " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")

    def log_call(self, *, endpoint: str, model: str, messages: Any, params: dict,
                 response: Any = None, input_tokens: int = 0, output_tokens: int = 0,
                 cached_tokens: int = 0, latency_s: float = 0.0, cost_usd: float = 0.0, cache_key: str | None = None,
                 cached: bool = False, error: str | None = None, run_id: str | None = None,
                 node_id: str | None = None, purpose: str | None = None,
                 cache_payload: dict | None = None, messages_json: str | None = None,
                 params_json: str | None = None) -> int:
        """Log one call; with `cache_payload`, also cache it under `cache_key` (same commit).
        `messages_json` and `params_json` are those already dumped, saving a second dump."""
        return self.log_calls([dict(
            endpoint=endpoint, model=model, messages=messages, params=params, response=response,
            input_tokens=input_tokens, output_tokens=output_tokens,
            cached_tokens=cached_tokens, latency_s=latency_s,
            cost_usd=cost_usd, cache_key=cache_key, cached=cached, error=error, run_id=run_id,
            node_id=node_id, purpose=purpose, cache_payload=cache_payload,
            messages_json=messages_json, params_json=params_json)])[0]

    def log_calls(self, calls: list[dict]) -> list[int]:
        """Log several calls (each the keyword arguments of `log_call`) in one commit; their
        row ids in order. The LLM door writes the calls that ended in one event-loop turn
        together, so a wide fan-out pays one commit per turn instead of one per call."""
        rows, caches = self._call_rows(calls, time.time())
        with self._transaction("record the model call") as db:
            return self._insert_calls(db, rows, caches)

    @staticmethod
    def _call_rows(calls: list[dict], now: float) -> tuple[list[tuple], list[tuple]]:
        """(rows of `calls`, rows of their cache entries) for `_insert_calls`."""
        rows, caches = [], []
        for c in calls:
            response = c.get("response")
            text = None if response is None else _dumps(response)
            rows.append((now, c["endpoint"], c["model"],
                         c.get("messages_json") or _dumps(c["messages"]),
                         c.get("params_json") or _dumps(c["params"]), text,
                         c.get("input_tokens", 0),
                         c.get("output_tokens", 0), c.get("latency_s", 0.0),
                         c.get("cost_usd", 0.0), c.get("cache_key"), int(c.get("cached", False)),
                         c.get("error"), c.get("run_id"), c.get("node_id"), c.get("purpose"),
                         c.get("cached_tokens") or 0))
            payload = c.get("cache_payload")
            if payload is not None and c.get("cache_key") is not None:
                caches.append((c["cache_key"], text if payload is response else _dumps(payload),
                               now))
        return rows, caches

    def _insert_calls(self, db: sqlite3.Connection, rows: list[tuple],
                      caches: list[tuple]) -> list[int]:
        """Insert call rows and cache entries inside an open transaction; the rows' ids."""
        if not rows:
            return []
        self._executemany(db, self._CALL_SQL, rows)
        # Under the write lock, in one transaction, the rows took consecutive ids.
        last = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
        if caches:
            self._executemany(db, "INSERT OR REPLACE INTO cache (key, payload, created)"
                              " VALUES (?, ?, ?)", caches)
            self._cached([c[0] for c in caches])   # (a rollback leaves keys that just miss)
        return list(range(last - len(rows) + 1, last + 1))

    def recent_calls(self, n: int = 10, *, run_id: str | None = None, model: str | None = None,
                     query: str | None = None) -> list[dict]:
        """The newest n calls, of one run, one model and/or whose prompt or answer holds
        `query` (case-insensitive, as written: no wildcards)."""
        conditions, args = [], []
        if run_id:
            conditions.append("run_id = ?")
            args.append(run_id)
        if model:   # as stored ("endpoint:model") or the model alone
            conditions.append("(model = ? OR substr(model, instr(model, ':') + 1) = ?)")
            args += [model, model]
        if query:
            pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            conditions.append("(messages LIKE ? ESCAPE '\\' OR response LIKE ? ESCAPE '\\')")
            args += [pattern, pattern]
        where = ("WHERE " + " AND ".join(conditions)) if conditions else ""
        n = max(0, min(int(n), 2**62))   # SQLite integers are 64-bit
        rows = self._query(f"SELECT * FROM calls {where} ORDER BY id DESC LIMIT ?", (*args, n))
        for row in rows:
            for key in ("messages", "params", "response"):
                row[key] = self._loads(row[key], "calls", f"id = {row['id']}")
            row["cached"] = bool(row["cached"])
        return rows

    def count_calls(self, *, cached: bool | None = None, since_id: int = 0) -> int:
        sql, args = "SELECT COUNT(*) FROM calls WHERE id > ?", [since_id]
        if cached is not None:
            sql += " AND cached = ?"
            args.append(int(cached))
        return int(self._execute(sql, tuple(args)).fetchone()[0])

    def usage(self, run_id: str) -> list[dict]:
        """Calls, tokens and USD of one run, by purpose, node and model."""
        return self._query(
            "SELECT purpose, node_id, model, COUNT(*) AS calls, SUM(cached) AS cached,"
            " SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens,"
            " SUM(cached_tokens) AS cached_tokens, SUM(cost_usd) AS cost_usd,"
            " SUM(cost_usd IS NULL AND cached = 0) AS unpriced"
            " FROM calls WHERE run_id = ? AND error IS NULL"
            " GROUP BY purpose, node_id, model ORDER BY MIN(id)", (run_id,))

    def last_call_id(self) -> int:
        return int(self._execute("SELECT COALESCE(MAX(id), 0) FROM calls").fetchone()[0])

    def cache_get(self, key: str) -> dict | None:
        return self.cache_get_many([key])[0]

    def cache_get_many(self, keys: list[str]) -> list[dict | None]:
        """The cached answers under `keys`, in order (None for a miss), in one statement per
        500 keys: the LLM door looks up the calls of one event-loop turn together."""
        texts: dict[str, str] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock, self._guard("read the cache"):
            for i in range(0, len(unique), 500):
                chunk = unique[i:i + 500]
                texts.update(self._db.execute(
                    f"SELECT key, payload FROM cache WHERE key IN ({','.join('?' * len(chunk))})",
                    chunk))
        out = []
        for key in keys:
            try:   # a damaged cache entry is a miss: the call is made again and replaces it
                out.append(json.loads(texts[key]) if key in texts else None)
            except ValueError:
                out.append(None)
        return out

    def cache_put(self, key: str, payload: dict) -> None:
        self._execute(
            "INSERT OR REPLACE INTO cache (key, payload, created) VALUES (?, ?, ?)",
            (key, _dumps(payload), time.time()), doing="cache the answer")
        self._cached([key])

    def cache_may_hold(self, key: str, *, recheck: bool = True) -> bool:
        """False when the cache certainly has no entry under `key` (a look-up would miss),
        known without a query; True when it may have one.

        The keys are read once, and then only those added since: by this handle (its own
        writes), and by other connections, whose commits SQLite counts (`PRAGMA
        data_version`, compared when `recheck`: the LLM door does once per event-loop turn).
        Another connection's entries are read by row id from the highest one seen (SQLite
        gives a new row a higher id; fewer rows than before, a cache cleared or vacuumed, is
        read again whole). A cache of more than `_CacheKeys.CAP` entries is not indexed:
        every look-up queries it."""
        keys = self._keys
        if keys is None or recheck:
            with self._lock, self._guard("read the cache"):
                keys = self._keys = _CacheKeys.sync(self._db, self._keys)
        return keys.may_hold(key)

    def _cached(self, keys) -> None:
        """Keys this handle just wrote to the cache (SQLite does not count a connection's own
        commits in its data_version)."""
        if self._keys is not None:
            self._keys.add(keys)

    # -- runs ---------------------------------------------------------------
    def save_run(self, run_id: str, *, task: str, workflow: dict, name: str | None = None,
                 status: str = RunState.PLANNED, candidates: Any = None, settings: Any = None,
                 result: str | None = None) -> None:
        now = time.time()
        with self._transaction("save the run") as db:
            db.execute(
                "INSERT INTO runs (id, name, task, created, updated, status, workflow,"
                " candidates, settings, result) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(id) DO UPDATE SET name=excluded.name, task=excluded.task,"
                " updated=excluded.updated, status=excluded.status,"
                " workflow=excluded.workflow,"
                " candidates=COALESCE(excluded.candidates, runs.candidates),"
                " settings=COALESCE(excluded.settings, runs.settings),"
                " result=excluded.result",
                _scrub_args((run_id, name, task, now, now, status, _dumps(workflow),
                             None if candidates is None else _dumps(candidates),
                             None if settings is None else _dumps(settings), result),
                            _secrets()),
            )
            db.execute("INSERT OR REPLACE INTO run_state (run_id, status, updated, result)"
                       " VALUES (?,?,?,?)", _scrub_args((run_id, status, now, result), _secrets()))
            # runs.workflow holds the nodes as saved; a node's row, its state when it
            # changed since (`load_run` prefers it), so a single change is one small write:
            # an insert, not a row of the plan grown in place in a full page.
            db.execute("DELETE FROM nodes WHERE run_id = ?", (run_id,))

    # A node's row is updated in place when it exists (it changed before in this run):
    # INSERT OR REPLACE would delete and insert it, twice the B-tree work.
    _NODE_SQL = ("INSERT INTO nodes (run_id, node_id, data, updated) VALUES (?, ?, ?, ?)"
                 " ON CONFLICT(run_id, node_id) DO UPDATE SET data = excluded.data,"
                 " updated = excluded.updated")

    def save_node(self, run_id: str, node: dict) -> None:
        self._execute(self._NODE_SQL, (run_id, node["id"], _dumps(node), time.time()),
                      doing="save the node")

    def write_batch(self, run_id: str, nodes: list[dict], events: list[tuple],
                    calls: list[dict] = (),
                    logged: Callable[[list[int]], None] | None = None) -> None:
        """Latest node states and events (kind, node_id, data) in one commit, with `calls`
        (each the keyword arguments of `log_call`) logged first: `logged(their ids)` is
        called before the nodes are written, so the nodes' attempts can name them."""
        now = time.time()
        call_rows, caches = self._call_rows(calls, now)
        with self._transaction("save node states") as db:
            ids = self._insert_calls(db, call_rows, caches)
            if logged is not None and ids:
                logged(ids)
            rows = [(run_id, node["id"], _dumps_state(node), now) for node in nodes]
            self._executemany(db, self._NODE_SQL, rows)
            if len(events) > 1:   # one row: see _EVENTS
                db.execute(
                    "INSERT INTO events (run_id, node_id, ts, kind, data) VALUES (?,?,?,?,?)",
                    self._scrubbed((run_id, None, now, _EVENTS,
                                    _dumps_state([list(event) for event in events]))))
            elif events:
                kind, node_id, data = events[0]
                db.execute(
                    "INSERT INTO events (run_id, node_id, ts, kind, data) VALUES (?,?,?,?,?)",
                    self._scrubbed((run_id, node_id, now, kind,
                                    None if data is None else _dumps_state(data))))

    def set_run_status(self, run_id: str, status: str, result: str | None = None) -> None:
        """The run's status and (when given) result, in its small `run_state` row: the `runs`
        row, with the workflow's JSON, is not rewritten."""
        args = (status, time.time(), result, run_id)
        if self._execute("UPDATE run_state SET status = ?1, updated = ?2,"
                         " result = COALESCE(?3, result) WHERE run_id = ?4",
                         args, doing="save the run status").rowcount == 0:
            # a run an older flowmagic saved: its state so far is in its `runs` row
            self._execute("INSERT INTO run_state (run_id, status, updated, result)"
                          " SELECT id, ?1, ?2, COALESCE(?3, result) FROM runs WHERE id = ?4"
                          " ON CONFLICT(run_id) DO UPDATE SET status = ?1, updated = ?2,"
                          " result = COALESCE(?3, run_state.result)",
                          args, doing="save the run status")

    def add_event(self, run_id: str, kind: str, node_id: str | None = None,
                  data: Any = None) -> None:
        self._execute(
            "INSERT INTO events (run_id, node_id, ts, kind, data) VALUES (?,?,?,?,?)",
            (run_id, node_id, time.time(), kind, None if data is None else _dumps(data)),
            doing="record the event")

    def events(self, run_id: str) -> list[dict]:
        """The run's events in order, each {id, run_id, node_id, ts, kind, data}; the events
        of one commit that share a row (`_EVENTS`) share its id and time."""
        out = []
        for row in self._query("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,)):
            data = self._loads(row["data"] or None, "events", f"id = {row['id']}")
            if row["kind"] == _EVENTS and row["node_id"] is None and isinstance(data, list):
                out.extend({**row, "node_id": node_id, "kind": kind, "data": event_data}
                           for kind, node_id, event_data in data)
            else:
                out.append({**row, "data": data})
        return out

    def add_update(self, run_id: str, data: dict) -> None:
        self._execute(
            "INSERT INTO updates (run_id, ts, data) VALUES (?,?,?)",
            (run_id, time.time(), _dumps(data)), doing="record the update")

    # -- tool calls and orchestrator transcripts -------------------------------
    def add_tool_call(self, run_id: str | None, node_id: str | None, *, tool: str,
                      arguments: Any = None, result: str | None = None,
                      duration_s: float | None = None, error: str | None = None,
                      round: int | None = None, protocol: str | None = None) -> int:  # noqa: A002
        cur = self._execute(
            "INSERT INTO tool_calls (run_id, node_id, ts, tool, arguments, result, duration_s,"
            " error, round, protocol) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (run_id, node_id, time.time(), tool, _dumps(arguments), result, duration_s, error,
             round, protocol), doing="record the tool call")
        return int(cur.lastrowid)

    def tool_calls(self, run_id: str, node_id: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM tool_calls WHERE run_id = ?", [run_id]
        if node_id is not None:
            sql += " AND node_id = ?"
            args.append(node_id)
        rows = self._query(sql + " ORDER BY id", tuple(args))
        for row in rows:
            row["arguments"] = self._loads(row["arguments"] or None, "tool_calls",
                                           f"id = {row['id']}")
        return rows

    def add_message(self, run_id: str, message: dict) -> int:
        """One orchestrator transcript message (seq, turn, sender, recipient, kind, ...)."""
        m = message
        cur = self._execute(
            "INSERT INTO orchestrator (run_id, seq, turn, ts, sender, recipient, kind, content,"
            " tokens_in, tokens_out, cost_usd, cached, call_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, m["seq"], m["turn"], m.get("time") or time.time(), m["sender"],
             m["recipient"], m.get("kind") or "message", m.get("content"),
             m.get("tokens_in") or 0, m.get("tokens_out") or 0, m.get("cost_usd") or 0.0,
             int(bool(m.get("cached"))), m.get("call_id")), doing="record the message")
        return int(cur.lastrowid)

    def transcript(self, run_id: str) -> list[dict]:
        rows = self._query("SELECT * FROM orchestrator WHERE run_id = ? ORDER BY seq, id",
                           (run_id,))
        for row in rows:
            row["cached"] = bool(row["cached"])
            row["time"] = row.pop("ts")
        return rows

    def load_run(self, run_id: str, *, skip_origin: str | None = None) -> dict:
        """A run by id, else the latest run of that name whose settings' origin is not
        `skip_origin` (e.g. "replay": the runs an exported notebook's cells made)."""
        rows = self._query(
            f"{_RUNS} WHERE r.id = ? OR (r.name = ? AND coalesce(CASE WHEN"
            " json_valid(r.settings) THEN json_extract(r.settings, '$.origin') END, '')"
            " != coalesce(?, '-')) ORDER BY r.id = ? DESC, updated DESC",
            (run_id, run_id, skip_origin, run_id))
        if not rows:
            known = ", ".join(r["id"] for r in self.list_runs(5)) or "none yet"
            raise StoreError(f"no run {run_id!r} in {self.path}; recent runs: {known}")
        run = rows[0]
        where = f"id = '{run['id']}'"
        for key in ("workflow", "candidates", "settings"):
            run[key] = self._loads(run[key] or None, "runs", where)
        if not isinstance(run["workflow"], dict) or not isinstance(
                run["workflow"].get("nodes"), list):
            self._loads("{", "runs", where)   # raises the same one line as bad JSON
        latest = {r["node_id"]: self._loads(r["data"], "nodes",
                                            f"run_{where} AND node_id = '{r['node_id']}'")
                  for r in self._query("SELECT node_id, data FROM nodes WHERE run_id = ?",
                                       (run["id"],))}
        run["workflow"]["nodes"] = [latest.get(n["id"], n) for n in run["workflow"]["nodes"]]
        run["updates"] = [self._loads(r["data"], "updates", f"id = {r['id']}") for r in self._query(
            "SELECT id, data FROM updates WHERE run_id = ? ORDER BY id", (run["id"],))]
        return run

    # -- moving runs between stores (a distributed map's workers -> the user's store) ----
    def export_run(self, run_id: str) -> dict:
        """Every row of one run (its calls, nodes, events, ...) and the cache entries its
        calls made, as plain data another store can `merge`."""
        rows = {t: self._query(f"{_RUNS} WHERE r.id = ?" if t == "runs" else
                               f"SELECT * FROM {t} WHERE run_id = ?", (run_id,))
                for t in _RUN_TABLES}
        for table in _RUN_TABLES[1:]:
            for row in rows[table]:
                row.pop("id", None)   # a new row id in the store it goes to
        keys = sorted({c["cache_key"] for c in rows["calls"] if c["cache_key"] and not c["cached"]})
        rows["cache"] = [r for k in keys for r in self._query("SELECT * FROM cache WHERE key = ?",
                                                              (k,))]
        return {"run_id": run_id, "rows": rows}

    def merge(self, export: dict, *, fingerprint: str | None = None,
              item: Any = None) -> bool:
        """Write a run exported from another store (and, with `fingerprint`, mark that
        map input done) in one commit; False when the run was here already (idempotent)."""
        return self.merge_many([(export, fingerprint, item)])[0]

    def merge_many(self, runs: list[tuple[dict, str | None, Any]]) -> list[bool]:
        """`merge` for many (export, fingerprint or None, item) in one commit: a map's
        driver merges what a worker sent back in bulk. Per run, False when it was here."""
        secrets = _secrets()
        merged = []
        with self._transaction("merge a worker's runs") as db:
            for export, fingerprint, item in runs:
                if fingerprint is not None:
                    db.execute("INSERT OR REPLACE INTO map_inputs (fingerprint, run_id, created,"
                               " item) VALUES (?,?,?,?)", _scrub_args(
                                   (fingerprint, export["run_id"], time.time(), _dumps(item)),
                                   secrets))
                if db.execute("SELECT 1 FROM runs WHERE id = ?", (export["run_id"],)).fetchone():
                    merged.append(False)
                    continue
                for table in (*_RUN_TABLES, "cache"):
                    rows = export["rows"].get(table)
                    if not rows:
                        continue
                    names = list(rows[0])
                    verb = "INSERT OR IGNORE" if table == "cache" else "INSERT"
                    self._executemany(db, f"{verb} INTO {table} ({', '.join(names)}) VALUES"
                                      f" ({', '.join('?' * len(names))})",
                                      [tuple(r[n] for n in names) for r in rows])
                    if table == "cache":
                        self._cached([r["key"] for r in rows])
                merged.append(True)
        return merged

    def map_done(self, fingerprints: list[str]) -> dict[str, dict]:
        """fingerprint -> the finished item, for the given map inputs that are done."""
        out: dict[str, dict] = {}
        for start in range(0, len(fingerprints), 500):
            part = fingerprints[start:start + 500]
            for row in self._query("SELECT fingerprint, item FROM map_inputs WHERE fingerprint"
                                   f" IN ({', '.join('?' * len(part))})", tuple(part)):
                out[row["fingerprint"]] = self._loads(
                    row["item"], "map_inputs", f"fingerprint = '{row['fingerprint']}'")
        return out

    def map_fingerprints(self) -> set[str]:
        """The fingerprints of every finished map input."""
        return {r["fingerprint"] for r in self._query("SELECT fingerprint FROM map_inputs")}

    def list_runs(self, n: int = 20) -> list[dict]:
        return self._query(
            "SELECT r.id, r.name, r.task, COALESCE(s.status, r.status) AS status, r.created,"
            " COALESCE(s.updated, r.updated) AS updated FROM runs r"
            " LEFT JOIN run_state s ON s.run_id = r.id ORDER BY updated DESC LIMIT ?", (n,))


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
