"""flow.map(engine="dask"): the batch on a LocalCluster of worker processes, over a loopback
server (real HTTP; the client is never patched). One cluster of 2 workers is shared by the
module (start-up costs seconds); one test starts its own on demand, as a user's map does."""

import contextlib
import json
import os
import pathlib
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

import flowmagic
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.ops import distributed
from flowmagic.ops.distributed import to_inputs
from flowmagic.testing.loopback import LoopbackServer

pytest.importorskip("dask.distributed")

PLAN = {"nodes": [{"id": "ask", "requirement": "Look up {{city}} in {{year}}"}], "edges": []}
# a canary made per run (no key-shaped literal in the repository): it must reach no worker disk
KEY = f"sk-cluster-{secrets.token_hex(16)}"
ASKED = re.compile(r"Look up (c\d+) in (\d+)")


def echo(body) -> str:
    found = ASKED.search(str(body.get("messages")))
    return f"found {found.group(1)}/{found.group(2)}" if found else "?"


def asked(server) -> list[str]:
    """The city of every chat request the server received, in arrival order."""
    return [m.group(1) for r in server.requests if (m := ASKED.search(str(r["body"])))]


def worker_files(cluster) -> list[pathlib.Path]:
    folders = cluster.run(lambda dask_worker: dask_worker.local_directory)
    return [p for f in folders.values() for p in pathlib.Path(f).rglob("*") if p.is_file()]


def cities(n: int) -> pd.DataFrame:
    return pd.DataFrame({"city": [f"c{i}" for i in range(n)], "year": [2000 + i for i in range(n)]})


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=4, processes=True,
                      dashboard_address=":0") as local, Client(local) as client:
        yield client


def test_200_rows_on_two_workers_complete_in_order_logged_and_resumed_with_zero_calls(cluster):
    frame = cities(200)

    def latency(body):  # early rows answer slowest, so rows finish out of input order
        found = ASKED.search(str(body.get("messages")))
        return 0.002 * (200 - int(found.group(1)[1:])) / 10 if found else 0.0

    with LoopbackServer(responder=echo, latency=latency) as server:
        flowmagic.configure(base_url=server.base_url, model="m", api_key=KEY)
        flow = Flow.from_dict(PLAN, task="answer questions")
        seen, stores, leaked = [], set(), []

        def look(progress):
            seen.append(progress.line())
            if len(stores) < 2:   # mid-map, until both workers have begun: their own stores
                for p in worker_files(cluster):   # are on their disks, and hold no key
                    if p.name.startswith("flowmagic-") and p.suffix == ".db":
                        stores.add(p)
                    with contextlib.suppress(FileNotFoundError):   # a journal gone meanwhile
                        leaked.extend([p] if KEY.encode() in p.read_bytes() else [])

        out = flow.map(frame, engine=cluster, progress=look)
        after = worker_files(cluster)
        threads = cluster.run(lambda: [t.name for t in threading.enumerate()])
        first = asked(server)
        again = flow.map(frame, engine=cluster, progress=False)
        second = asked(server)[len(first):]
    assert list(out["city"]) == list(frame["city"])
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(200)]
    assert list(out["node:ask"]) == list(out["result"])
    assert set(out["status"]) == {"done"} and out["error"].isna().all()
    assert (out["tokens_in"] > 0).all() and (out["time_s"] > 0).all()
    assert sorted(first) == sorted(frame["city"])           # each input ran once
    assert first[:3] != ["c0", "c1", "c2"]   # answers came back out of order; order restored
    assert seen[-1].startswith("map 200/200 | done 200 | failed 0")
    # Every call is in the user's store: `flowmagic log` and the runs see the workers' work.
    calls = flow.store.recent_calls(1000)
    assert len(calls) == 200 and {c["run_id"] for c in calls} == set(out["run_id"])
    assert flow.store.load_run(out["run_id"][7])["workflow"]["nodes"][0]["output"] == "found c7/2007"
    # The same inputs again: zero calls, every row resumed with the same answers.
    assert second == []
    assert again["resumed"].all() and list(again["result"]) == list(out["result"])
    # No key on any worker's disk (stores, spill), in the user's store, nor in the payload.
    assert len(stores) == 2 and not leaked
    assert not [p for p in pathlib.Path(os.environ["FLOWMAGIC_HOME"]).rglob("*")
                if p.is_file() and KEY.encode() in p.read_bytes()]
    # When the map ends each worker drops it: no store file, no loop thread left behind.
    assert not [p for p in after if p.name.startswith("flowmagic-")]
    assert not [t for names in threads.values() for t in names if t.startswith("flowmagic-map")]
    assert KEY.encode() not in distributed.task_payload(flow, distributed._endpoints())


def test_killed_worker_mid_map_every_input_done_once(cluster):
    pids = cluster.run(os.getpid)
    frame = cities(60)
    killed = []

    def kill_one(progress):
        if progress.done >= 12 and not killed:
            pid = next(iter(pids.values()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with LoopbackServer(responder=echo, latency=0.1) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(frame, engine=cluster, concurrency=2, progress=kill_one)
    assert killed
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(60)]
    assert set(out["status"]) == {"done"}
    # Each input is in the user's store once, however often a dead worker's task was retried.
    runs = [r["id"] for r in flow.store.list_runs(1000) if r["id"] != flow.run_id]
    assert len(runs) == 60 and set(runs) == set(out["run_id"])
    assert len(flow.store.recent_calls(1000)) == 60
    cluster.wait_for_workers(2, timeout=60)   # the nanny restarted it, for the next tests


SCRIPT = """
import flowmagic, pandas as pd
from flowmagic.flow import Flow
frame = pd.DataFrame({"city": [f"c{i}" for i in range(40)], "year": [2000 + i for i in range(40)]})
flow = Flow.from_dict(%r, task="answer questions")
print("started", flush=True)
flow.map(frame, engine="dask", concurrency=1, progress=False)
"""


def test_interrupted_driver_then_map_again_skips_finished_inputs(cluster, tmp_path, monkeypatch):
    with LoopbackServer(responder=echo, latency=0.3) as server:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", server.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        env = dict(os.environ, FLOWMAGIC_DASK=cluster.scheduler.address)
        driver = subprocess.Popen([sys.executable, "-c", SCRIPT % PLAN], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        db = pathlib.Path(os.environ["FLOWMAGIC_HOME"]) / "flowmagic.db"
        deadline = time.monotonic() + 120
        done_before = 0
        while done_before < 6 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
            if db.exists():
                with sqlite3.connect(db) as con:
                    try:
                        done_before = con.execute("SELECT COUNT(*) FROM map_inputs").fetchone()[0]
                    except sqlite3.OperationalError:   # not migrated yet
                        pass
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=60)
        assert b"KeyboardInterrupt" in err, err[-2000:]
        with sqlite3.connect(db) as con:
            finished = {re.search(r"c\d+", item).group(0)
                        for (item,) in con.execute("SELECT item FROM map_inputs")}
        assert 6 <= len(finished) < 40
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(cities(40), engine=cluster, progress=False)
        every = asked(server)
    assert all(every.count(city) == 1 for city in finished)   # nothing finished ran again
    assert set(every) == {f"c{i}" for i in range(40)}
    assert set(out["status"]) == {"done"} and out["resumed"].sum() >= len(finished)
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(40)]


def test_rate_limits_hold_across_the_cluster(cluster):
    with LoopbackServer(responder=echo, latency=0.3) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(cities(14), engine=cluster, progress=False, rpm=5, window_s=4.0,
                       requests_at_once=2)
        chats = [r for r in server.requests if ASKED.search(str(r["body"]))]
    assert set(out["status"]) == {"done"} and len(chats) == 14
    arrived = sorted(r["arrived"] for r in chats)
    # At most 5 in any 4 s window (1 s of slack for the trip from lease to server on a
    # loaded machine; per-worker limits would let 10 through)...
    assert max(sum(t <= a < t + 3.0 for a in arrived) for t in arrived) <= 5
    assert arrived[-1] - arrived[0] >= 7.0       # 14 requests at 5 per 4 s: three windows
    # ... and at most 2 in flight at once, though 2 workers x 4 threads could send 8.
    spans = [(r["arrived"], r["finished"]) for r in chats]
    assert max(sum(a <= t < f for a, f in spans) for t, _ in spans) <= 2


@pytest.mark.parametrize("limit", ["configure(concurrency=2)", "a server with 2 slots"])
def test_an_endpoints_own_limit_holds_across_the_cluster(cluster, limit):
    # In process these hold for the process, i.e. the whole map; each of 2 workers holding
    # them on its own would let 4 requests reach the server at once.
    with LoopbackServer(responder=echo, latency=0.2,
                        slots=2 if "slots" in limit else None) as server:
        if "slots" in limit:   # a llama.cpp server: its slots are read from GET /props
            flowmagic.configure(base_url=server.base_url, model="m", self_hosted=True)
        else:
            flowmagic.configure(base_url=server.base_url, model="m", concurrency=2)
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(cities(16), engine=cluster, concurrency=4, progress=False)
        peak = server.stats()["max_in_flight"]
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(16)]
    assert peak == 2


def test_a_later_map_with_other_limits_on_the_same_cluster_runs(cluster):
    # The scheduler refuses a second semaphore of one name with other leases.
    with LoopbackServer(responder=echo, latency=0.05) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        first = flow.map(cities(16)[:8], engine=cluster, progress=False, requests_at_once=2,
                         rpm=100)
        then = flow.map(cities(16)[8:], engine=cluster, progress=False, requests_at_once=3,
                        rpm=200)
    assert set(first["status"]) == set(then["status"]) == {"done"}, list(then["error"])[:1]


def test_workers_take_an_endpoint_as_hosted_or_local_as_the_driver_does(cluster):
    # The workers' environment lacks the driver's FLOWMAGIC_SELF_HOSTED=0 (conftest), and
    # by its address alone the loopback server is one the user runs: streamed and queued
    # one request at a time (it does not report its slots).
    with LoopbackServer(responder=echo, latency=0.1) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(cities(8), engine=cluster, concurrency=4, progress=False)
        bodies = [r["body"] for r in server.requests if ASKED.search(str(r["body"]))]
        peak = server.stats()["max_in_flight"]
    assert set(out["status"]) == {"done"} and len(bodies) == 8
    assert not [b for b in bodies if b.get("stream")]   # sent as the driver would
    assert peak > 2


def test_a_budget_stops_submitting_new_inputs(cluster):
    from flowmagic.llm import endpoints
    endpoints.set_prices({"m": (100.0, 100.0)})   # USD per million tokens: ~$0.002 a call
    with LoopbackServer(responder=echo, latency=0.2) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        lines = []
        out = flow.map(cities(30), engine=cluster, concurrency=1, budget_usd=0.001,
                       progress=lambda p: lines.append(p.line()))
        ran = asked(server)
    done, skipped = out[out["status"] == "done"], out[out["status"] == "skipped"]
    assert 1 <= len(done) <= 6 and len(done) + len(skipped) == 30    # the window in flight
    assert sorted(ran) == sorted(done["city"]) and skipped["error"].str.contains("budget").all()
    assert "not run (budget $0.001 reached)" in lines[-1]


def test_flowmagic_map_command_and_flow_map_magic_on_a_data_file(cluster, tmp_path, monkeypatch,
                                                                  capsys):
    from IPython.core.error import UsageError

    from conftest import ipython_shell
    from flowmagic.cli import main
    from flowmagic.jupyter.mapbar import map_progress_bar

    cities(8).to_csv(tmp_path / "in.csv", index=False)
    cities(3).to_json(tmp_path / "in.jsonl", orient="records", lines=True)
    address = cluster.scheduler.address
    with LoopbackServer(responder=echo) as server:
        monkeypatch.setenv("FLOWMAGIC_BASE_URL", server.base_url)
        monkeypatch.setenv("FLOWMAGIC_MODEL", "m")
        flow = Flow.from_dict(PLAN, task="answer questions", name="lookup")
        assert main(["map", "lookup", str(tmp_path / "in.csv"), "--out",
                     str(tmp_path / "out.jsonl"), "--engine", address, "--concurrency", "2",
                     "--at-once", "2", "--budget-usd", "5"]) == 0
        printed = capsys.readouterr()
        assert main(["map", "lookup", str(tmp_path / "in.txt")]) == 1
        bad = capsys.readouterr().err
        before = len(asked(server))
        assert main(["map", "lookup", str(tmp_path / "in.jsonl"), "--engine", "inprocess",
                     "--out", str(tmp_path / "here.csv")]) == 0
        here = len(asked(server)) - before
        capsys.readouterr()
        with ipython_shell() as ip:
            ip.user_ns["lookup"] = flow
            frame = ip.run_line_magic("flow", f"map lookup {tmp_path / 'in.jsonl'} --engine "
                                              f"{address} --concurrency 2 --budget-usd 1")
            mistakes = []
            for words in ("--workers 0", f"--engine {address} --workers 2", "--speed 3"):
                with pytest.raises(UsageError) as caught:
                    ip.run_line_magic("flow", f"map lookup {tmp_path / 'in.jsonl'} {words}")
                mistakes.append(str(caught.value))
    out = pd.read_json(tmp_path / "out.jsonl", lines=True)
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(8)]
    assert "wrote" in printed.out and "8 done" in printed.out
    assert "map 8/8 | done 8" in printed.err and printed.err.rstrip().endswith("| 2 workers")
    assert bad.strip().splitlines() == [
        f"flowmagic: {tmp_path / 'in.txt'}: give the inputs as .csv, .parquet or .jsonl "
        "(one input per row, columns as {{field}})"]
    # In this process: the same answers, from the cache the Dask map merged into the store.
    assert here == 0 and list(pd.read_csv(tmp_path / "here.csv")["result"]) == list(out["result"][:3])
    assert list(frame["result"]) == [f"found c{i}/{2000 + i}" for i in range(3)]
    assert frame["resumed"].all()            # the same rows as the command's first three
    assert "--workers: must be at least 1, not 0" in mistakes[0]
    assert "workers= sizes the LocalCluster" in mistakes[1]
    assert "unrecognized arguments: --speed 3" in mistakes[2]
    assert all("\n" not in m for m in mistakes)
    # The notebook's bar: shown once, then kept current with the progress line.
    shown = []
    update = map_progress_bar(shown.append)
    state = distributed.MapProgress(total=4, done=3, failed=1, dashboard="http://h:8787/status")
    update(state)
    update(state)
    bar, text = shown[0].children
    assert len(shown) == 1 and (bar.value, bar.max, bar.bar_style) == (4, 4, "danger")
    assert "done 3 | failed 1" in text.value and 'href="http://h:8787/status"' in text.value


def test_a_dask_dataframe_runs_partition_by_partition_and_resumes(cluster):
    import dask.dataframe as dd

    def population(city: str) -> str:   # a notebook's tool: shipped by value to the workers
        """The population of a city."""
        return f"{city} has {len(city) * 1000} people"

    def responder(body):   # ask for the tool once, then answer with what it said
        said = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
        if body.get("tools") and not said:
            city = ASKED.search(str(body["messages"])).group(1)
            return {"tool_calls": [{"function": {"name": "population",
                                                 "arguments": json.dumps({"city": city})}}]}
        return f"{echo(body)} ({said[-1] if said else 'no tool'})"

    frame = dd.from_pandas(cities(20), npartitions=4)
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        flow.tools = [population]
        lazy = flow.map(frame, engine=cluster, progress=False)
        held = [k for k in cluster.who_has() if str(k).endswith("-frame")]
        first = asked(server)
        again = flow.map(frame, engine=cluster, progress=False).compute()
        second = asked(server)[len(first):]
    # A Dask DataFrame out: one partition per input partition, held by the workers.
    assert isinstance(lazy, dd.DataFrame) and lazy.npartitions == 4
    assert len(held) == 4 and lazy.divisions == frame.divisions
    out = lazy.compute()
    assert list(out.index) == list(range(20))
    assert list(out["city"]) == [f"c{i}" for i in range(20)]
    assert list(out["result"]) == [f"found c{i}/{2000 + i} (c{i} has {len(f'c{i}') * 1000} people)"
                                   for i in range(20)]
    assert sorted(set(first)) == sorted(out["city"]) and second == []
    assert again["resumed"].all() and list(again["result"]) == list(out["result"])
    assert len(flow.store.recent_calls(100)) == 40   # the tool round and the answer, per row
    assert len(flow.store.tool_calls(out["run_id"][3])) == 1


def test_dask_map_on_demand_local_cluster_and_one_line_mistakes():
    import dask.dataframe as dd

    with LoopbackServer(responder=echo) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        lines = []
        # A Dask DataFrame on a cluster that closes with the map: its partitions come here.
        out = flow.map(dd.from_pandas(cities(6), npartitions=2), engine="dask", workers=1,
                       progress=lambda p: lines.append(p.line()))
        assert isinstance(out, dd.DataFrame) and out.npartitions == 2
        out = out.compute()
        with pytest.raises(ConfigError, match="for engine='dask'"):
            flow.map(cities(2), budget_usd=1)
        with pytest.raises(ConfigError, match="finite amount"):
            flow.map(cities(2), engine="dask", budget_usd=float("nan"))
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(6)]
    assert lines[-1].startswith("map 6/6 | done 6") and lines[-1].endswith("| 1 worker")
    # A list is one input per item; a single string is a one-line mistake, not 30 inputs.
    assert to_inputs(["a", "b"]) == (["a", "b"], [])
    with pytest.raises(ConfigError, match="wrap a single input in a list"):
        to_inputs("not a list")


def _cut(chunks, timed: float | None = None) -> list[int]:
    """The sizes of the tasks `chunks` cuts, telling it each input took `timed` seconds."""
    sizes = []
    while chunks:
        unit = chunks.take()
        sizes.append(len(unit[1]))
        if timed is not None:
            chunks.learn([{"duration_s": timed}] * len(unit[1]))
    return sizes


@pytest.mark.parametrize("n, threads, workers, timed, small, expected", [
    # Not yet measured: what one worker runs at once, smaller when few inputs are left.
    (10, 4, 2, None, False, [2, 2, 1, 1, 1, 1, 1, 1]),
    (30, 4, 2, None, False, [4, 4, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1]),
    # Measured at 0.2 s an input (4 at once): up to 2 s of a worker's work (40 inputs),
    # a sixth of what is left, shrinking to single inputs at the end.
    (256, 4, 2, 0.2, False, [4, 40, 36, 30, 25, 21, 17, 14, 12, 10, 8, 7, 6, 5, 4, 3, 3, 2, 2,
                             2, 1, 1, 1, 1, 1]),
    # Fast inputs: the share of what is left decides; a budget keeps tasks small.
    (100, 4, 2, 0.001, False, [4, 16, 14, 11, 10, 8, 7, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1]),
    (20, 4, 2, 0.001, True, [4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1]),
])
def test_inputs_are_cut_into_tasks_that_shrink_towards_the_end(n, threads, workers, timed, small,
                                                               expected):
    from flowmagic.ops.chunks import Chunks

    todo = [(f"fp{i}", i, {"city": f"c{i}"}) for i in range(n)]
    sizes = _cut(Chunks(todo, threads, workers, small=small), timed)
    assert sizes == expected and sum(sizes) == n


def test_inputs_in_flight_keep_every_worker_fed_and_each_input_goes_once():
    from flowmagic.ops.chunks import Chunks

    todo = [(f"fp{i}", i, i) for i in range(40)]
    chunks = Chunks(todo, 4, 2)
    out = []
    while chunks and chunks.room(out):
        out.append(chunks.take())
    assert [len(u[1]) for u in out] == [4] * 6        # 3 tasks a worker, what each runs at once
    small = Chunks(todo[:10], 4, 2)
    out = []
    while small and small.room(out):
        out.append(small.take())
    # Small tasks at the end: more of them go out, so 3 x 8 inputs could be waiting.
    assert len(out) == 8 and sum(len(u[1]) for u in out) == 10
    assert [x for u in out for x in u[1]] == todo[:10]
