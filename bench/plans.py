"""Plan quality per model x planning method, against gold graphs (issue 21). Not a test.

    .venv/bin/python bench/plans.py                       # embedded SmolLM2, both methods
    .venv/bin/python bench/plans.py --per-set 4 --k 3 --methods stepwise,oneshot
    .venv/bin/python bench/plans.py --base-url http://127.0.0.1:11434/v1 --model qwen2.5:1.5b
    .venv/bin/python bench/plans.py --report bench/plans-results.jsonl   # table only

Tasks: the first N records (in file order, which mixes shapes) of each shared gold set in
../shared/datasets (read in place, never copied) and the ten data-science tasks of
bench/ds_tasks.jsonl. For each task and method, K candidates are planned and `select`
chooses one; the chosen plan is scored: >= 3 subtasks, >= 1 dependency, connected, one
final subtask, every subtask on topic (plan_checks.on_topic), 3-8 subtasks; node / edge
F1 and SSI against gold (TF-IDF labels); seconds per plan (all K candidates); and the share
of candidates that copied the prompt's example. "baseline" is the model-free plan: the
task itself as one node. One JSON line per (task, method) goes to --out as it is done,
so an interrupted run still has its rows; the Markdown table is printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent.parent / "shared" / "datasets"
SETS = {"asynchow": "asynchow.jsonl", "worfbench": "worfbench.jsonl",
        "cariad": "cariad_asynchow99.jsonl"}


def _shared_dir() -> Path:
    for base in (Path(os.environ.get("FLOWMAGIC_DATASETS", "")), SHARED,
                 HERE.parent / ".." / "shared" / "datasets", Path("/work/shared/datasets")):
        if base and (base / "asynchow.jsonl").is_file():
            return base
    raise SystemExit("the shared gold sets were not found; set FLOWMAGIC_DATASETS to their folder")


def load_tasks(sets: list[str], per_set: int, offset: int = 0) -> list[tuple[str, dict]]:
    from flowmagic.evaluate import load_gold

    out = []
    for name in sets:
        path = HERE / "ds_tasks.jsonl" if name == "ds" else _shared_dir() / SETS[name]
        out += [(name, r) for r in load_gold(path)[offset:offset + per_set]]
    return out


def _row(set_name: str, record: dict, method: str, cands, chosen, seconds: float) -> dict:
    from flowmagic.model import metrics
    from flowmagic.evaluate import compare
    from flowmagic.model.plan_checks import on_topic

    row = {"set": set_name, "id": record["id"], "method": method, "seconds": seconds,
           "candidates": len(cands), "copies": sum(bool(c.error and c.error.startswith(
               "OffTopicError")) for c in cands),
           "failed": sum(not c.ok for c in cands), "usable": chosen is not None}
    if chosen is None:
        return row
    wf = cands[chosen].workflow
    reqs = [n.requirement for n in wf.nodes.values()]
    n, e = len(wf.nodes), len(wf.edges())
    scores = compare(wf, record, similarity="tfidf")
    row.update(nodes=n, edges=e, three=n >= 3, dep=e >= 1, size_ok=3 <= n <= 8,
               connected=metrics.is_connected(wf) and n >= 2,
               one_sink=len(metrics.sinks(wf)) == 1,
               on_topic=all(on_topic(reqs, record["task"])),
               node_f1=scores.node_f1, edge_f1=scores.edge_f1, ssi=scores.ssi,
               label_similarity=scores.label_similarity,
               plan=[[i, nd.requirement, wf.parents(i)] for i, nd in wf.nodes.items()])
    return row


async def plan_one(llm, record: dict, method: str, k: int, model: str | None) -> tuple:
    from flowmagic.errors import PlanError
    from flowmagic.model.graph import Node, Workflow
    from flowmagic.engine.planner import Candidate, plan_candidates, select

    started = time.perf_counter()
    if method == "baseline":
        wf = Workflow(record["task"])
        wf.add_node(Node("task", record["task"]))
        cands = [Candidate(0, 0, workflow=wf)]
        return cands, 0, time.perf_counter() - started
    cands = await plan_candidates(record["task"], k=k, llm=llm, model=model, method=method,
                                  time_limit_s=600)
    try:
        chosen = select(cands, record["task"])
    except PlanError:
        chosen = None
    return cands, chosen, time.perf_counter() - started


_PERF = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*?\s eval time =\s*"
                   r"([\d.]+) ms /\s*(\d+) runs.*?total time =\s*([\d.]+) ms", re.S)


def server_split(text: str) -> dict:
    """Where the embedded server's time went, from llama.cpp's per-call timings in its log:
    prompt tokens evaluated (after the reused prefix) and their seconds, tokens generated
    and their decoding seconds, and the rest of each call (sampling, which includes a
    grammar's, and prompt time llama-cpp-python leaves out of "prompt eval")."""
    calls = _PERF.findall(text)
    pm, pt, em, et, tm = (sum(float(c[i]) for c in calls) for i in range(5))
    return {"calls": len(calls), "prompt_tokens": int(pt), "prompt_s": pm / 1000,
            "gen_tokens": int(et), "decode_s": em / 1000, "rest_s": (tm - pm - em) / 1000}


def _log_size() -> int:
    log = Path(os.environ["FLOWMAGIC_HOME"]) / "local-server.log"
    return log.stat().st_size if log.is_file() else 0


def _log_since(offset: int) -> str:
    log = Path(os.environ["FLOWMAGIC_HOME"]) / "local-server.log"
    if not log.is_file():
        return ""
    with log.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def _pct(rows, key) -> str:
    return f"{100 * sum(bool(r.get(key)) for r in rows) / len(rows):.0f}%" if rows else "-"


def _mean(rows, key) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return f"{sum(vals) / len(vals):.3f}" if vals else "-"


def table(rows: list[dict]) -> str:
    head = ("| model | method | set | plans | usable | >=3 subtasks | >=1 dep | connected | "
            "one sink | on topic | 3-8 | copied cands | node F1 | edge F1 | SSI | s/plan |")
    lines = [head, "|" + " --- |" * 16]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.get("model", "?"), r["method"], r["set"]), []).append(r)
        groups.setdefault((r.get("model", "?"), r["method"], "all"), []).append(r)
    for (model, method, set_name), rs in sorted(groups.items()):
        cands = sum(r["candidates"] for r in rs)
        lines.append(
            f"| {model} | {method} | {set_name} | {len(rs)} | {_pct(rs, 'usable')} | "
            f"{_pct(rs, 'three')} | {_pct(rs, 'dep')} | {_pct(rs, 'connected')} | "
            f"{_pct(rs, 'one_sink')} | {_pct(rs, 'on_topic')} | {_pct(rs, 'size_ok')} | "
            f"{sum(r['copies'] for r in rs)}/{cands} | {_mean(rs, 'node_f1')} | "
            f"{_mean(rs, 'edge_f1')} | {_mean(rs, 'ssi')} | "
            f"{sum(r['seconds'] for r in rs) / len(rs):.1f} |")
    split = [r["server"] for r in rows if r.get("server")]
    if split:
        lines += ["", "| model | method | calls/plan | prompt tokens/plan | prompt s | "
                  "generated tokens/plan | decode s | rest s (sampling, grammar) |",
                  "|" + " --- |" * 8]
        for (model, method, set_name), rs in sorted(groups.items()):
            got = [r["server"] for r in rs if r.get("server")]
            if set_name != "all" or not got:
                continue
            mean = {k: sum(g[k] for g in got) / len(got) for k in got[0]}
            lines.append(f"| {model} | {method} | {mean['calls']:.1f} | {mean['prompt_tokens']:.0f} | "
                         f"{mean['prompt_s']:.1f} | {mean['gen_tokens']:.0f} | "
                         f"{mean['decode_s']:.1f} | {mean['rest_s']:.1f} |")
    return "\n".join(lines)


async def main(args) -> None:
    os.environ["FLOWMAGIC_HOME"] = tempfile.mkdtemp(prefix="flowmagic-bench-plans-")
    import flowmagic
    from flowmagic.llm import LLM

    if args.base_url:
        flowmagic.configure(base_url=args.base_url, model=args.model,
                            api_key=os.environ.get("OPENAI_API_KEY", "none"))
        model, label = None, args.model or args.base_url
    else:
        model, label = "local", f"SmolLM2-135M ({os.environ.get('FLOWMAGIC_LOCAL_THREADS', '1')} thread)"
    llm = LLM(timeout=600)
    if not args.base_url:
        from flowmagic.llm.local import ensure_server
        ensure_server()   # starting the server is not planning time
    tasks = load_tasks(args.sets.split(","), args.per_set, args.offset)
    methods = args.methods.split(",")
    out = Path(args.out)
    print(f"{len(tasks)} tasks x {methods}, k={args.k}, model {label}, load {os.getloadavg()[0]:.1f}",
          flush=True)
    # Interleave the sets so that a run cut short still covers each of them.
    order = sorted(range(len(tasks)), key=lambda i: (sum(1 for j in range(i) if tasks[j][0] == tasks[i][0]), i))
    for i in order:
        set_name, record = tasks[i]
        for method in methods:
            mark = _log_size()
            cands, chosen, seconds = await plan_one(llm, record, method, args.k, model)
            row = _row(set_name, record, method, cands, chosen, seconds)
            if method != "baseline" and not args.base_url:
                row["server"] = server_split(_log_since(mark))
            row.update(model=label if method != "baseline" else "none (task as one node)",
                       k=args.k if method != "baseline" else 1,
                       load=os.getloadavg()[0])
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{set_name:9} {record['id'][:28]:28} {method:8} {seconds:6.1f}s "
                  f"nodes {row.get('nodes', '-')} edges {row.get('edges', '-')} "
                  f"topic {row.get('on_topic', '-')} ssi {row.get('ssi', 0) or 0:.2f} "
                  f"load {row['load']:.1f}", flush=True)


def cli(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="ds,asynchow,worfbench,cariad")
    p.add_argument("--per-set", type=int, default=10)
    p.add_argument("--offset", type=int, default=0,
                   help="skip this many tasks of each set (to alternate two checkouts task by task)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--methods", default="baseline,stepwise,oneshot")
    p.add_argument("--base-url")
    p.add_argument("--model")
    p.add_argument("--out", default=str(HERE / "plans-results.jsonl"))
    p.add_argument("--report", help="print the table of a results file and stop")
    args = p.parse_args(argv)
    if not args.report:
        asyncio.run(main(args))
    rows = [json.loads(x) for x in Path(args.report or args.out).read_text().splitlines() if x.strip()]
    print(table(rows))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    cli()
