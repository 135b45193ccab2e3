"""`flowmagic eval` (plans scored against gold graphs), `flowmagic trials` (N trials of a task
or plan, by condition) and `flowmagic study` (plan scores against task success)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .options import settings_from
from .progress import Progress
from ..errors import ConfigError

__all__ = ["cmd_eval", "cmd_trials", "cmd_study", "add_parsers"]


def cmd_eval(args: argparse.Namespace) -> int:
    from ..evaluate.run import evaluate_file

    for path in (args.out, args.save_pred):   # fail now, not after an hour of planning
        if path and not Path(path).parent.is_dir():
            raise ConfigError(f"cannot write {path}: its folder does not exist")
    if args.out and Path(args.out).suffix.lower() not in (".csv", ".json"):
        raise ConfigError(f"--out {args.out}: use a .csv or .json file")
    with Progress() as progress:
        progress.doing = "evaluating"
        run = evaluate_file(args.data, k=args.k, model=args.model, strategy=args.strategy,
                            similarity=args.similarity, limit=args.limit, sample=args.sample,
                            concurrency=args.concurrency, context=args.context, pred=args.pred,
                            max_tokens=args.max_tokens, seed=args.seed, cache=not args.no_cache,
                            embed_model=args.embed_model, progress=progress.say)
    print(run.table(), run.summary_text(), sep="\n\n")
    for path, write in ((args.out, run.write), (args.save_pred, run.save_predictions)):
        if path:
            print(f"wrote {write(path)}")
    return 0


def _eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="plan each task of a gold JSONL file and score the plans",
                        description="DATA.jsonl holds {task, nodes: [{id, label}], edges: [[a, b]]} "
                        "records. Prints per-task scores, then means overall and by gold shape.")
    ev.add_argument("data", metavar="DATA.jsonl")
    ev.add_argument("--k", type=int, default=3, help="candidate plans per task (default 3)")
    ev.add_argument("--model", help="model id, e.g. gpt-4o-mini, cheap:llama3.2, local")
    ev.add_argument("--strategy", default="balanced",
                    choices=("balanced", "coarse", "fine", "critical-path"))
    ev.add_argument("--max-tokens", type=int, help="token limit of each plan reply")
    ev.add_argument("--seed", type=int, default=0, help="seed of the first candidate (default 0)")
    ev.add_argument("--similarity", default="auto", choices=("auto", "tfidf", "embeddings", "minilm"),
                    help="label similarity (auto: the endpoint's embeddings, else MiniLM, else TF-IDF)")
    ev.add_argument("--embed-model", help="model for /embeddings (default $FLOWMAGIC_EMBED_MODEL, "
                    "text-embedding-3-small on OpenAI, else --model)")
    ev.add_argument("--limit", type=int, help="only the first N records")
    ev.add_argument("--sample", type=int, help="N records taken in turn from each gold shape")
    ev.add_argument("--concurrency", type=int, default=1, help="tasks planned at once (default 1)")
    ev.add_argument("--context", action="store_true",
                    help="give the planner each record's context (WorFBench tools, actions)")
    ev.add_argument("--pred", metavar="FILE", help="score saved predictions (JSONL); no planning")
    ev.add_argument("--save-pred", metavar="FILE", help="save the plans as JSONL for --pred")
    ev.add_argument("--out", metavar="FILE", help="write the results as .csv or .json")
    ev.add_argument("--no-cache", action="store_true", help="ask the model again, even for cached plans")
    ev.set_defaults(func=cmd_eval)


def _compare_task(args: argparse.Namespace) -> int:
    """Flow's task with its per-criterion table, beside the one-call and sequential baselines."""
    from ..evaluate.comparison import compare_task

    settings = settings_from(args.set, model=args.model or None).given()
    model = settings.pop("model", None)

    def tell(arm) -> None:
        done = "; ".join(f"{s.criterion} {'n/c' if s.value is None else int(s.value)}" for s in arm.scores)
        print(f"  trial {arm.trial} {arm.method}: {arm.time_s:.1f} s, {done}"
              + (f" ({arm.error})" if arm.error else ""), file=sys.stderr, flush=True)

    comp = compare_task(args.template, params=args.param, n=args.n or 1, k=args.k, model=model,
                        seed=args.seed, judge=args.judge, progress=tell, **settings)
    print(comp.markdown())
    if args.out:
        Path(args.out).write_text(json.dumps(comp.to_dict(), indent=2, default=str), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    from ..evaluate.comparison import is_task_template
    from ..evaluate.trials import CONDITIONS, trials

    if is_task_template(args.template):
        if args.source:
            raise ConfigError(f"--template {args.template} runs the template's own task; "
                              "give no TASK or plan with it")
        return _compare_task(args)
    if not args.source:
        raise ConfigError("trials needs a TASK or PLAN.json, or --template gobang, website or "
                          "beamer for Flow's tasks")
    source = args.source
    if source.endswith(".json") and Path(source).is_file():
        source = json.loads(Path(source).read_text(encoding="utf-8"))
    plan_score = None
    if args.gold:
        from ..evaluate import compare
        gold = json.loads(Path(args.gold).read_text(encoding="utf-8"))
        plan_score = lambda wf: {k: v for k, v in compare(wf, gold).as_dict().items()  # noqa: E731
                                 if k in ("ssi", "node_f1", "edge_f1")}
    settings = settings_from(args.set, model=args.model or None)
    conditions = CONDITIONS if args.compare_updates else {"as set": {}}
    report = trials(source, n=args.n or 5, mask_rates=args.mask_rate or (0.0,), conditions=conditions,
                    checks=args.check, template=args.template, expected=args.expect,
                    plan_score=plan_score, seed=args.seed, concurrency=args.concurrency,
                    **settings.given())
    print(report.text())
    if args.out:
        Path(args.out).write_text(json.dumps(report.to_dict(), indent=2, default=str), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    from ..evaluate.study import STUDY_METRICS, correlation_study

    study = correlation_study(args.scores, args.success, column=args.column,
                              metrics=args.metric or STUDY_METRICS)
    print(study.markdown())
    if args.out:
        Path(args.out).write_text(json.dumps(study.to_dict(), indent=2), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


def _study_parser(sub) -> None:
    st = sub.add_parser("study", help="correlate plan scores with task success: p-values, "
                        "sequential vs parallel, regression",
                        description="CARIAD's study on the output of flowmagic eval --out: "
                        "Pearson and Spearman with p-values per plan metric, overall and by "
                        "gold shape, and an OLS regression of success on the metrics.")
    st.add_argument("scores", metavar="SCORES.csv|.json", help="what flowmagic eval --out wrote")
    st.add_argument("--success", default="success", metavar="COLUMN|FILE",
                    help="a column of SCORES, or a .csv/.json/.jsonl file of id and success "
                    "(default: the column 'success')")
    st.add_argument("--column", default="success", help="the success column in --success FILE")
    st.add_argument("--metric", action="append", help="a plan metric to study (repeatable; "
                    "default node_f1, edge_f1, ssi, label_similarity, ged, "
                    "path_length_similarity, pred_complexity)")
    st.add_argument("--out", metavar="FILE.json", help="write the study as JSON")
    st.set_defaults(func=cmd_study)


def _trials_parser(sub) -> None:
    tr = sub.add_parser("trials", help="N trials of a task or plan: with vs without updates, "
                        "masking rates, success rates and tables",
                        description="Runs N trials per condition, each with a fresh seed, and "
                        "prints the success rate by condition and masking rate, time, calls, "
                        "updates and change ratios, and answer scores beside plan scores.")
    tr.add_argument("source", metavar="TASK|PLAN.json", nargs="?",
                    help="a task in words, or a plan file (none with --template gobang, "
                    "website or beamer)")
    tr.add_argument("--n", type=int, help="trials per condition (default 5; 1 for a task template)")
    tr.add_argument("--mask-rate", type=float, action="append",
                    help="a masking rate to try (repeatable; default 0)")
    tr.add_argument("--no-compare-updates", dest="compare_updates", action="store_false",
                    help="run only the settings given, not with and without updates")
    tr.add_argument("--check", action="append", help="text the result must contain (repeatable)")
    tr.add_argument("--template", help="use this template's checks; gobang, website or beamer: "
                    "run Flow's task and score its criteria beside one call and a sequential run")
    tr.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                    help="a parameter of the task template (repeatable)")
    tr.add_argument("--k", type=int, default=1, help="candidate plans for a task template (default 1)")
    tr.add_argument("--no-judge", dest="judge", action="store_false",
                    help="no LLM judge: what only a reader can judge stays not checked")
    tr.add_argument("--expect", help="the expected answer: each result is scored against it")
    tr.add_argument("--gold", metavar="GOLD.json", help="a gold plan: each plan is scored against it")
    tr.add_argument("--model", help="model id, e.g. gpt-4o-mini, cheap:llama3.2, local")
    tr.add_argument("--seed", type=int, default=0, help="seed of the first trial (default 0)")
    tr.add_argument("--concurrency", type=int, default=2, help="trials at once (default 2)")
    tr.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="any other flow setting, e.g. --set validate=llm (repeatable)")
    tr.add_argument("--out", metavar="FILE.json", help="write every trial and the tables as JSON")
    tr.set_defaults(func=cmd_trials)


def add_parsers(sub) -> None:
    """`eval`, `trials` and `study`."""
    _eval_parser(sub)
    _trials_parser(sub)
    _study_parser(sub)
