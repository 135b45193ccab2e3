"""`flowmagic run TASK` and `flowmagic plan TASK`: plan a task (and run it, export it, replay
the export in a kernel)."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from .notebooks import execute_notebook, run_notebook, run_template, template_named
from .options import planning_options, settings_from, writable_file, writable_folder, write_text
from .progress import Progress
from .report import describe, drawings, printed, shown, summary
from ..errors import ConfigError
from ..model.status import RunState

__all__ = ["cmd_run", "cmd_plan", "add_parsers"]

_STOP = {"a", "an", "the", "to", "of", "and", "or", "for", "with", "on", "in", "write", "make",
         "build", "create", "short", "some", "about", "my", "your"}


def _name_from(task: str) -> str:
    words = [w for w in re.findall(r"[a-z0-9]+", task.lower()) if w not in _STOP]
    name = "_".join(words[:3]) or "flow"
    return name if name[0].isalpha() else f"flow_{name}"


def _plan(args, progress: Progress):
    from ..flow import plan

    settings = settings_from(getattr(args, "set", None), k=args.k, model=args.model,
                         strategy=args.strategy, max_tokens=getattr(args, "max_tokens", None) or None,
                         max_k=getattr(args, "max_k", None) or None,
                         sandbox=getattr(args, "sandbox", None) or None)
    name = args.name or _name_from(args.task)
    inputs = getattr(args, "inputs", None) or None
    progress.doing = "planning"
    if settings.k is None:
        from ..engine.planner import default_k
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


def cmd_run(args: argparse.Namespace) -> int:
    if args.inputs and (args.task.endswith(".ipynb") or template_named(args.task)):
        raise ConfigError("--inputs gives a TASK its files; for a notebook or template use -p "
                          "(csv_path=FILE for csv_eda) or its %%flow cell's --inputs")
    if args.task.endswith(".ipynb"):
        return run_notebook(args)
    template = template_named(args.task)
    if template:
        return run_template(args, template)
    if args.params:
        raise ConfigError("-p fills a notebook's parameters; for a task use --set key=value")
    from ..ops.export import export

    out = writable_folder(Path(args.out))
    started = time.perf_counter()
    with Progress() as progress:
        flow = _plan(args, progress)
        print(describe(flow))
        unsubscribe = flow.subscribe(progress.event)
        progress.doing = "running"
        flow.run()
        unsubscribe()
        progress.doing = ""
        output = printed(flow)
        if output:
            print("code run in the sandbox:\n" + output)
        if flow.result:
            print("result (written by the model from those outputs):\n" + shown(flow.result))
        path = export(flow, out / f"{flow.name}.ipynb")
        files = [path, *drawings(flow, out, flow.name)]
        seconds = time.perf_counter() - started
        if not args.no_execute:
            replay = execute_notebook(path, None, [], progress, args.timeout)
            if replay["calls"]:
                progress.say(f"warning: replaying the notebook made {replay['calls']} model call(s)")
    print(summary(flow, seconds))
    if not args.no_execute:
        print(f"replayed {path} in a kernel: {replay['calls']} model calls, "
              f"{replay['seconds']:.1f} s")
    print("wrote " + ", ".join(str(f) for f in files))
    if flow.message:
        print(flow.message)
    return 0 if flow.status == RunState.DONE else 1


def cmd_plan(args: argparse.Namespace) -> int:
    writable_file(args.svg)
    with Progress() as progress:
        flow = _plan(args, progress)
    if args.json:
        print(json.dumps({"run": flow.run_id, "name": flow.name, "chosen": flow.chosen,
                          "candidates": [c.to_dict() for c in flow.candidates],
                          "workflow": flow.workflow.to_dict()}, indent=2, ensure_ascii=False))
        return 0
    from ..engine.planner import RULE, candidate_line

    print(f"selection rule: {RULE}")
    for c in flow.candidates:
        print(candidate_line(c, flow.chosen))
    print(describe(flow))
    for warning in flow.workflow.warnings[:60]:
        print(f"  warning: {warning}")
    if args.svg:
        from ..view.render import svg

        write_text(Path(args.svg), svg(flow))
        print(f"wrote {args.svg}")
    print(f"run {flow.run_id}: `flowmagic export {flow.run_id} {flow.name}.ipynb` writes a "
          "notebook whose cells run it node by node")
    return 0


def add_parsers(sub) -> None:
    """`run` and `plan`."""
    run = sub.add_parser("run", help="plan and run a task, or run a notebook or template headless",
                         description="TASK: plan, run, write OUT/NAME.ipynb (replayed in a "
                         "kernel) and OUT/NAME.svg/.png. NOTEBOOK.ipynb: run it top to bottom. "
                         "TEMPLATE (a name from `flowmagic templates`): write "
                         "OUT/TEMPLATE.ipynb with the -p parameters and run it.")
    run.add_argument("task", metavar="TASK|NOTEBOOK.ipynb|TEMPLATE")
    planning_options(run)
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
    planning_options(plan)
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.add_argument("--svg", metavar="PATH", help="also write the drawing")
    plan.set_defaults(func=cmd_plan)
