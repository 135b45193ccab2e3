"""Batch runs over a loopback server: placeholders, order, the concurrency limit, cost, probes."""

import asyncio
import re

import pytest

import flowmagic
from flowmagic.ops import batch
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.testing.loopback import LoopbackServer, default_responder

@pytest.fixture(autouse=True)
def own_prices(monkeypatch):
    """configure(prices=...) edits a process-wide table: give each test its own copy."""
    from flowmagic.llm import endpoints
    monkeypatch.setattr(endpoints, "PRICES", dict(endpoints.PRICES))


PAIR = {"nodes": [{"id": "ask", "requirement": "Look up {{input}}"},
                  {"id": "say", "requirement": "Say what was found"}],
        "edges": [["ask", "say"]]}


def subtask(body) -> str:
    """The text of the node's subtask in a request ("" for other calls)."""
    for message in body.get("messages", []):
        found = re.search(r"Your subtask \((\w+)\):\n(.*)", str(message.get("content")))
        if found:
            return f"{found.group(1)}: {found.group(2)}"
    return ""


def relay(body) -> str:
    """Node `ask` echoes its subtask; `say` repeats what its parent found."""
    text = subtask(body)
    if text.startswith("ask:"):
        return "found " + text.split("Look up ", 1)[-1]
    content = " ".join(str(m.get("content")) for m in body["messages"])
    found = re.search(r"\[ask\] \(\w+\): (found [^\n]*)", content)
    return f"answer: {found.group(1) if found else 'nothing'}" if text else default_responder(body)


def make_flow(server, plan=PAIR, **settings):
    flowmagic.configure(base_url=server.base_url, model="m")
    return Flow.from_dict(plan, task="answer questions", llm=LLM(backoff_base=0.01), **settings)


def test_map_keeps_input_order_and_respects_its_concurrency_limit():
    words = [f"w{i}" for i in range(6)]

    def latency(body):  # later inputs answer faster, so they finish first
        found = re.search(r"w(\d)", subtask(body))
        return 0.05 + 0.05 * (6 - int(found.group(1))) if found else 0.05

    with LoopbackServer(responder=relay, latency=latency) as server:
        flow = make_flow(server)
        run = flow.map(words, concurrency=2)
        assert run.results == [f"answer: found {w}" for w in words]
        assert [item.index for item in run] == list(range(6))
        assert run.max_active == 2
        # Measured from the server's side: at most two inputs ever have a call in flight.
        spans = []
        for req in server.requests:
            found = re.search(r"w(\d)", str(req["body"]))
            if found and req["finished"]:
                spans.append((req["arrived"], req["finished"], found.group(1)))
        peak = max(len({w for a, b, w in spans if a <= t < b}) for t, _, _ in spans)
        assert peak == 2
        # Finishing order differs from input order, so order was restored, not inherited.
        ends = sorted(run, key=lambda item: item.duration_s)
        assert [i.index for i in ends] != list(range(6))


def test_map_substitutes_named_fields_in_task_and_requirements():
    plan = {"nodes": [{"id": "ask", "requirement": "Look up {{city}} in {{ year }}"}], "edges": []}
    with LoopbackServer() as server:
        flow = make_flow(server, plan)
        flow.workflow.task = "facts about {{city}}"
        run = flow.map([{"city": "Oslo", "year": 1990}, {"city": "Lima", "year": 2001}])
        assert [item.state for item in run] == ["done", "done"]
        prompts = [str(r["body"]["messages"]) for r in server.requests]
        assert any("Look up Oslo in 1990" in p and "facts about Oslo" in p for p in prompts)
        assert any("Look up Lima in 2001" in p for p in prompts)
        assert flow.workflow.nodes["ask"].requirement == "Look up {{city}} in {{ year }}"
        with pytest.raises(ConfigError, match="no field 'year'"):
            flow.map([{"city": "Rome"}])


def test_without_placeholders_the_input_is_appended_to_the_task():
    wf = flowmagic.Workflow.from_dict({"nodes": [{"id": "a", "requirement": "do it"}], "edges": []},
                                      task="summarise")
    assert batch.instantiate(wf, "the text").task == "summarise\n\nInput:\nthe text"
    assert "alpha" in batch.instantiate(wf, {"doc": "alpha", "expected": "x"}).task
    assert "expected" not in batch.instantiate(wf, {"doc": "alpha", "expected": "x"}).task


def test_map_cost_is_list_price_by_the_model_of_each_call():
    with LoopbackServer(responder=relay) as server:
        flowmagic.configure(name="big", base_url=server.base_url, model="big-model")
        flowmagic.configure(prices={"big-model": (10.0, 30.0), "m": (1.0, 2.0)})
        flow = make_flow(server)
        flow.workflow.nodes["ask"].model = "big"
        first = flow.map(["x"])[0]
        again = flow.map(["x"])[0]   # answered from the cache: free, but the same list price
        for item in (first, again):
            ask, say = item.nodes["ask"], item.nodes["say"]
            assert ask["models"] == ["big:big-model"] and say["models"] == ["default:m"]
            assert ask["cost_usd"] == pytest.approx((ask["tokens_in"] * 10 + ask["tokens_out"] * 30) / 1e6)
            assert say["cost_usd"] == pytest.approx((say["tokens_in"] * 1 + say["tokens_out"] * 2) / 1e6)
            assert item.cost_usd == pytest.approx(ask["cost_usd"] + say["cost_usd"])
        assert first.paid_usd == pytest.approx(first.cost_usd) and again.paid_usd == 0
        assert again.cost_usd == pytest.approx(first.cost_usd)


def test_several_sinks_are_consolidated_into_one_result():
    plan = {"nodes": [{"id": "a", "requirement": "part {{input}}"},
                      {"id": "b", "requirement": "other part"}], "edges": []}
    with LoopbackServer() as server:
        item = make_flow(server, plan).map(["q"])[0]
        assert item.state == "done" and item.result.startswith("Loopback reply to: Task:")
        joined = make_flow(server, plan, consolidate=False).map(["q"])[0]
        assert joined.result.startswith("[a]\n") and "\n\n[b]\n" in joined.result


def test_a_failed_input_is_reported_and_scores_zero():
    with LoopbackServer(faults={"500": 1.0}) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PAIR, task="t", llm=LLM(max_retries=0, backoff_base=0.01))
        item = flow.map(["x"], scorer=lambda result, example: 1.0)[0]
        assert item.state == "incomplete" and item.result is None and item.score == 0.0
        assert "node 'ask' failed" in item.error


def test_scorers():
    ex = {"input": "q", "expected": "Paris"}
    assert batch.exact_match("  paris ", ex) == 1.0 and batch.exact_match("Paris!", ex) == 0.0
    assert batch.contains("It is PARIS.", ex) == 1.0 and batch.contains("Rome", ex) == 0.0
    with pytest.raises(ConfigError, match="needs an 'expected' field"):
        batch.exact_match("x", "just a string")
    with pytest.raises(ConfigError, match="not callable"):
        batch.get_scorer("fuzzy")
    with pytest.raises(ConfigError, match="must return a number"):
        asyncio.run(batch.score(lambda r, e: "high", "x", ex))


def test_llm_judge_scores_over_http():
    def judge(body):
        return '{"score": 0.75, "reason": "close"}' if "Result to grade" in str(body) else "x"

    with LoopbackServer(responder=judge) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = LLM(backoff_base=0.01)

        async def main():
            try:
                return await batch.LLMJudge(llm=llm)("Paris", {"input": "capital?", "expected": "Paris"})
            finally:
                await llm.aclose()

        assert asyncio.run(main()) == 0.75


def test_probe_set_is_a_seeded_shuffle_not_the_first_rows():
    rows = list(range(50))
    probe = batch.probe_set(rows, "exact", n=10, seed=7)
    assert len(probe) == 10 and probe.examples != rows[:10]
    assert probe.examples == batch.probe_set(rows, "exact", n=10, seed=7).examples
    assert probe.examples != batch.probe_set(rows, "exact", n=10, seed=8).examples
    assert probe.examples == [rows[i] for i in probe.indices]
    with pytest.raises(ConfigError, match="empty"):
        batch.probe_set([], "exact")


def test_map_in_a_running_loop_waits_as_a_notebook_cell_does():
    """Inside a running loop (a notebook cell) map() runs to its end on a loop of its own,
    as %%flow does, and amap() is there to await."""
    with LoopbackServer(responder=relay) as server:
        flow = make_flow(server)

        async def main():
            assert flow.map(["x"], concurrency=1).results == ["answer: found x"]
            try:
                return await flow.amap(["x", "y"], concurrency=1)
            finally:
                await flow.llm.aclose()

        run = asyncio.run(main())
        assert run.results == ["answer: found x", "answer: found y"] and run.max_active == 1


def test_gather_all_cancels_the_siblings_of_a_crash_and_of_a_cancelled_caller():
    """The one helper behind map, slimming, trials, the planner's and the updater's K calls and
    evaluation: a bug in one coroutine is raised as itself once the others were cancelled;
    cancelling the caller cancels every one."""
    from flowmagic._internal.aio import gather_all

    cancelled = []

    async def slow(name):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def crash():
        await asyncio.sleep(0)
        raise KeyError("a bug")

    async def fine(x):
        return x * 2

    async def main():
        assert await gather_all(fine(i) for i in range(3)) == [0, 2, 4]   # in order
        with pytest.raises(KeyError, match="a bug"):
            await gather_all([slow("a"), crash(), slow("b")])
        assert sorted(cancelled) == ["a", "b"]
        caller = asyncio.ensure_future(gather_all([slow("c"), slow("d")]))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert sorted(cancelled) == ["a", "b", "c", "d"]
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
