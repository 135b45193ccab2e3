"""One question under one system, in a process of its own (started by bench/analysis.py).

`python bench/analysis_worker.py SYSTEM QID --data DIR --base-url URL --model M` with
FLOWMAGIC_HOME set to a folder of its own (so no call is answered from another run's cache);
prints one JSON line: the answer and what the system did. The harness counts calls and
tokens from that folder, so a question killed at its time limit still has them.

Systems: `baseline` (bench/onecall.py), `flow` (flowmagic as a `%%flow` cell with its
defaults, k left out: the question, constraints and format as the task, the CSV as the input) and
`flow-k1` (the same with k=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dabench  # noqa: E402
import untraced  # noqa: E402

__all__ = ["SYSTEMS", "main"]

# name -> the k a flow is given ("default": left out, as `%%flow` leaves it: 3 on a hosted
# API, a server you run's slots when fewer, planner.default_k)
SYSTEMS = {"baseline": None, "flow": "default", "flow-k1": 1}


def task_of(q: dabench.Question) -> str:
    return f"{dabench.prompt(q)}\n\nThe data is the input file {q.file_name}."


def _outputs(flow) -> list[str]:
    """What the flow's code printed: every attempt's executed output, all nodes."""
    out = []
    for node in flow.workflow.nodes.values():
        runs = [a.get("execution") for a in node.attempts] + [node.execution]
        out += [r.get("stdout") or "" for r in runs if isinstance(r, dict) and r.get("ran", True)]
    return out


def _trace(flow, answer: str | None, outputs: list[str]) -> tuple[list, str]:
    """(numbers that trace nowhere, which rule said so)."""
    trace = getattr(flow, "trace_numbers", None)
    if callable(trace):
        rows = trace()
        if hasattr(rows, "to_dict"):    # a DataFrame (number, value, node, line)
            rows = rows.to_dict("records")
        return ([_number_of(r) for r in rows or [] if _source_of(r) is None],
                "flow.trace_numbers()")
    return untraced.untraced(answer, outputs), "bench/untraced.py"


def _number_of(row):
    if isinstance(row, dict):
        return row.get("number", row.get("text", row.get("value")))
    return row[0] if isinstance(row, (list, tuple)) else row


def _source_of(row):
    if isinstance(row, dict):
        source = row.get("source", row.get("node"))
    else:
        source = row[1] if isinstance(row, (list, tuple)) and len(row) > 1 else None
    return None if source is None or source != source else source   # NaN from a DataFrame


def _nodes(flow) -> list[dict]:
    return [{"id": n.id, "status": str(n.status), "attempts": len(n.attempts),
             "error": (n.error or "")[:300]} for n in flow.workflow.nodes.values()]


def run_flow(q: dabench.Question, k: int | None, sandbox: str, call_timeout: float) -> dict:
    """As `flowmagic run` does it: plan (K candidates; None: flowmagic's default), run to the
    end, read the result.

    The LLM waits `call_timeout` for an answer, as the baseline's client does: its default
    120 s for a whole answer is shorter than one plan takes on 2 busy cores (~1,000 prompt
    tokens at ~20/s, then ~200 tokens at ~3/s), and each retry sends the same request again."""
    import flowmagic

    # the same patience as the baseline's client (its one bound is `call_timeout` for the whole
    # answer): at a load of 5-6 on one thread a plan's first token came after more than the
    # 300 s a flow waits by default, and the question failed with no answer at all
    llm = flowmagic.LLM(timeout=call_timeout, first_token_s=call_timeout)
    flow = flowmagic.plan(task_of(q), k=k, inputs=[str(q.table)], sandbox=sandbox, llm=llm)
    flow.run()
    status = flow.status
    answer = flow.result
    outputs = _outputs(flow)
    numbers, rule = _trace(flow, answer, outputs)
    return {"answer": answer, "status": str(status), "error": flow.message or None,
            "k": flow.settings.k,
            "nodes": _nodes(flow), "outputs": outputs, "untraced": numbers,
            "untraced_rule": rule}


def run_baseline(q: dabench.Question, base_url: str, model: str, sandbox: str,
                 call_timeout: float) -> dict:
    from openai import OpenAI

    import onecall

    client = OpenAI(base_url=base_url, api_key=os.environ.get("FLOWMAGIC_API_KEY") or "none",
                    timeout=call_timeout, max_retries=2)
    home = Path(os.environ["FLOWMAGIC_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    out = onecall.solve(q, client, model, home / "calls.jsonl", sandbox=sandbox)
    # the answer is what the script printed: its numbers trace by construction
    out.update(untraced=untraced.untraced(out["answer"], out["outputs"]),
               untraced_rule="bench/untraced.py")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("system", choices=sorted(SYSTEMS))
    ap.add_argument("qid", type=int)
    ap.add_argument("--data", required=True)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sandbox", default="bwrap")
    ap.add_argument("--call-timeout", type=float, default=3600.0,
                    help="seconds a model call may take (both systems)")
    args = ap.parse_args(argv)
    q = next(q for q in dabench.load(Path(args.data)) if q.id == args.qid)
    if SYSTEMS[args.system] is None:
        out = run_baseline(q, args.base_url, args.model, args.sandbox, args.call_timeout)
    else:
        os.environ.update(FLOWMAGIC_BASE_URL=args.base_url, FLOWMAGIC_MODEL=args.model,
                          FLOWMAGIC_DISCOVER="0")
        k = SYSTEMS[args.system]
        out = run_flow(q, None if k == "default" else k, args.sandbox, args.call_timeout)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
