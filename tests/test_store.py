"""The SQLite store: exact schema, migrations recorded, runs round-trip, clear errors."""

import sqlite3

import pytest

from flowmagic.errors import StoreError
from flowmagic.store import Store

COLUMNS = {
    "calls": ["id", "ts", "endpoint", "model", "messages", "params", "response", "input_tokens",
              "output_tokens", "latency_s", "cost_usd", "cache_key", "cached", "error", "run_id",
              "node_id", "purpose"],
    "cache": ["key", "payload", "created"],
    "runs": ["id", "name", "task", "created", "updated", "status", "workflow", "candidates",
             "settings", "result"],
    "nodes": ["run_id", "node_id", "data", "updated"],
    "events": ["id", "run_id", "node_id", "ts", "kind", "data"],
    "updates": ["id", "run_id", "ts", "data"],
    "tool_calls": ["id", "run_id", "node_id", "ts", "tool", "arguments", "result", "duration_s",
                   "error", "round", "protocol"],
    "orchestrator": ["id", "run_id", "seq", "turn", "ts", "sender", "recipient", "kind", "content",
                     "tokens_in", "tokens_out", "cost_usd", "cached", "call_id"],
}


def test_schema_is_exact_and_migrations_recorded(tmp_path):
    store = Store(tmp_path / "s.db")
    for table, columns in COLUMNS.items():
        assert store.columns(table) == columns
    names = [r[0] for r in sqlite3.connect(tmp_path / "s.db").execute("SELECT name FROM _migrations")]
    assert names == ["m001_initial", "m002_tools"]
    assert sqlite3.connect(tmp_path / "s.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    Store(tmp_path / "s.db")  # opening again applies nothing twice


def test_newer_store_is_refused_with_advice(tmp_path):
    Store(tmp_path / "s.db")
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("INSERT INTO _migrations VALUES ('m999_future', 0)")
    db.commit()
    with pytest.raises(StoreError, match="newer flowmagic"):
        Store(tmp_path / "s.db")


def test_unwritable_home_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="FLOWMAGIC_HOME"):
        Store(blocker / "sub" / "s.db")


def test_run_round_trip_with_latest_node_state(tmp_path):
    store = Store(tmp_path / "s.db")
    workflow = {"task": "t", "nodes": [{"id": "a", "status": "pending"},
                                       {"id": "b", "status": "pending"}], "edges": [["a", "b"]]}
    store.save_run("r1", task="t", name="demo", workflow=workflow, settings={"k": 3})
    store.save_node("r1", {"id": "a", "status": "done", "output": "A"})
    store.add_event("r1", "finished", "a", {"tokens": 3})
    store.add_update("r1", {"kind": "no change"})
    run = Store(tmp_path / "s.db").load_run("demo")
    assert run["id"] == "r1" and run["settings"] == {"k": 3}
    assert run["workflow"]["nodes"][0] == {"id": "a", "status": "done", "output": "A"}
    assert run["workflow"]["edges"] == [["a", "b"]]
    assert run["updates"] == [{"kind": "no change"}]
    assert [e["kind"] for e in store.events("r1")] == ["finished"]
    with pytest.raises(StoreError, match="recent runs: r1"):
        store.load_run("nope")
