"""`flowmagic templates`, `flowmagic new`, and a notebook or a template run headless (what
`flowmagic run` does with NOTEBOOK.ipynb or a template's name)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

from .options import writable_folder
from .progress import Progress

__all__ = ["cmd_templates", "cmd_new", "template_named", "run_notebook", "run_template",
           "execute_notebook", "add_parsers"]


def template_named(task: str) -> str | None:
    """The template a one-word TASK names (`flowmagic run csv_eda`), else None."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", task.strip()):
        return None
    from ..ops.nbrun import TEMPLATES

    return task.strip() if (TEMPLATES / f"{task.strip()}.ipynb").is_file() else None


def execute_notebook(path: Path, out, params, progress: Progress, timeout: float) -> dict:
    from ..ops.nbrun import execute

    progress.doing = f"running {path.name}"
    progress.say(f"running {path} in a kernel")
    stats = execute(path, out, params=params, timeout=timeout, progress=progress.say)
    progress.doing = ""
    return stats


def run_notebook(args: argparse.Namespace) -> int:
    path = Path(args.task)
    out = None
    if args.out_given:
        out = Path(args.out)
        out = out if out.suffix == ".ipynb" else out / path.name
    with Progress() as progress:
        stats = execute_notebook(path, out, args.params, progress, args.timeout)
    print(f"ran {stats['cells']} cells of {path} in {stats['seconds']:.1f} s: "
          f"{stats['calls']} model calls (+{stats['cached']} from the cache); wrote {stats['path']}")
    for line in stats["errors"]:
        print(f"flowmagic error in {line}")
    return 1 if stats["errors"] else 0


def run_template(args: argparse.Namespace, template: str) -> int:
    """A template by name: made into OUT/TEMPLATE.ipynb (its -p parameters filled), then run."""
    from ..ops.nbrun import new

    out = writable_folder(Path(args.out))
    path = new(template, out / f"{template}.ipynb", args.params, force=True)
    print(f"made {path} from the template {template!r}; running it")
    args.task, args.out_given = str(path), False
    return run_notebook(args)


def cmd_templates(args: argparse.Namespace) -> int:
    from ..ops.nbrun import templates

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
    from ..ops.nbrun import new

    path = new(args.template, args.path, args.params, force=args.force)
    print(f"wrote {path}; run it with `flowmagic run {path}` or open it in Jupyter")
    return 0


def add_parsers(sub) -> None:
    """`templates` and `new`."""
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
