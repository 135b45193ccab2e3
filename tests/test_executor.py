"""Running a Flow against a loopback server with chosen latencies and faults."""

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

import flowmagic
from flowmagic.model import metrics
from flowmagic.errors import NodeError
from flowmagic.flow import Flow, load
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer

from conftest import ROOT

DIAMOND = {"nodes": [{"id": "a", "requirement": "load the data"},
                     {"id": "b", "requirement": "summarise column x"},
                     {"id": "c", "requirement": "plot y against z"},
                     {"id": "d", "requirement": "write the report"}],
           "edges": [["a", "b"], ["a", "c"], ["b", "d"], ["c", "d"]]}


def wide(n=8):
    nodes = [{"id": "start", "requirement": "prepare"}]
    nodes += [{"id": f"w{i}", "requirement": f"work on part {i}"} for i in range(n)]
    nodes += [{"id": "join", "requirement": "combine the parts"}]
    edges = [["start", f"w{i}"] for i in range(n)] + [[f"w{i}", "join"] for i in range(n)]
    return {"nodes": nodes, "edges": edges}


def chain(n):
    return {"nodes": [{"id": f"s{i}", "requirement": f"step {i}"} for i in range(n)],
            "edges": [[f"s{i}", f"s{i + 1}"] for i in range(n - 1)]}


def node_of(request) -> str | None:
    for message in request["body"].get("messages", []):
        found = re.search(r"Your subtask \((\w+)\)", str(message.get("content")))
        if found:
            return found.group(1)
    return None


def node_calls(server) -> list[str]:
    return [n for n in (node_of(r) for r in server.requests) if n]


def make_flow(plan, server, **settings):
    flowmagic.configure(base_url=server.base_url, model="m")
    settings.setdefault("consolidate", False)
    return Flow.from_dict(plan, task="analyse sales.csv", llm=LLM(backoff_base=0.01), **settings)


def makespan(flow):
    rows = flow.timeline_rows()
    return max(r["end"] for r in rows) - min(r["start"] for r in rows)


@pytest.mark.parametrize("plan", [DIAMOND, wide(8)], ids=["diamond", "wide"])
def test_makespan_close_to_critical_path(plan):
    with LoopbackServer(latency=(0.1, 0.5), seed=3) as server:
        flow = make_flow(plan, server, concurrency=None).run()
        assert flow.status == "done"
        _, bound = metrics.critical_path(flow.workflow, weight="duration")
        assert makespan(flow) <= 1.2 * bound, (makespan(flow), bound)


def test_child_starts_when_its_last_parent_finishes():
    # b is slow and c fast: d must not wait for anything but its own parents, and the
    # fast branch's child must start while the slow sibling still runs.
    plan = {"nodes": [{"id": "a", "requirement": "a"}, {"id": "slow", "requirement": "slow"},
                      {"id": "fast", "requirement": "fast"}, {"id": "after_fast", "requirement": "x"}],
            "edges": [["a", "slow"], ["a", "fast"], ["fast", "after_fast"]]}

    def latency(body):
        return {"slow": 0.8, "fast": 0.1}.get(node_of({"body": body}), 0.1)

    with LoopbackServer(latency=latency) as server:
        flow = make_flow(plan, server).run()
        nodes = flow.workflow.nodes
        assert nodes["after_fast"].start - nodes["fast"].end < 0.1
        assert nodes["after_fast"].end < nodes["slow"].end


def test_never_more_in_flight_than_the_limit():
    plan = {"nodes": [{"id": f"n{i}", "requirement": f"part {i}"} for i in range(12)], "edges": []}
    with LoopbackServer(latency=(0.15, 0.15)) as server:
        flow = make_flow(plan, server, concurrency=3).run()
        assert flow.status == "done" and server.max_in_flight == 3
        clones = [n.clone for n in flow.workflow.nodes.values() if n.clone]
        assert "assistant#2" in clones and "assistant#3" in clones


def test_stop_then_run_reexecutes_nothing_finished():
    with LoopbackServer(latency=(0.2, 0.2)) as server:
        flow = make_flow(chain(6), server)

        async def scenario():
            finished = []
            flow.subscribe(lambda e: finished.append(e["node"]) if e["kind"] == "finished" else None)
            task = asyncio.ensure_future(flow.arun())
            while len(finished) < 2:
                await asyncio.sleep(0.02)
            flow.stop()
            state = await task
            await flow.llm.aclose()
            return state

        assert asyncio.run(scenario()) == "stopped"
        statuses = [n.status for n in flow.workflow.nodes.values()]
        assert statuses[:2] == ["done", "done"] and "running" not in statuses
        first = node_calls(server)
        flow.run()
        assert flow.status == "done"
        second = node_calls(server)[len(first):]
        assert not {"s0", "s1"} & set(second)
        assert sorted(set(first) | set(second)) == [f"s{i}" for i in range(6)]


def test_a_new_process_resumes_from_the_store(flowmagic_home):
    with LoopbackServer(latency=(0.2, 0.2)) as server:
        flow = make_flow(chain(5), server, name="resumable")

        async def partial():
            done = []
            flow.subscribe(lambda e: done.append(1) if e["kind"] == "finished" else None)
            task = asyncio.ensure_future(flow.arun())
            while len(done) < 2:
                await asyncio.sleep(0.02)
            flow.stop()
            await task
            await flow.llm.aclose()

        asyncio.run(partial())
        before = node_calls(server)
        script = ("import flowmagic; f = flowmagic.load('resumable'); f.run(); "
                  "print(f.status, sum(n.status == 'done' for n in f.workflow.nodes.values()))")
        env = {**os.environ, "FLOWMAGIC_HOME": str(flowmagic_home),
               "FLOWMAGIC_BASE_URL": server.base_url, "FLOWMAGIC_MODEL": "m"}
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["done", "5"]
        after = node_calls(server)[len(before):]
        assert not {"s0", "s1"} & set(after), after


def test_cancelling_the_run_leaves_a_consistent_state():
    with LoopbackServer(latency=(0.3, 0.3)) as server:
        flow = make_flow(wide(4), server)

        async def interrupted():
            started = []
            flow.subscribe(lambda e: started.append(e["node"]) if e["kind"] == "started" else None)
            task = asyncio.ensure_future(flow.arun())
            while len(started) < 5:    # start done, the four workers in flight
                await asyncio.sleep(0.01)
            task.cancel()              # what KeyboardInterrupt does to asyncio.run's task
            with pytest.raises(asyncio.CancelledError):
                await task
            await flow.llm.aclose()

        asyncio.run(interrupted())
        statuses = {n.id: n.status for n in flow.workflow.nodes.values()}
        assert statuses["start"] == "done" and "running" not in statuses.values()
        stored = load(flow.run_id)
        assert {n.id: n.status for n in stored.workflow.nodes.values()} == statuses


def test_step_runs_only_the_ready_nodes():
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server).step()
        assert [n.status for n in flow.workflow.nodes.values()] == ["done", "pending", "pending", "pending"]
        flow.step()
        assert [n.status for n in flow.workflow.nodes.values()] == ["done", "done", "done", "pending"]
        with pytest.raises(NodeError, match="waits for"):
            make_flow(DIAMOND, server).run_node("d")


def test_fail_rate_fails_nodes_and_independent_branches_go_on():
    with LoopbackServer() as server:
        flow = make_flow(wide(6), server, fail_rate=0.5, seed=4, max_attempts=1).run()
        nodes = flow.workflow.nodes
        failed = [i for i, n in nodes.items() if n.status == "failed"]
        assert failed and all("injected failure" in nodes[i].error for i in failed)
        if nodes["start"].status == "done":
            assert any(nodes[f"w{i}"].status == "done" for i in range(6))
        assert flow.status == "incomplete"


def test_dead_endpoint_fails_the_node_with_one_line():
    with LoopbackServer(faults={"500": 1.0}) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(chain(2), task="t", consolidate=False,
                              llm=LLM(max_retries=1, backoff_base=0.01))
        flow.run()
        first = flow.workflow.nodes["s0"]
        assert first.status == "failed" and "failed 2 times" in first.error
        assert flow.workflow.nodes["s1"].status == "pending"


def test_budget_stops_new_nodes_and_keeps_finished_ones():
    with LoopbackServer(latency=(0.05, 0.05)) as server:
        flowmagic.configure(base_url=server.base_url, model="gpt-4o")
        flowmagic.configure(prices={"gpt-4o": (100000.0, 100000.0)})  # every call costs dollars
        flow = Flow.from_dict(chain(4), task="t", consolidate=False, budget_usd=0.5,
                              llm=LLM(backoff_base=0.01)).run()
        assert flow.status == "budget"
        assert "budget" in flow.message and "\n" not in flow.message
        done = [n.id for n in flow.workflow.nodes.values() if n.status == "done"]
        assert done == ["s0"] and flow.spent_usd >= 0.5


def test_a_budget_on_an_unpriced_model_says_once_that_it_cannot_count_it(capsys):
    with LoopbackServer() as server:
        flowmagic.configure(base_url=server.base_url, model="my-local-model")
        flow = Flow.from_dict(chain(3), task="t", consolidate=False, budget_usd=0.5,
                              llm=LLM(backoff_base=0.01)).run()
        Flow.from_dict(chain(2), task="t", consolidate=False, llm=LLM(backoff_base=0.01)).run()
    assert flow.status == "done"   # unknown, not stopped: nothing was counted against it
    err = capsys.readouterr().err
    assert err.count("budget_usd cannot count the calls to") == 1, err
    assert "my-local-model" in err and "prices=" in err


def test_result_is_consolidated_and_costs_add_up():
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server, consolidate=True).run()
        assert flow.result and flow.status == "done"
        cost = flow.cost()
        purposes = {row["purpose"] for row in cost["rows"]}
        assert purposes == {"node", "consolidate"} and cost["total"]["calls"] == 5
        assert flow.estimate()["calls"] == 1   # nothing left to run but the consolidation


def test_prompt_carries_role_parents_and_children():
    with LoopbackServer() as server:
        plan = {"nodes": [{"id": "load", "requirement": "load sales.csv", "agent": "engineer"},
                          {"id": "stats", "requirement": "compute monthly totals", "agent": "analyst"},
                          {"id": "report", "requirement": "write the report", "agent": "writer"}],
                "edges": [["load", "stats"], ["stats", "report"]]}
        flow = make_flow(plan, server).run()
        body = next(r["body"] for r in server.requests if node_of(r) == "stats")
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        assert "Your role: the analyst." in user and "analyst" not in system
        assert "compute monthly totals" in user                  # its own requirement
        assert flow.workflow.nodes["load"].output in user        # the parent's output
        assert "write the report" in user                        # what comes after
        assert "analyse sales.csv" in user                       # the overall task


def test_node_prompts_share_their_start_and_end_with_what_is_their_own():
    """Every node's prompt starts with the same text (the house rules, the task, how code
    runs and what the inputs are) and only then says its role, subtask and parents' results:
    an endpoint's prompt cache reuses that start across nodes."""
    with LoopbackServer() as server:
        plan = {"nodes": [{"id": "load", "requirement": "load sales.csv", "agent": "engineer"},
                          {"id": "stats", "requirement": "compute monthly totals", "agent": "analyst"},
                          {"id": "plot", "requirement": "plot the totals", "agent": "designer"}],
                "edges": [["load", "stats"], ["load", "plot"]]}
        flow = make_flow(plan, server).run()
        bodies = {node_of(r): r["body"]["messages"] for r in server.requests if node_of(r)}
    assert flow.status == "done" and set(bodies) >= {"load", "stats", "plot"}
    assert len({m[0]["content"] for m in bodies.values()}) == 1   # one system message
    users = [bodies[n][1]["content"] for n in ("load", "stats", "plot")]
    shared = os.path.commonprefix(users)
    assert shared.startswith("Overall task:") and shared.endswith("Your role: the ")
    for node, user in zip(("load", "stats", "plot"), users):
        own = user[len(shared):]
        assert own.index(f"Your subtask ({node})") < own.index("Write the result of your subtask now.")


def purposes(flow) -> list[str]:
    return [row["purpose"] for row in flow.cost()["rows"] for _ in range(row["calls"])]


def test_a_validator_that_always_fails_stops_after_max_attempts():
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server, max_attempts=3, update="off",
                         validate=lambda node, output: (node.id != "b", "needs a chart"))
        flow.run()
        b = flow.workflow.nodes["b"]
        assert b.status == "failed" and len(b.attempts) == 3
        assert all(a["feedback"] == "needs a chart" for a in b.attempts)
        assert "needs a chart" in b.error
        assert node_calls(server).count("b") == 3
        # the second and third prompts carried the earlier attempt and its feedback
        retries = [r for r in server.requests if node_of(r) == "b"][1:]
        assert all("needs a chart" in r["body"]["messages"][-1]["content"] for r in retries)
        assert flow.workflow.nodes["d"].status == "pending" and flow.status == "incomplete"


def test_on_failure_makes_no_update_call_when_every_node_passes():
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server, update="on-failure").run()
        assert flow.status == "done" and "update" not in purposes(flow)
        assert flow.update_log == []


def rerun_masked(body):
    """The updater's answer: rerun every node whose result reads 'none'."""
    user = body["messages"][-1]["content"]
    if "Results of done subtasks" not in user:
        return f"result for {node_of({'body': body})}"
    masked = re.findall(r"\[(\w+)\]\nnone\b", user)
    return json.dumps({"action": "update" if masked else "no_change",
                       "subtasks": [{"id": m, "rerun": True} for m in masked]})


def test_masked_outputs_are_recovered_by_the_updater():
    with LoopbackServer(responder=rerun_masked) as server:
        flow = make_flow(chain(3), server, mask_rate=1.0, update="on-failure", max_updates=10)
        flow.run()
        assert "update" in purposes(flow) and flow.update_log
        assert any(entry["diff"]["rerun"] for entry in flow.update_log)
        nodes = flow.workflow.nodes
        assert flow.status == "done"
        assert all(n.output.startswith("result for") for n in nodes.values()), \
            {i: n.output for i, n in nodes.items()}
        # every node ran twice: once masked, once re-run on the updater's request
        assert all(node_calls(server).count(i) == 2 for i in nodes)


def test_after_completion_updates_between_nodes_and_keeps_finished_work():
    def add_node(body):
        user = body["messages"][-1]["content"]
        if "Results of done subtasks" not in user:
            return f"result for {node_of({'body': body})}"
        if "extra" in user:
            return json.dumps({"action": "no_change"})
        # leaves every existing node out: they must not be lost
        return json.dumps({"action": "update", "subtasks": [
            {"id": "extra", "requirement": "double-check the totals", "depends_on": ["s0"]}]})

    with LoopbackServer(responder=add_node) as server:
        flow = make_flow(chain(2), server, update="after-completion").run()
        nodes = flow.workflow.nodes
        assert set(nodes) == {"s0", "s1", "extra"} and flow.status == "done"
        assert nodes["s0"].output == "result for s0" and node_calls(server).count("s0") == 1
        assert flow.update_log[0]["diff"]["added"] == ["extra"]
        assert flow.update_log[0]["stats"]["initial_tasks"] == 2


def test_a_failed_node_is_repaired_by_refining_its_instruction_before_replanning():
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server, max_attempts=1, update="on-failure",
                         validate=lambda node, output: (node.requirement != "summarise column x",
                                                        "say which statistics to compute"))
        flow.run()
        b = flow.workflow.nodes["b"]
        assert flow.status == "done" and b.status == "done"
        assert b.requirement != "summarise column x"
        assert [entry["kind"] for entry in flow.update_log] == ["refine_instruction"]
        assert flow.update_log[0]["trigger"] == ["b"] and flow.update_log[0]["diff"]["rerun"] == ["b"]
        assert node_calls(server).count("a") == 1     # nothing finished ran again


def test_a_rerun_asked_for_during_consolidation_joins_the_run():
    with LoopbackServer(latency=(0.3, 0.3)) as server:
        flow = make_flow(DIAMOND, server, consolidate=True)

        async def scenario():
            def on_event(event):
                if event["kind"] == "finished" and event["node"] == "d" and not rerun_done:
                    rerun_done.append(1)
                    asyncio.get_running_loop().call_later(0.1, flow.rerun, "c")
            rerun_done = []
            flow.subscribe(on_event)
            state = await flow.arun()
            await flow.llm.aclose()
            return state

        assert asyncio.run(scenario()) == "done"
        assert all(n.status == "done" for n in flow.workflow.nodes.values())
        assert node_calls(server).count("c") == 2 and node_calls(server).count("d") == 2
        assert flow.result


def test_an_error_in_a_background_run_is_reported_not_lost(capsys):
    with LoopbackServer() as server:
        flow = make_flow(DIAMOND, server, validate=lambda node, output: 1 / 0)

        async def scenario():
            flow.run()                # in a running loop: a background task
            with pytest.raises(flowmagic.ConfigError):
                await flow.wait()
            await flow.llm.aclose()

        asyncio.run(scenario())
        assert flow.status == "error" and "ZeroDivisionError" in flow.message
        assert "\n" not in flow.message
        assert f"flowmagic: {flow.message}" in capsys.readouterr().err
        assert "running" not in {n.status for n in flow.workflow.nodes.values()}


def test_concurrency_none_means_no_limit():
    plan = {"nodes": [{"id": f"n{i}", "requirement": f"part {i}"} for i in range(12)], "edges": []}
    with LoopbackServer(latency=(0.3, 0.3)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, task="t", consolidate=False, concurrency=None,
                              llm=LLM(concurrency=100)).run()
        assert flow.settings["concurrency"] is None
        assert flow.status == "done" and server.max_in_flight == 12


def test_a_flow_runs_other_work_through_its_executor_and_keeps_every_state(tmp_path):
    """`Flow.executor(work)`: the flow's own hooks with other work in place of the model
    (what bench/overhead.py measures); every finished node is in the store."""
    from flowmagic.engine.scheduler import Outcome
    from flowmagic.store import Store

    store = Store(tmp_path / "flowmagic.db")
    flow = Flow.from_dict(DIAMOND, task="t", consolidate=False, llm=LLM(store), store=store)
    told = []
    flow.subscribe(lambda e: told.append((e["kind"], e["node"])))

    async def work(node_id):
        return Outcome(ok=True, output=f"did {node_id}")

    assert asyncio.run(flow.executor(work).run()) == "done"
    stored = load(flow.run_id, store=store)
    assert {i: n.output for i, n in stored.workflow.nodes.items()} == {i: f"did {i}" for i in "abcd"}
    assert [n for kind, n in told if kind == "finished"] == ["a", "b", "c", "d"]
    store.close()


@pytest.mark.parametrize("own_store", [False, True], ids=["the door's store", "another store"])
def test_a_finished_node_names_its_logged_call_before_anyone_hears_of_it(tmp_path, own_store):
    """A node's answer and its call's log row are one commit (the LLM door hands the row to
    the flow when both write to one store; else the door commits it itself): when a
    subscriber hears "finished", another reader of the file already finds the call row the
    node's attempt names, and the stored run names the same rows."""
    import contextlib
    import sqlite3
    from flowmagic.store import Store

    calls_db = tmp_path / "calls.db"
    llm_store = Store(calls_db)
    store = Store(tmp_path / "flow.db") if own_store else llm_store
    heard = {}

    def check(event):
        if event["kind"] == "finished":
            call_id = flow.workflow.nodes[event["node"]].attempts[-1]["call_id"]
            with contextlib.closing(sqlite3.connect(calls_db)) as db:
                heard[event["node"]] = db.execute(
                    "SELECT node_id FROM calls WHERE id = ?", (call_id,)).fetchone()

    with LoopbackServer(latency=(0.01, 0.05), model="m") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(wide(6), task="t", consolidate=False, llm=LLM(llm_store),
                              store=store)
        flow.subscribe(check)
        flow.run()
    assert flow.status == "done"
    assert heard == {i: (i,) for i in flow.workflow.nodes}   # each its own row, already there
    stored = load(flow.run_id, store=store).workflow.nodes
    ids = {i: n.attempts[-1]["call_id"] for i, n in stored.items()}
    assert ids == {i: n.attempts[-1]["call_id"] for i, n in flow.workflow.nodes.items()}
    assert len(set(ids.values())) == len(ids) and llm_store.count_calls() == len(ids)
    for each in {store, llm_store}:
        each.close()
