"""What a flow's readings say, from its parts: node counts, the cost table, the timeline's
rows, the numbers of the result traced to code, a run's rough estimate. `Flow`'s reading
methods (`counts`, `cost_data`, `timeline_rows`, `trace_numbers`, `estimate`) call these."""

from __future__ import annotations

from typing import Any

from ..engine import numbers
from ..engine.calls import node_calls
from ..llm.endpoints import price_of, resolve
from ..model.graph import Workflow
from ..model.status import Status

__all__ = ["counts", "total", "cost_data", "trace_numbers", "timeline_rows", "estimate"]


def counts(workflow: Workflow) -> dict:
    """How many nodes are in each state."""
    out: dict[str, int] = {}
    for node in workflow.nodes.values():
        out[node.status] = out.get(node.status, 0) + 1
    return out


def total(workflow: Workflow) -> int:
    """The nodes that count (every one not pruned)."""
    return sum(1 for n in workflow.nodes.values() if n.status != Status.PRUNED)


def cost_data(store: Any, run_id: str) -> dict:
    """Tokens and USD of a run so far, by node and in total (planning and checks too).
    `cached` counts calls answered by flowmagic's response cache; `cached_tokens` the
    input tokens the endpoint served from its own prompt cache (priced at its cached rate)."""
    rows = store.usage(run_id)
    total_row = {"calls": 0, "cached": 0, "input_tokens": 0, "cached_tokens": 0,
                 "output_tokens": 0, "cost_usd": 0.0,
                 "unpriced": 0}   # calls whose model has no known price: their USD is unknown
    for row in rows:
        for key in total_row:
            total_row[key] += row[key] or 0
    return {"total": total_row, "rows": rows}


def trace_numbers(workflow: Workflow, result: str | None, node_id: str | None = None):
    """Each number the result states (or, given a node, its answer's text) with the node and
    printed output line it came from, or None where it traces nowhere (see Flow.trace_numbers)."""
    if node_id is None:
        return numbers.trace_rows(numbers.result_trace(workflow, result or ""))
    node = workflow.node(node_id)
    answer = next((a.get("output") for a in reversed(node.attempts) if a.get("output")), "")
    stated = numbers.stated_numbers(numbers.strip_claims(answer or ""),
                                    (workflow.task or "", node.requirement))
    return numbers.trace_rows(numbers.trace(stated, numbers.output_lines(workflow, node_id)))


def timeline_rows(workflow: Workflow, update_log: list[dict]) -> list[dict]:
    """One row per node that ran: start, end, duration, tokens, cost, attempts, and the
    model calls made for it with why each was made (flowmagic.engine.calls)."""
    rows = []
    for node in workflow.nodes.values():
        if node.start is None:
            continue
        calls = node_calls(node, update_log)
        rows.append({"node": node.id, "agent": node.agent, "clone": node.clone,
                     "status": node.status, "start": node.start, "end": node.end,
                     "duration_s": node.duration, "tokens_in": node.tokens_in,
                     "tokens_out": node.tokens_out, "cost_usd": node.cost_usd,
                     "attempts": len(node.attempts), "calls": len(calls),
                     "calls_why": [c["why"] for c in calls],
                     "model": node.ran_on() or node.model})
    return sorted(rows, key=lambda r: r["start"])


def estimate(workflow: Workflow, settings: Any) -> dict:
    """A rough estimate of a full run: calls, tokens and USD (4 characters a token)."""
    wf = workflow
    pending = [n for n in wf.nodes.values() if n.status not in (Status.DONE, Status.PRUNED)]
    out_tokens = int(settings.max_tokens or 512) // 2
    tokens_in = tokens_out = 0
    cost = 0.0
    for node in pending:
        parents = len(wf.graph.pred[node.id]) if node.id in wf.graph else 0
        t_in = (len(wf.task) + len(node.requirement) + 300) // 4 + parents * out_tokens
        tokens_in += t_in
        tokens_out += out_tokens
        endpoint, model = resolve(node.model or settings.model)
        price = price_of(model, local=endpoint.local) or (0.0, 0.0)
        cost += (t_in * price[0] + out_tokens * price[1]) / 1e6
    calls = len(pending) * (2 if settings.validate_ == "llm" else 1) + 1
    return {"calls": calls, "input_tokens": tokens_in, "output_tokens": tokens_out,
            "cost_usd": round(cost, 6)}
