"""Prompt tokens an endpoint served from its prompt cache: stored per call, priced at the
model's cached-input rate, shown in flow.cost(), the cost report and the panel's meter."""

import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.llm import LLM, endpoints
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.view.display import cost_report

CHAIN = {"nodes": [{"id": "a", "requirement": "say a"}, {"id": "b", "requirement": "say b"}],
         "edges": [["a", "b"]]}
# gpt-4o-mini: 0.15 in, 0.075 cached in, 0.60 out (USD per million tokens)
PROMPT, CACHED, OUT = 2000, 1536, 100
ONE_CALL = ((PROMPT - CACHED) * 0.15 + CACHED * 0.075 + OUT * 0.60) / 1e6


def _reporting(usage: dict, **top):
    return lambda body: {"content": "fine", "usage": {"prompt_tokens": PROMPT,
                                                      "completion_tokens": OUT, **usage}, **top}


def _flow(server, **kwargs) -> Flow:
    flowmagic.configure(base_url=server.base_url, model="gpt-4o-mini")
    return Flow.from_dict(CHAIN, task="t", consolidate=False, llm=LLM(backoff_base=0.01),
                          **kwargs)


@pytest.mark.parametrize("stream", [False, True])
def test_cached_prompt_tokens_are_stored_priced_and_shown(stream):
    openai_usage = {"prompt_tokens_details": {"cached_tokens": CACHED}}
    with LoopbackServer(responder=_reporting(openai_usage)) as server:
        flow = _flow(server)
        if stream:   # the panel's way: every node's text streamed, usage in the last chunk
            from flowmagic.jupyter.widgets import Panel
            panel = Panel(flow)
            panel.run_button.click()
            meter = panel.meter.value
            panel.close()
        else:
            flow.run()
    total = flow.cost()["total"]
    assert flow.status == "done" and total["calls"] == 2
    assert total["input_tokens"] == 2 * PROMPT and total["cached_tokens"] == 2 * CACHED
    assert total["cost_usd"] == pytest.approx(2 * ONE_CALL)   # not 2 * 0.00036 at full rate
    report = cost_report(flow).text
    assert "of them prompt-cached" in report
    assert report.splitlines()[-1].split()[:5] == ["total", "2", "0", "4000", "3072"]
    if stream:
        assert "3,072 from the prompt cache" in meter


def test_deepseeks_cached_field_counts():
    with LoopbackServer(responder=_reporting({"prompt_cache_hit_tokens": CACHED})) as server:
        flowmagic.configure(base_url=server.base_url, model="gpt-4o-mini")
        reply = LLM().complete_sync("hello", cache=False)
    assert reply.cached_tokens == CACHED and reply.cost_usd == pytest.approx(ONE_CALL)


def test_llama_cpp_servers_timings_count():
    """llama.cpp's own server puts the reused prefix (`cache_n`) in `timings`, beside the
    usage, in a body and in a stream's last chunk."""
    from flowmagic.llm.wire import read_completion as _completion
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": PROMPT, "completion_tokens": OUT},
            "timings": {"cache_n": CACHED, "prompt_n": PROMPT - CACHED}}
    assert _completion(body)[2:] == (PROMPT, OUT, [], CACHED)


@pytest.mark.parametrize("cached", [PROMPT + 1, -1, "1536", 1536.0, True, None])
def test_a_cached_count_that_cannot_be_true_is_paid_in_full(cached):
    usage = {"prompt_tokens_details": {"cached_tokens": cached}}
    with LoopbackServer(responder=_reporting(usage)) as server:
        flowmagic.configure(base_url=server.base_url, model="gpt-4o-mini")
        reply = LLM().complete_sync("hello", cache=False)
    assert reply.cached_tokens == 0
    assert reply.cost_usd == pytest.approx((PROMPT * 0.15 + OUT * 0.60) / 1e6)


def test_prices_with_and_without_a_cached_rate():
    from flowmagic.llm.usage import call_cost as _cost
    endpoint = endpoints.Endpoint("default", "https://api.openai.com/v1", "x")
    # a model the table gives no cached rate pays its input price for cached tokens
    assert _cost(endpoint, "gpt-3.5-turbo", 1000, 0, 1000) == pytest.approx(1000 * 0.5 / 1e6)
    flowmagic.configure(prices={"mine": (1.0, 2.0, 0.25)})
    assert _cost(endpoint, "mine-v2", 1000, 0, 800) == pytest.approx((200 * 1.0 + 800 * 0.25) / 1e6)
    flowmagic.configure(prices={"mine": (1.0, 2.0)})   # a new price without one: none kept
    assert _cost(endpoint, "mine-v2", 1000, 0, 800) == pytest.approx(1000 * 1.0 / 1e6)
    with pytest.raises(flowmagic.errors.ConfigError, match="cached input"):
        flowmagic.configure(prices={"bad": (1.0, 2.0, -1.0)})


@pytest.mark.embedded
def test_the_embedded_server_reports_the_prefix_it_reused_across_interleaved_calls(embedded_url):
    """Two prompts sharing a long start, another between them: the embedded server's prompt
    cache gives the third call the shared start evaluated, and it says how much it reused."""
    shared = "Columns of sales.csv: region, month, units, price. " * 30
    llm = LLM(timeout=300)
    asks = [[{"role": "system", "content": shared}, {"role": "user", "content": "Name column 1."}],
            [{"role": "system", "content": "Plan a picnic. " * 40}, {"role": "user", "content": "Go."}],
            [{"role": "system", "content": shared}, {"role": "user", "content": "Name column 2."}]]
    replies = [llm.complete_sync(m, max_tokens=4, cache=False, on_text=lambda _t: None)
               for m in asks]
    first, _, third = replies
    assert first.input_tokens == third.input_tokens > 300   # counted, not sized
    assert first.cached_tokens < 10 and third.cached_tokens >= third.input_tokens - 10
