"""Cached prompt tokens in the cost table: a two-node flow against a loopback endpoint that
reports `usage.prompt_tokens_details.cached_tokens`, as OpenAI does, under a model the price
table gives a cached-input rate (gpt-4o-mini). What `flow.cost()` charges is set beside the
price of the same tokens at the cached rate and at the full input rate."""

from __future__ import annotations

__all__ = ["measure", "MODEL"]

MODEL = "gpt-4o-mini"
PROMPT, CACHED, OUT = 2000, 1536, 100
PLAN = {"nodes": [{"id": "a", "requirement": "say a"}, {"id": "b", "requirement": "say b"}],
        "edges": [["a", "b"]]}


def _reply(body: dict) -> dict:
    return {"content": "fine", "usage": {"prompt_tokens": PROMPT, "completion_tokens": OUT,
                                         "prompt_tokens_details": {"cached_tokens": CACHED}}}


def measure() -> dict:
    import flowmagic
    from flowmagic.flow import Flow
    from flowmagic.llm import LLM, endpoints
    from flowmagic.testing.loopback import LoopbackServer

    saved = endpoints.snapshot()
    try:
        with LoopbackServer(responder=_reply, model=MODEL) as server:
            flowmagic.configure(base_url=server.base_url, model=MODEL, self_hosted=False)
            flow = Flow.from_dict(PLAN, task="t", consolidate=False, llm=LLM(backoff_base=0.01))
            flow.run()
    finally:
        endpoints.restore(saved)
    total = flow.cost()["total"]
    price_in, price_out = endpoints.price_of(MODEL)
    price_cached = endpoints.cached_price_of(MODEL)
    calls = total["calls"]
    at_cached = calls * ((PROMPT - CACHED) * price_in + CACHED * price_cached
                         + OUT * price_out) / 1e6
    at_full = calls * (PROMPT * price_in + OUT * price_out) / 1e6
    charged = total["cost_usd"]
    return {"model": MODEL, "status": str(flow.status), "calls": calls,
            "prompt_tokens": total["input_tokens"], "cached_tokens": total["cached_tokens"],
            "reported_cached": calls * CACHED, "completion_tokens": total["output_tokens"],
            "rates": (price_in, price_cached, price_out), "charged": charged,
            "at_cached_rate": at_cached, "at_full_rate": at_full,
            "ok": (calls == 2 and total["cached_tokens"] == calls * CACHED
                   and charged is not None and abs(charged - at_cached) < 1e-12)}
