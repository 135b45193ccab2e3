"""A run and what it is made of: its row, its nodes' latest states, its events and its
updates, written together in one commit per batch and read back as one run."""

from __future__ import annotations

import time
from typing import Any, Callable

from .calls import CallLog
from .encoding import dumps, dumps_state
from .scrub import known_secrets, scrub_args
from ..errors import StoreError
from ..model.status import RunState

__all__ = ["Runs", "RUN_ROWS"]

# A run's row as `runs` holds it, with its status, last change and result from its
# `run_state` row when it has one (a run saved by an older flowmagic has none).
RUN_ROWS = ("SELECT r.id, r.name, r.task, r.created, COALESCE(s.updated, r.updated) AS updated,"
            " COALESCE(s.status, r.status) AS status, r.workflow, r.candidates, r.settings,"
            " CASE WHEN s.run_id IS NULL THEN r.result ELSE s.result END AS result"
            " FROM runs r LEFT JOIN run_state s ON s.run_id = r.id")
# The kind of an events row that holds the events of one commit (two or more), its data
# a JSON list of [kind, node_id, data]: one row a commit instead of two a node (an emitted
# event's data is an object or null, never a list). `Store.events` lists them one by one.
_EVENTS = "events"


class Runs(CallLog):
    """The runs of a `Store` (a batch of node states logs its calls in the same commit)."""

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
                scrub_args((run_id, name, task, now, now, status, dumps(workflow),
                            None if candidates is None else dumps(candidates),
                            None if settings is None else dumps(settings), result),
                           known_secrets()),
            )
            db.execute("INSERT OR REPLACE INTO run_state (run_id, status, updated, result)"
                       " VALUES (?,?,?,?)",
                       scrub_args((run_id, status, now, result), known_secrets()))
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
        self._execute(self._NODE_SQL, (run_id, node["id"], dumps(node), time.time()),
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
            rows = [(run_id, node["id"], dumps_state(node), now) for node in nodes]
            self._executemany(db, self._NODE_SQL, rows)
            if len(events) > 1:   # one row: see _EVENTS
                db.execute(
                    "INSERT INTO events (run_id, node_id, ts, kind, data) VALUES (?,?,?,?,?)",
                    self._scrubbed((run_id, None, now, _EVENTS,
                                    dumps_state([list(event) for event in events]))))
            elif events:
                kind, node_id, data = events[0]
                db.execute(
                    "INSERT INTO events (run_id, node_id, ts, kind, data) VALUES (?,?,?,?,?)",
                    self._scrubbed((run_id, node_id, now, kind,
                                    None if data is None else dumps_state(data))))

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
            (run_id, node_id, time.time(), kind, None if data is None else dumps(data)),
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
            (run_id, time.time(), dumps(data)), doing="record the update")

    def load_run(self, run_id: str, *, skip_origin: str | None = None) -> dict:
        """A run by id, else the latest run of that name whose settings' origin is not
        `skip_origin` (e.g. "replay": the runs an exported notebook's cells made)."""
        rows = self._query(
            f"{RUN_ROWS} WHERE r.id = ? OR (r.name = ? AND coalesce(CASE WHEN"
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

    def list_runs(self, n: int = 20) -> list[dict]:
        return self._query(
            "SELECT r.id, r.name, r.task, COALESCE(s.status, r.status) AS status, r.created,"
            " COALESCE(s.updated, r.updated) AS updated FROM runs r"
            " LEFT JOIN run_state s ON s.run_id = r.id ORDER BY updated DESC LIMIT ?", (n,))
