"""Moving runs between stores (a distributed map's workers -> the user's store): a run
exported as plain rows, merged into another store once, and the map inputs done."""

from __future__ import annotations

import time
from typing import Any

from .calls import CallLog
from .encoding import dumps
from .runs import RUN_ROWS
from .scrub import known_secrets, scrub_args

__all__ = ["Transfer"]

# The tables that hold one run, and what `export_run` / `merge` copy between stores (a
# run's state goes in its `runs` row: `runs.RUN_ROWS`).
_RUN_TABLES = ("runs", "nodes", "events", "updates", "calls", "tool_calls", "orchestrator")


class Transfer(CallLog):
    """Export, merge and map inputs of a `Store`."""

    def export_run(self, run_id: str) -> dict:
        """Every row of one run (its calls, nodes, events, ...) and the cache entries its
        calls made, as plain data another store can `merge`."""
        rows = {t: self._query(f"{RUN_ROWS} WHERE r.id = ?" if t == "runs" else
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
        secrets = known_secrets()
        merged = []
        with self._transaction("merge a worker's runs") as db:
            for export, fingerprint, item in runs:
                if fingerprint is not None:
                    db.execute("INSERT OR REPLACE INTO map_inputs (fingerprint, run_id, created,"
                               " item) VALUES (?,?,?,?)", scrub_args(
                                   (fingerprint, export["run_id"], time.time(), dumps(item)),
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
