"""The call log and the response cache: every model call's row (tokens, latency, cost),
the cached answers by content hash, and which keys the cache holds, known without a query."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from .database import Database
from .encoding import dumps

__all__ = ["CallLog", "CacheKeys"]


class CacheKeys:
    """The keys a store's cache holds, as of a data_version of its connection (see
    `Store.cache_may_hold`): a set, up to `CAP` keys (about 100 bytes each); past that,
    `may_hold` is always True and the look-ups query."""

    CAP = 200_000

    def __init__(self, keys: set[str] | None, top: int, version: int):
        self.keys, self.top, self.version = keys, top, version

    @classmethod
    def sync(cls, db: sqlite3.Connection, known: "CacheKeys | None") -> "CacheKeys":
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


class CallLog(Database):
    """The call log and the cache of a `Store`."""

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
            text = None if response is None else dumps(response)
            rows.append((now, c["endpoint"], c["model"],
                         c.get("messages_json") or dumps(c["messages"]),
                         c.get("params_json") or dumps(c["params"]), text,
                         c.get("input_tokens", 0),
                         c.get("output_tokens", 0), c.get("latency_s", 0.0),
                         c.get("cost_usd", 0.0), c.get("cache_key"), int(c.get("cached", False)),
                         c.get("error"), c.get("run_id"), c.get("node_id"), c.get("purpose"),
                         c.get("cached_tokens") or 0))
            payload = c.get("cache_payload")
            if payload is not None and c.get("cache_key") is not None:
                caches.append((c["cache_key"], text if payload is response else dumps(payload),
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
            (key, dumps(payload), time.time()), doing="cache the answer")
        self._cached([key])

    def cache_may_hold(self, key: str, *, recheck: bool = True) -> bool:
        """False when the cache certainly has no entry under `key` (a look-up would miss),
        known without a query; True when it may have one.

        The keys are read once, and then only those added since: by this handle (its own
        writes), and by other connections, whose commits SQLite counts (`PRAGMA
        data_version`, compared when `recheck`: the LLM door does once per event-loop turn).
        Another connection's entries are read by row id from the highest one seen (SQLite
        gives a new row a higher id; fewer rows than before, a cache cleared or vacuumed, is
        read again whole). A cache of more than `CacheKeys.CAP` entries is not indexed:
        every look-up queries it."""
        keys = self._keys
        if keys is None or recheck:
            with self._lock, self._guard("read the cache"):
                keys = self._keys = CacheKeys.sync(self._db, self._keys)
        return keys.may_hold(key)

    def _cached(self, keys) -> None:
        """Keys this handle just wrote to the cache (SQLite does not count a connection's own
        commits in its data_version)."""
        if self._keys is not None:
            self._keys.add(keys)
