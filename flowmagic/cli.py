"""The `flowmagic` command. Each subcommand is one function `cmd_NAME(args)`.

Results go to stdout, progress (one line per node event or notebook cell, and a
"still working" line when nothing happened for a while) to stderr, so `> file` keeps
only the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, FlowError, write_error
from ._internal.text import one_line
from ._internal.version import __version__
from .model.status import RunState, Status
from .magic_grammar import add_map_options, map_options

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["main", "build_parser"]

_QUIET_S = 15.0   # a "still working" line after this long without any other line
_STOP = {"a", "an", "the", "to", "of", "and", "or", "for", "with", "on", "in", "write", "make",
         "build", "create", "short", "some", "about", "my", "your"}


class Progress:
    """Lines on stderr: `[  12.3s] message`, plus a heartbeat while nothing happens."""

    def __init__(self, stream=None, quiet_s: float = _QUIET_S):
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.quiet_s = quiet_s
        self.doing = ""
        self.running: dict[str, str] = {}
        self.waiting: dict[str, int] = {}   # node -> requests ahead of its model call
        self._last = self.t0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, message: str) -> None:
        now = time.perf_counter()
        self._last = now
        print(f"[{now - self.t0:7.1f}s] {message}", file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        self._thread = threading.Thread(target=self._beat, name="flowmagic-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            if self.doing and time.perf_counter() - self._last >= self.quiet_s:
                busy = ", ".join(self._busy(node) for node in self.running) or (
                    "the final write-up" if self.doing == "running" else "")
                busy = f": {busy}" if busy else ""
                self.say(f"… still {self.doing}{busy}")

    def _busy(self, node: str) -> str:
        ahead = self.waiting.get(node)
        return node if ahead is None else f"{node} (waiting for the model, {ahead} ahead)"

    def event(self, e: dict) -> None:
        """A Flow event, as one line."""
        kind, node = e.get("kind"), e.get("node")
        if kind == "waiting":   # a line when a node starts waiting; the heartbeat counts down
            ahead = e.get("ahead")
            if ahead is None:
                self.waiting.pop(node, None)
                return
            first = node not in self.waiting
            self.waiting[node] = ahead
            if first:
                self.say(f"⧗ {node} waiting for the model ({ahead} ahead)")
        elif kind == "started":
            self.running[node] = e.get("clone") or e.get("agent") or ""
            self.say(f"▶ {node} ({self.running[node]})")
        elif kind == "finished":
            self.running.pop(node, None)
            self.waiting.pop(node, None)
            self.say(f"✓ {node}" + (" (output masked: fault injection)" if e.get("masked") else ""))
        elif kind == "failed":
            self.running.pop(node, None)
            self.waiting.pop(node, None)
            self.say(f"✗ {node}: {one_line(e.get('error') or '', 100)}")
        elif kind == "stopped":
            self.running.pop(node, None)
        elif kind == "updated":
            self.say("↻ the workflow was updated" + (" (no change)" if e.get("no_change") else ""))
        elif kind == "update_capped":
            self.say(f"↻ {e.get('message')}")
        elif kind == "budget":
            self.say(f"$ {e.get('message')}")


# ----------------------------------------------------------------------------- helpers
def _settings(pairs: list[str] | None, **options: Any) -> Settings:
    """The flow settings of the command's own options (those not None) with `--set key=value`
    on top (typed on purpose, where an option may be its default), checked once: an unknown
    key or a bad value is one line, before any model call."""
    from .magic_grammar import parse_assignments
    from .settings import Settings

    try:
        given = parse_assignments(list(pairs)) if pairs else {}
    except ConfigError:
        raise ConfigError(f"--set takes key=value, not {' '.join(pairs)!r}") from None
    return Settings(**{**{k: v for k, v in options.items() if v is not None}, **given})


def _writable_folder(folder: Path) -> Path:
    """`folder`, made if need be, or one line now: before any paid planning call."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc) from None
    if not os.access(folder, os.W_OK):
        raise write_error(folder, PermissionError(13, "Permission denied"))
    return folder


def _writable_file(path: str | None) -> None:
    if path:
        if Path(path).is_dir():
            raise write_error(path, IsADirectoryError(21, "it is a folder"))
        _writable_folder(Path(path).parent)


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise write_error(path, exc) from None


def _name_from(task: str) -> str:
    words = [w for w in re.findall(r"[a-z0-9]+", task.lower()) if w not in _STOP]
    name = "_".join(words[:3]) or "flow"
    return name if name[0].isalpha() else f"flow_{name}"


def _plan(args, progress: Progress):
    from .flow import plan

    settings = _settings(getattr(args, "set", None), k=args.k, model=args.model,
                         strategy=args.strategy, max_tokens=getattr(args, "max_tokens", None) or None,
                         max_k=getattr(args, "max_k", None) or None,
                         sandbox=getattr(args, "sandbox", None) or None)
    name = args.name or _name_from(args.task)
    inputs = getattr(args, "inputs", None) or None
    progress.doing = "planning"
    if settings.k is None:
        from .engine.planner import default_k
        settings.k = default_k(settings.model)
    progress.say(f"planning {args.task!r}: {settings.k} candidate plan(s) on "
                 f"{settings.model or 'the default model'}")
    flow = plan(args.task, name=name, inputs=inputs, **settings.given())
    progress.doing = ""
    scores = flow.metrics()
    progress.say(f"plan: {flow.total()} subtasks, {len(flow.workflow.edges())} dependencies, "
                 f"speed-up {scores.get('speedup', 0):.2f} (candidate {flow.chosen} of "
                 f"{len(flow.candidates)})")
    return flow


def _describe(flow) -> str:
    from .view.display import node_lines

    def line(node_id, node, parents):
        after = one_line(", ".join(parents), 200)
        return (f"  {node_id} [{node.agent}]{' after ' + after if after else ''}: "
                f"{one_line(node.requirement, 90)}")

    return "\n".join(node_lines(flow.workflow, flow.workflow.order(), line))


def _drawings(flow, folder: Path, name: str) -> list[Path]:
    from .view import render

    written = [folder / f"{name}.svg"]
    _write_text(written[0], render.svg(flow))
    if render.have_dot():
        written.append(folder / f"{name}.png")
        try:
            written[-1].write_bytes(render.png(flow))
        except OSError as exc:
            raise write_error(written[-1], exc) from None
    return written


def _summary(flow, seconds: float) -> str:
    counts = flow.counts()
    total = flow.cost_data()["total"]
    failed = f", {counts[Status.FAILED]} failed" if counts.get(Status.FAILED) else ""
    started = [i for i, n in flow.workflow.nodes.items() if n.status == Status.DONE
               and n.attempts and n.attempts[-1].get("fallback") == "starter"]
    if started:   # done on flowmagic's code, not the model's: said where the count is
        failed += (f" ({', '.join(started)}: the working start's output, the model's answers "
                   "were not usable)")
    return (f"{flow.name}: {flow.status}; {counts.get(Status.DONE, 0)}/{flow.total()} nodes done{failed}; "
            f"{seconds:.1f} s; {total['calls'] - total['cached']} model calls "
            f"(+{total['cached']} from the cache); tokens {total['input_tokens']:,} in"
            f"{_prompt_cached(total)}, "
            f"{total['output_tokens']:,} out; ${total['cost_usd']:.4f}")


def _printed(flow, lines_each: int = 30) -> str:
    """What the nodes' code printed in the sandbox, node by node (clipped), and the figures it
    drew: the numbers a data flow shows come from here, not from the model's words."""
    from .engine.answer_code import WORKING_START

    parts = []
    for node_id in flow.workflow.order():
        ran = flow.workflow.nodes[node_id].execution or {}
        for record in (ran.get(WORKING_START), ran):
            if isinstance(record, dict) and record.get("ran"):
                parts.append(_printed_by(node_id, record, lines_each))
    return "\n".join(parts)


# Control characters but tab and newline: a terminal would obey an escape sequence in model text.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printed_by(node_id: str, ran: dict, lines_each: int) -> str:
    whose = "flowmagic's working start" if ran.get("starter") else "the model's code"
    text = (ran.get("stdout") or "").rstrip().splitlines()
    more = f"\n    … {len(text) - lines_each} more line(s)" if len(text) > lines_each else ""
    shown = "\n".join("    " + _CONTROL.sub("", line)[:160]   # printed by model code
                      for line in text[:lines_each]) or "    (nothing)"
    figures = f"; figures: {', '.join(ran['figures'])}" if ran.get("figures") else ""
    state = "ran" if ran.get("ok") else f"failed: {one_line(ran.get('error') or '', 120)}"
    return f"  {node_id} ({whose}, {state}{figures}) printed:\n{shown}{more}"


def _shown(text: str, lines: int = 40) -> str:
    """Model text for a terminal: no control characters (an escape sequence could rewrite
    what the terminal shows), indented, at most `lines` lines."""
    rows = _CONTROL.sub("", text).rstrip().splitlines()
    more = f"\n    … {len(rows) - lines} more line(s)" if len(rows) > lines else ""
    return "\n".join("    " + row[:300] for row in rows[:lines]) + more


def _prompt_cached(total: dict) -> str:
    n = total.get("cached_tokens") or 0
    return f" ({n:,} from the endpoint's prompt cache)" if n else ""


# ----------------------------------------------------------------------------- commands
def _template_named(task: str) -> str | None:
    """The template a one-word TASK names (`flowmagic run csv_eda`), else None."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", task.strip()):
        return None
    from .ops.nbrun import TEMPLATES

    return task.strip() if (TEMPLATES / f"{task.strip()}.ipynb").is_file() else None


def cmd_run(args: argparse.Namespace) -> int:
    if args.inputs and (args.task.endswith(".ipynb") or _template_named(args.task)):
        raise ConfigError("--inputs gives a TASK its files; for a notebook or template use -p "
                          "(csv_path=FILE for csv_eda) or its %%flow cell's --inputs")
    if args.task.endswith(".ipynb"):
        return _run_notebook(args)
    template = _template_named(args.task)
    if template:
        return _run_template(args, template)
    if args.params:
        raise ConfigError("-p fills a notebook's parameters; for a task use --set key=value")
    from .ops.export import export

    out = _writable_folder(Path(args.out))
    started = time.perf_counter()
    with Progress() as progress:
        flow = _plan(args, progress)
        print(_describe(flow))
        unsubscribe = flow.subscribe(progress.event)
        progress.doing = "running"
        flow.run()
        unsubscribe()
        progress.doing = ""
        printed = _printed(flow)
        if printed:
            print("code run in the sandbox:\n" + printed)
        if flow.result:
            print("result (written by the model from those outputs):\n" + _shown(flow.result))
        path = export(flow, out / f"{flow.name}.ipynb")
        files = [path, *_drawings(flow, out, flow.name)]
        seconds = time.perf_counter() - started
        if not args.no_execute:
            replay = _execute(path, None, [], progress, args.timeout)
            if replay["calls"]:
                progress.say(f"warning: replaying the notebook made {replay['calls']} model call(s)")
    print(_summary(flow, seconds))
    if not args.no_execute:
        print(f"replayed {path} in a kernel: {replay['calls']} model calls, "
              f"{replay['seconds']:.1f} s")
    print("wrote " + ", ".join(str(f) for f in files))
    if flow.message:
        print(flow.message)
    return 0 if flow.status == RunState.DONE else 1


def _execute(path: Path, out, params, progress: Progress, timeout: float) -> dict:
    from .ops.nbrun import execute

    progress.doing = f"running {path.name}"
    progress.say(f"running {path} in a kernel")
    stats = execute(path, out, params=params, timeout=timeout, progress=progress.say)
    progress.doing = ""
    return stats


def _run_notebook(args: argparse.Namespace) -> int:
    path = Path(args.task)
    out = None
    if args.out_given:
        out = Path(args.out)
        out = out if out.suffix == ".ipynb" else out / path.name
    with Progress() as progress:
        stats = _execute(path, out, args.params, progress, args.timeout)
    print(f"ran {stats['cells']} cells of {path} in {stats['seconds']:.1f} s: "
          f"{stats['calls']} model calls (+{stats['cached']} from the cache); wrote {stats['path']}")
    for line in stats["errors"]:
        print(f"flowmagic error in {line}")
    return 1 if stats["errors"] else 0


def _run_template(args: argparse.Namespace, template: str) -> int:
    """A template by name: made into OUT/TEMPLATE.ipynb (its -p parameters filled), then run."""
    from .ops.nbrun import new

    out = _writable_folder(Path(args.out))
    path = new(template, out / f"{template}.ipynb", args.params, force=True)
    print(f"made {path} from the template {template!r}; running it")
    args.task, args.out_given = str(path), False
    return _run_notebook(args)


def cmd_plan(args: argparse.Namespace) -> int:
    _writable_file(args.svg)
    with Progress() as progress:
        flow = _plan(args, progress)
    if args.json:
        print(json.dumps({"run": flow.run_id, "name": flow.name, "chosen": flow.chosen,
                          "candidates": [c.to_dict() for c in flow.candidates],
                          "workflow": flow.workflow.to_dict()}, indent=2, ensure_ascii=False))
        return 0
    from .engine.planner import RULE, candidate_line

    print(f"selection rule: {RULE}")
    for c in flow.candidates:
        print(candidate_line(c, flow.chosen))
    print(_describe(flow))
    for warning in flow.workflow.warnings[:60]:
        print(f"  warning: {warning}")
    if args.svg:
        from .view.render import svg

        _write_text(Path(args.svg), svg(flow))
        print(f"wrote {args.svg}")
    print(f"run {flow.run_id}: `flowmagic export {flow.run_id} {flow.name}.ipynb` writes a "
          "notebook whose cells run it node by node")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .flow import load
    from .ops.export import export

    flow = load(args.run)
    path = export(flow, args.path, name=args.name)
    print(f"wrote {path} ({flow.counts().get('done', 0)}/{flow.total()} nodes done in run "
          f"{flow.run_id})")
    if args.execute:
        from .ops.codecells import EXECUTE_ENV

        import nbformat

        from .ops.nbsession import mismatches

        recorded = nbformat.read(str(path), as_version=4)
        # the kernel inherits it: every %%flow_code cell runs its code again, in the sandbox
        before, os.environ[EXECUTE_ENV] = os.environ.get(EXECUTE_ENV), "1"
        try:
            with Progress() as progress:
                stats = _execute(path, None, [], progress, args.timeout)
        finally:
            if before is None:
                os.environ.pop(EXECUTE_ENV, None)
            else:
                os.environ[EXECUTE_ENV] = before
        print(f"ran it in a kernel, the code cells again in the sandbox: {stats['calls']} model "
              f"calls, {stats['seconds']:.1f} s")
        differ = mismatches(recorded, nbformat.read(str(path), as_version=4))
        for line in differ:
            print(line)
        codes = sum(1 for c in recorded.cells if c.cell_type == "code"
                    and c.source.startswith("%%flow_code"))
        print(f"{codes - len(differ)} of {codes} code cells printed what they printed in the run"
              + ("" if not differ else "; the cells above did not"))
        return 1 if differ else 0
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    from .flow import load
    from .ops.distributed import write_results

    flow = load(args.run)
    out = Path(args.out or f"{flow.name}.map.csv")
    frame = flow.map_file(args.data, **map_options(args))
    write_results(frame, out)
    counts = frame["status"].value_counts().to_dict()
    print(f"wrote {out}: {len(frame)} rows, " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; ${frame['cost_usd'].sum():.4f} list price (`flowmagic log` shows the calls)")
    return 0 if counts.get(RunState.DONE, 0) == len(frame) else 1


def cmd_templates(args: argparse.Namespace) -> int:
    from .ops.nbrun import templates

    found = templates()
    if args.json:
        print(json.dumps([{k: (str(v) if k == "path" else v) for k, v in t.items()} for t in found],
                         indent=2, ensure_ascii=False))
        return 0
    width = max((len(t["name"]) for t in found), default=0) + 2
    for t in found:
        params = " ".join(f"-p {k}={shlex.quote(str(v))}" for k, v in t["parameters"].items())
        print(f"{t['name']:<{width}}{t['title']}: {t['description']}\n{'':<{width}}{params}")
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from .ops.nbrun import new

    path = new(args.template, args.path, args.params, force=args.force)
    print(f"wrote {path}; run it with `flowmagic run {path}` or open it in Jupyter")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .view.display import models_report

    print(models_report(("OPENAI_API_KEY", "FLOWMAGIC_API_KEY")).text)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from .store import get_store

    store = get_store()
    if args.what == "path":
        print(store.path)
        return 0
    if args.n < 1:
        raise ConfigError(f"log -n takes a number of calls, 1 or more, not {args.n}")
    run_id = store.load_run(args.run)["id"] if args.run else None
    rows = store.recent_calls(args.n, run_id=run_id, model=args.model, query=args.query)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False, default=str))
        return 0
    if not rows:
        filtered = args.model or args.run or args.query
        print("no model call matches" if filtered else "no model calls logged yet")
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["ts"]))
        state = "cache" if row["cached"] else ("ERROR" if row["error"] else "call")
        last = row["messages"][-1]["content"] if row["messages"] else ""
        print(f"#{row['id']} {when} {state:5} {row['model']} "
              f"in={row['input_tokens'] or 0} out={row['output_tokens'] or 0} "
              f"{(row['latency_s'] or 0):.2f}s ${(row['cost_usd'] or 0):.6f}  "
              f"{one_line(last, 60)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate.run import evaluate_file

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


# ----------------------------------------------------------------------------- the parser
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
    from .evaluate.comparison import compare_task

    settings = _settings(args.set, model=args.model or None).given()
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
    from .evaluate.comparison import is_task_template
    from .evaluate.trials import CONDITIONS, trials

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
        from .evaluate import compare
        gold = json.loads(Path(args.gold).read_text(encoding="utf-8"))
        plan_score = lambda wf: {k: v for k, v in compare(wf, gold).as_dict().items()  # noqa: E731
                                 if k in ("ssi", "node_f1", "edge_f1")}
    settings = _settings(args.set, model=args.model or None)
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
    from .evaluate.study import STUDY_METRICS, correlation_study

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


def _planning_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", type=int, help="candidate plans (default 3, or a server you run's "
                   "slots when fewer; at most --max-k)")
    p.add_argument("--max-k", type=int, help="allow more than 10 candidate plans (paid calls), "
                   "up to this many")
    p.add_argument("--model", help="model id, e.g. gpt-4o-mini, cheap:llama3.2, local")
    p.add_argument("--strategy", default="balanced",
                   help="balanced, coarse, fine or critical-path (default balanced)")
    p.add_argument("--name", help="the flow's name (default: from the task's words)")
    p.add_argument("--max-tokens", type=int, help="token limit of each node's answer")
    p.add_argument("--sandbox", choices=("bwrap", "none"),
                   help="how model-written code runs: bwrap (isolated, the default) or none "
                        "(no isolation, warned on every run)")
    p.add_argument("--inputs", action="append", metavar="FILE",
                   help="a file the flow works on (a CSV, ...): copied into the run's workspace, "
                        "read-only to model code; tables are loaded as DataFrames (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any other flow setting, e.g. --set validate=llm (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowmagic", description="Plan, run and export multi-agent task graphs.",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=30))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"flowmagic {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="plan and run a task, or run a notebook or template headless",
                         description="TASK: plan, run, write OUT/NAME.ipynb (replayed in a "
                         "kernel) and OUT/NAME.svg/.png. NOTEBOOK.ipynb: run it top to bottom. "
                         "TEMPLATE (a name from `flowmagic templates`): write "
                         "OUT/TEMPLATE.ipynb with the -p parameters and run it.")
    run.add_argument("task", metavar="TASK|NOTEBOOK.ipynb|TEMPLATE")
    _planning_options(run)
    run.add_argument("--out", default="out",
                     help="folder for a task's files (default out); for a notebook, where to "
                     "write it (default: in place)")
    run.add_argument("-p", dest="params", action="append", metavar="KEY=VALUE",
                     help="a notebook's or template's parameter (repeatable)")
    run.add_argument("--no-execute", action="store_true",
                     help="write the notebook without replaying it in a kernel")
    run.add_argument("--timeout", type=float, default=1800, help="seconds per notebook cell")
    run.set_defaults(func=cmd_run)

    plan = sub.add_parser("plan", help="plan a task and show the candidates and the chosen graph")
    plan.add_argument("task", metavar="TASK")
    _planning_options(plan)
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.add_argument("--svg", metavar="PATH", help="also write the drawing")
    plan.set_defaults(func=cmd_plan)

    export = sub.add_parser("export", help="write a stored run as a notebook that replays it")
    export.add_argument("run", metavar="RUN", help="run id or flow name (see `flowmagic log`)")
    export.add_argument("path", metavar="OUT.ipynb")
    export.add_argument("--name", help="the flow's variable name in the notebook")
    export.add_argument("--execute", action="store_true",
                        help="then run it in a kernel: text nodes replay, code cells run again in the sandbox")
    export.add_argument("--timeout", type=float, default=1800, help="seconds per notebook cell")
    export.set_defaults(func=cmd_export)

    mp = sub.add_parser("map", help="run a stored flow once per row of a data file on Dask",
                        description="Run the workflow of RUN once per row of DATA (.csv, "
                        ".parquet or .jsonl; columns fill {{field}}) on Dask: the scheduler "
                        "in FLOWMAGIC_DASK or --engine, else a LocalCluster. Resumable: rows "
                        "already done are not run again. Writes one row per input to OUT.")
    mp.add_argument("run", metavar="RUN", help="run id or flow name (see `flowmagic log`)")
    mp.add_argument("data", metavar="DATA")
    mp.add_argument("--out", help="results file, .csv/.parquet/.jsonl (default NAME.map.csv)")
    add_map_options(mp)
    mp.set_defaults(func=cmd_map)

    log = sub.add_parser("log", help="recent model calls, newest first",
                         description="The newest model calls, filtered by model, run and text; "
                         "`flowmagic log path` prints where the store is.")
    log.add_argument("what", nargs="?", choices=("path",), metavar="path",
                     help="print the path of the store (flowmagic.db) and nothing else")
    log.add_argument("-n", type=int, default=10, help="how many calls (default 10)")
    log.add_argument("-m", "--model", help="only calls to this model")
    log.add_argument("-r", "--run", help="only calls of this run (id or flow name)")
    log.add_argument("-q", "--query", help="only calls whose prompt or answer holds this text")
    log.add_argument("--json", action="store_true", help="print JSON")
    log.set_defaults(func=cmd_log)

    models = sub.add_parser("models", help="the endpoints, the local servers found running, "
                                          "and the model prices")
    models.set_defaults(func=cmd_models)

    tpl = sub.add_parser("templates", help="list the notebook templates")
    tpl.add_argument("--json", action="store_true", help="print JSON")
    tpl.set_defaults(func=cmd_templates)

    new = sub.add_parser("new", help="make a notebook from a template")
    new.add_argument("template", metavar="TEMPLATE")
    new.add_argument("path", metavar="OUT.ipynb")
    new.add_argument("-p", dest="params", action="append", metavar="KEY=VALUE",
                     help="a parameter (repeatable)")
    new.add_argument("--force", action="store_true", help="overwrite OUT.ipynb")
    new.set_defaults(func=cmd_new)
    _eval_parser(sub)
    _trials_parser(sub)
    _study_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.out_given = any(a == "--out" or a.startswith("--out=") for a in argv)
    try:
        return int(args.func(args) or 0)
    except FlowError as exc:
        if args.debug:
            raise
        from .llm.endpoints import scrub

        print(f"flowmagic: {scrub(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flowmagic: interrupted; everything finished so far is in the store", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
