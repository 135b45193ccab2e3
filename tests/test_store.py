"""The SQLite store: exact schema, migrations recorded, runs round-trip, clear errors."""

import contextlib
import datetime
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from flowmagic.errors import StoreError
from flowmagic.store import calls as store_calls
from flowmagic.store import migrations
from flowmagic.store import Store

COLUMNS = {
    "calls": ["id", "ts", "endpoint", "model", "messages", "params", "response", "input_tokens",
              "output_tokens", "latency_s", "cost_usd", "cache_key", "cached", "error", "run_id",
              "node_id", "purpose", "cached_tokens"],
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
    "map_inputs": ["fingerprint", "run_id", "created", "item"],
    "run_state": ["run_id", "status", "updated", "result"],
}


def test_schema_is_exact_and_migrations_recorded(tmp_path):
    store = Store(tmp_path / "s.db")
    for table, columns in COLUMNS.items():
        assert store.columns(table) == columns
    names = [r[0] for r in sqlite3.connect(tmp_path / "s.db").execute("SELECT name FROM _migrations")]
    assert names == ["m001_initial", "m002_tools", "m003_map_inputs", "m004_run_state",
                     "m005_cached_tokens"]
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


def _old_store(path, runs: list[tuple]) -> None:
    """A store as flowmagic before m004 wrote it: its migrations, runs with their status,
    last change and result in the `runs` row."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL)")
    for fn in (migrations.m001_initial, migrations.m002_tools, migrations.m003_map_inputs):
        fn(db)
        db.execute("INSERT INTO _migrations VALUES (?, 0)", (fn.__name__,))
    for run_id, name, status, updated, result in runs:
        db.execute("INSERT INTO runs (id, name, task, created, updated, status, workflow, result)"
                   " VALUES (?,?,?,?,?,?,?,?)", (run_id, name, "t", 1.0, updated, status,
                                                 '{"task": "t", "nodes": [], "edges": []}', result))
    db.close()


def test_a_store_written_before_run_state_keeps_its_runs_states(tmp_path):
    """Upgraded, an old store's runs read with the status, order and result they had; a
    status set now is what is read (and exported) after, and a result set before stays."""
    _old_store(tmp_path / "s.db", [("r1", "a", "done", 10.0, "R1"),
                                   ("r2", "b", "running", 20.0, None)])
    store = Store(tmp_path / "s.db")
    assert [(r["id"], r["status"]) for r in store.list_runs()] == [("r2", "running"), ("r1", "done")]
    assert (store.load_run("r1")["status"], store.load_run("r1")["result"]) == ("done", "R1")
    store.set_run_status("r1", "running")
    assert [(r["id"], r["status"]) for r in store.list_runs()] == [("r1", "running"), ("r2", "running")]
    assert store.load_run("a")["result"] == "R1"   # no result given: the old one stays
    store.set_run_status("r1", "done", "R2")
    store.set_run_status("r1", "running")
    run = store.load_run("r1")
    assert (run["status"], run["result"]) == ("running", "R2")
    other = Store(tmp_path / "other.db")
    assert other.merge(store.export_run("r1"))
    assert (other.load_run("r1")["status"], other.load_run("r1")["result"]) == ("running", "R2")
    store.set_run_status("nope", "done")   # no such run: nothing is written
    assert [r["id"] for r in store.list_runs()] == ["r1", "r2"]


def test_a_status_change_does_not_rewrite_the_runs_workflow(tmp_path):
    """Setting a run's status (twice per run) writes a few pages, not the workflow's JSON
    again (3 MB at 10,000 nodes)."""
    store = Store(tmp_path / "s.db")
    nodes = [{"id": f"n{i}", "requirement": "x" * 500} for i in range(2000)]   # ~1 MB
    store.save_run("r1", task="t", workflow={"task": "t", "nodes": nodes, "edges": []})
    wal = tmp_path / "s.db-wal"
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    assert wal.stat().st_size == 0
    store.set_run_status("r1", "running")
    store.set_run_status("r1", "done", "the result")
    assert wal.stat().st_size < 64 * 1024
    assert (store.load_run("r1")["status"], store.load_run("r1")["result"]) == ("done", "the result")


@pytest.mark.parametrize("value", [
    "plain", "caf\u00e9 \U0001f600", "lone \ud800 surrogate", {1: "int key", None: "null key"},
    2**70, [1.5, 1e16, -0.0, 1795484959.8365583], {"when": datetime.date(2026, 1, 2)},
    {"deep": [[[{"x": [True, False, None]}]]]}, ("a", "tuple")])
def test_node_states_and_events_read_back_as_json_would_write_them(tmp_path, value):
    """Node rows and event data go through orjson or, for what it refuses, json: either
    way they read back as json.dumps(default=str) would have stored them."""
    store = Store(tmp_path / "s.db")
    store.save_run("r1", task="t", workflow={"task": "t", "nodes": [{"id": "a"}], "edges": []})
    store.write_batch("r1", [{"id": "a", "status": "done", "output": value}],
                      [("finished", "a", {"value": value})])
    expected = json.loads(json.dumps(value, default=str))
    if isinstance(value, str) and "\ud800" in value:
        expected = value   # kept, as a \u escape
    assert store.load_run("r1")["workflow"]["nodes"][0]["output"] == expected
    assert store.events("r1")[0]["data"] == {"value": expected}


def test_the_events_of_one_commit_are_listed_one_by_one_in_order(tmp_path):
    """A commit's events share one row; `events()` lists each with its own kind, node and
    data, in the order they were emitted, between events written alone, and so does a
    store the run is merged into."""
    store = Store(tmp_path / "s.db")
    store.save_run("r1", task="t", workflow={"task": "t", "nodes": [{"id": "a"}, {"id": "b"}],
                                             "edges": []})
    store.add_event("r1", "planned", None, {"k": 3})
    store.write_batch("r1", [], [("started", "a", {"agent": "x", "clone": None}),
                                 ("started", "b", None), ("tool", "b", {"round": 1})])
    store.write_batch("r1", [], [("finished", "a", {"masked": False})])
    store.write_batch("r1", [], [("finished", "b", {"masked": True}), ("run", None, {"s": "d"})])
    expected = [("planned", None, {"k": 3}), ("started", "a", {"agent": "x", "clone": None}),
                ("started", "b", None), ("tool", "b", {"round": 1}),
                ("finished", "a", {"masked": False}), ("finished", "b", {"masked": True}),
                ("run", None, {"s": "d"})]
    events = store.events("r1")
    assert [(e["kind"], e["node_id"], e["data"]) for e in events] == expected
    assert all(list(e) == ["id", "run_id", "node_id", "ts", "kind", "data"] for e in events)
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    other = Store(tmp_path / "other.db")
    other.merge(store.export_run("r1"))
    assert [(e["kind"], e["node_id"], e["data"]) for e in other.events("r1")] == expected


# ------------------------------------------------------------------ hostile stores (issue 19)
# Each fault reaches the user through a door (the `flowmagic` command) and must end in one
# `flowmagic:` line on stderr that says what and how to fix it; nothing is lost.
def _cli(capsys, *argv) -> tuple[int, str, str]:
    from flowmagic import cli

    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("flowmagic: "), err
    assert "Traceback" not in err
    return lines[0]


def _logged_store(path, n: int = 3) -> None:
    store = Store(path)
    for i in range(n):
        store.log_call(endpoint="e", model="m", messages=[{"role": "user", "content": f"q{i}"}],
                       params={}, response={"text": f"a{i}"})
    store.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "header-only", "empty-pages"])
def test_damaged_store_is_moved_aside_and_a_new_one_starts(tmp_path, monkeypatch, capsys, damage):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLOWMAGIC_HOME", str(home))
    db = home / "flowmagic.db"
    _logged_store(tmp_path / "good.db", 200)
    good = (tmp_path / "good.db").read_bytes()
    db.write_bytes({"garbage": b"not a database " * 500, "truncated": good[: len(good) // 2],
                    "header-only": good[:100], "empty-pages": good[:4096] + bytes(8192)}[damage])
    before = db.read_bytes()
    code, out, err = _cli(capsys, "log")
    line = _one_line(err)
    backup = next(home.glob("flowmagic.db.damaged-*"))
    assert str(backup) in line and "moved" in line
    assert backup.read_bytes() == before            # nothing the user had is lost
    assert code == 0 and "no model calls logged yet" in out
    Store(db).log_call(endpoint="e", model="m", messages=[], params={})   # the new one works


def test_home_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "home"
    blocker.write_text("a file")
    monkeypatch.setenv("FLOWMAGIC_HOME", str(blocker))
    code, _, err = _cli(capsys, "log")
    assert code == 1 and "is a file" in _one_line(err) and "FLOWMAGIC_HOME" in err


def test_store_path_that_is_a_folder_is_one_line(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    (home / "flowmagic.db").mkdir(parents=True)
    monkeypatch.setenv("FLOWMAGIC_HOME", str(home))
    code, _, err = _cli(capsys, "log")
    assert code == 1 and "is a folder" in _one_line(err)


def test_bad_json_in_a_table_is_one_line_naming_the_row(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("FLOWMAGIC_HOME", str(home))
    _logged_store(home / "flowmagic.db")
    workflow = {"task": "t", "nodes": [{"id": "a", "status": "done", "output": "A"}], "edges": []}
    saved = Store(home / "flowmagic.db")
    saved.save_run("r1", task="t", name="demo", workflow=workflow)
    saved.save_node("r1", workflow["nodes"][0])   # a node's row: its state changed after the save
    db = sqlite3.connect(home / "flowmagic.db")
    db.execute("UPDATE calls SET messages = '{oops' WHERE id = 2")
    db.execute("UPDATE nodes SET data = 'not json' WHERE node_id = 'a'")
    db.commit()
    code, _, err = _cli(capsys, "log")
    line = _one_line(err)
    assert code == 1 and "table calls (id = 2)" in line and "DELETE FROM calls WHERE id = 2" in line
    code, _, err = _cli(capsys, "export", "demo", tmp_path / "x.ipynb")
    assert code == 1 and "table nodes" in _one_line(err)
    # a damaged cache entry is a miss, not an error
    store = Store(home / "flowmagic.db")
    store.cache_put("k", {"text": "x"})
    sqlite3.connect(home / "flowmagic.db").execute("UPDATE cache SET payload = '[' ").connection.commit()
    assert store.cache_get("k") is None


def test_full_disk_says_so_instead_of_cannot_rollback(tmp_path):
    store = Store(tmp_path / "s.db")
    store._db.execute("PRAGMA max_page_count = 12")   # SQLite's own "disk is full" (SQLITE_FULL)
    workflow = {"task": "t", "nodes": [{"id": f"n{i}", "output": "x" * 2000} for i in range(40)],
                "edges": []}
    for write in (lambda: store.save_run("r", task="t", workflow=workflow),
                  lambda: store.write_batch("r", workflow["nodes"], [("finished", "n1", None)]),
                  lambda: [store.log_call(endpoint="e", model="m", messages="x" * 5000, params={})
                           for _ in range(40)]):
        with pytest.raises(StoreError) as info:
            write()
        message = str(info.value)
        assert "full" in message and "rollback" not in message and "\n" not in message
    assert store.list_runs() == []   # the failed transaction left nothing half-written


def _bwrap_read_only(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run argv with the whole file system mounted read-only (as a shared or archived store
    would be); root ignores file modes, a read-only mount it cannot."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap (bwrap) is not installed; `make test` installs it")
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "true"],
                           capture_output=True)
    if probe.returncode:
        pytest.skip(f"this machine does not let bwrap mount: {probe.stderr.decode()[:100]}")
    return subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                           *argv], capture_output=True, text=True, env=env, timeout=60)


def test_read_only_store_can_be_read_and_refuses_writes_in_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _logged_store(home / "flowmagic.db")
    env = {**os.environ, "FLOWMAGIC_HOME": str(home), "FLOWMAGIC_BASE_URL": "http://127.0.0.1:9/v1",
           "FLOWMAGIC_MODEL": "m"}
    log = _bwrap_read_only([sys.executable, "-m", "flowmagic.cli", "log"], env)
    assert log.returncode == 0, log.stderr
    assert "Traceback" not in log.stderr and log.stdout.count(" call ") == 3
    plan = _bwrap_read_only([sys.executable, "-m", "flowmagic.cli", "plan", "make tea"], env)
    assert plan.returncode == 1 and "Traceback" not in plan.stderr
    line = [x for x in plan.stderr.splitlines() if x.startswith("flowmagic:")]
    assert len(line) == 1 and "read-only" in line[0] and "FLOWMAGIC_HOME" in line[0], plan.stderr


def test_load_by_name_brings_back_the_real_run_not_a_replay(tmp_path):
    """An exported notebook's replay makes a run of the same name; load(NAME) must not
    return it in place of the run that did the work."""
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.flow import flow_from_plan

    store = Store(tmp_path / "s.db")
    plan = {"task": "t", "nodes": [{"id": "a", "requirement": "do a"}], "edges": []}
    real = Flow.from_dict(plan, name="tea", store=store)
    real.workflow.nodes["a"].status, real.status = "done", "done"
    real._save_run()
    replay = flow_from_plan(plan, "tea", store=store)
    assert replay.run_id != real.run_id
    loaded = flowmagic.load("tea", store=store)
    assert loaded.run_id == real.run_id and loaded.origin is None
    assert flowmagic.load(replay.run_id, store=store).origin == "replay"   # by id: that run


def test_a_run_merged_from_another_store_is_complete_and_merged_once(tmp_path):
    worker, user = Store(tmp_path / "w.db"), Store(tmp_path / "u.db")
    worker.save_run("r1", task="t", workflow={"nodes": [{"id": "a", "output": "x"}]}, name="m[0]")
    worker.log_call(endpoint="e", model="e:m", messages=[{"role": "user", "content": "q"}],
                    params={}, response={"text": "x"}, input_tokens=3, output_tokens=2,
                    cache_key="k1", run_id="r1", node_id="a", cache_payload={"text": "x"})
    worker.add_event("r1", "done", "a")
    user.log_call(endpoint="e", model="e:m", messages=[], params={}, run_id="other")
    dump = worker.export_run("r1")
    assert user.merge(dump, fingerprint="fp", item={"state": "done"}) is True
    assert user.merge(dump, fingerprint="fp", item={"state": "done"}) is False   # idempotent
    assert [c["node_id"] for c in user.recent_calls(run_id="r1")] == ["a"]
    assert user.count_calls() == 2 and len(user.events("r1")) == 1
    assert user.load_run("r1")["workflow"]["nodes"][0]["output"] == "x"
    assert user.cache_get("k1") == {"text": "x"}
    assert user.map_done(["fp", "nope"]) == {"fp": {"state": "done"}}


def test_checkpoints_run_in_their_own_thread_and_end_with_the_store(tmp_path):
    """A commit never runs SQLite's checkpoint (its disk syncs) itself: a thread of the
    store's does, the data reaches the database file, and closing the store ends it."""
    import threading
    import time

    store = Store(tmp_path / "flowmagic.db")
    for i in range(300):
        store.save_node("r", {"id": f"n{i}", "requirement": "x" * 400})
    deadline = time.monotonic() + 20   # the thread copies the log into the database file
    while (tmp_path / "flowmagic.db").stat().st_size < 100 * 400 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "flowmagic.db").stat().st_size >= 100 * 400
    name = f"flowmagic-checkpoint {tmp_path / 'flowmagic.db'}"
    assert any(t.name == name for t in threading.enumerate())
    store.close()
    assert not any(t.name == name and t.is_alive() for t in threading.enumerate())
    assert not (tmp_path / "flowmagic.db-wal").exists()   # the last connection checkpointed
    db = sqlite3.connect(tmp_path / "flowmagic.db")
    try:
        assert db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0] == 300
    finally:
        db.close()


def test_cache_may_hold_knows_its_own_and_others_writes(tmp_path, monkeypatch):
    """`cache_may_hold` is False only for a key the cache certainly lacks: its own writes
    count at once (a connection's own commits do not change its data_version), another
    connection's from the next recheck, and a cache too big to index answers True."""
    path = tmp_path / "s.db"
    mine, theirs = Store(path), Store(path)
    assert not mine.cache_may_hold("a")
    mine.cache_put("a", {"text": "x"})
    assert mine.cache_may_hold("a", recheck=False)
    theirs.cache_put("b", {"text": "y"})
    assert not mine.cache_may_hold("b", recheck=False)   # not rechecked: as of before
    assert mine.cache_may_hold("b") and mine.cache_get("b") == {"text": "y"}
    theirs.log_calls([dict(endpoint="e", model="m", messages=[], params={}, response={"t": 1},
                           cache_key="c", cache_payload={"t": 1})])
    assert mine.cache_may_hold("c")
    mine.merge({"run_id": "r1", "rows": {"cache": [   # a worker's entries merged here
        {"key": "m", "payload": '{"text": "z"}', "created": 0.0}]}})
    assert mine.cache_may_hold("m", recheck=False)
    monkeypatch.setattr(store_calls.CacheKeys, "CAP", 2)
    big = Store(path)
    assert big.cache_may_hold("never written") and big.cache_get("never written") is None
