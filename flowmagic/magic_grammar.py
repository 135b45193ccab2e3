"""The grammar of the magics: `%%flow` options, `%flow` subcommands, `{{var}}` interpolation.

Pure functions over strings (no IPython here), so the grammar is tested on its own.
Lines are split with `shlex`, so `%flow edit report intro "two words"` keeps its quotes.
Every mistake raises `ConfigError` with one line that says what would have been right.
"""

from __future__ import annotations

import argparse
import ast
import keyword
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError
from ._internal.text import one_line

__all__ = ["FlowArgs", "OrchestrateArgs", "SlimArgs", "Command", "SUBCOMMANDS", "FLOW_USAGE", "parse_flow_line",
           "parse_command", "flow_help", "flow_option_strings", "subcommand_help", "ARGUMENTS", "parse_assignments", "interpolate", "command_usage", "check_name",
           "is_flow_name",
           "parse_cheaper", "parse_slim_options", "single_brace_names", "add_map_options",
           "map_options", "parse_map_options"]

# name -> (argument names, one line of help)
SUBCOMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "list": ((), "the flows in this notebook and the recent runs in the store"),
    "show": (("NAME",), "the drawing and the control panel of a flow"),
    "run": (("NAME",), "run every node that can run (returns at once in a notebook)"),
    "step": (("NAME",), "run the nodes that are ready now"),
    "stop": (("NAME",), "cancel running nodes; they go back to pending"),
    "prune": (("NAME", "NODE"), "remove a node; its parents are linked to its children"),
    "unprune": (("NAME", "NODE"), "bring a pruned node back with its edges"),
    "downgrade": (("NAME", "NODE", "MODEL"), "run a node on another model from now on"),
    "rerun": (("NAME", "NODE"), "run a node again; its descendants become pending"),
    "edit": (("NAME", "NODE", "REQUIREMENT"), "give a node a new requirement"),
    "cost": (("NAME",), "tokens and USD of a flow, by node and purpose"),
    "timeline": (("NAME",), "when each node ran (a Gantt chart)"),
    "export": (("NAME", "PATH"), "write the executed flow as a notebook"),
    "map": (("NAME", "DATA", "[--engine dask|inprocess|ADDRESS]", "[--workers N]",
             "[--concurrency N]", "[--budget-usd B]", "[--rpm N]", "[--at-once N]"),
            "run a flow once per row of DATA (.csv/.parquet/.jsonl), on Dask by default"),
    "eval": (("NAME", "GOLD.json"), "score a flow's plan against a gold task graph"),
    "importance": (("NAME",), "rank a flow's nodes on its probe set (flow.attach_probe)"),
    "slim": (("NAME", "[--cheaper A=B,...]", "[--tau T]"),
             "a cheaper flow scoring within tau of this one, bound to NAME_slim"),
    "config": (("[KEY=VALUE ...]",), "show or set the defaults of %%flow"),
    "models": ((), "configured endpoints and priced models, with whether each key is set"),
    "log": (("[N]",), "the last N model calls (default 10)"),
    "help": (("[SUBCOMMAND]",), "this list, or what one subcommand takes (also %flow SUBCOMMAND --help)"),
}
# what each argument of a subcommand is (its options are described by their parsers)
ARGUMENTS = {
    "NAME": "a flow of this notebook (a variable a %%flow cell bound)",
    "NODE": "a node id of that flow (%flow show NAME lists them)",
    "MODEL": "a model id, e.g. gpt-4.1-mini, or ENDPOINT:MODEL (cheap:llama3.2)",
    "REQUIREMENT": "the node's new requirement, quoted when it has spaces",
    "PATH": "the notebook to write, e.g. report.ipynb",
    "DATA": "a .csv, .parquet or .jsonl file: one input per row, columns as {{field}}",
    "GOLD.json": "a gold task graph (nodes and edges) to score the plan against",
    "[KEY=VALUE ...]": "settings for later %%flow cells, e.g. k=2 sandbox=none; none: show them",
    "[N]": "how many calls (default 10)",
}
_VARIADIC = {"config": (0, None), "log": (0, 1), "help": (0, 1), "slim": (1, 5), "map": (2, None)}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
_SINGLE = re.compile(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})")

FLOW_USAGE = ("%%flow [NAME] [--k K [--max-k N]] [--model M] [--strategy S] [--update STRATEGY] "
              "[--validate V] [--concurrency N] [--context parents|ancestors] "
              "[--budget-usd B] [--update-k K] [--max-updates N] [--mask-rate R] "
              "[--fail-rate R] [--seed S] [--sandbox bwrap|none] [--no-interpolate] "
              "[--plan-only | --run | --step] [--force] "
              "[--debug] [--tools FN1,FN2] [--inputs FILE1,FILE2] [--execute auto|off] "
              "[--mode aov|orchestrate [--agents A,B] [--budget-s S] "
              "[--max-turns N]]")


@dataclass
class FlowArgs:
    """What a `%%flow` line asked for; None means "use the configured default"."""
    name: str = "flow"
    mode: str | None = None            # "plan-only" | "run" | "step"
    interpolate: bool = True
    debug: bool = False
    help: bool = False
    force: bool = False                # replace whatever NAME holds in the notebook
    settings: dict[str, Any] = field(default_factory=dict)
    tools: str | None = None           # --tools fn1,fn2: functions in the notebook
    kind: str = "aov"                  # --mode: "aov" (a planned workflow) | "orchestrate"
    orchestrate: OrchestrateArgs = field(default_factory=lambda: OrchestrateArgs())
    inputs: list[str] = field(default_factory=list)   # --inputs a.csv,b.csv: files for the workspace


@dataclass
class OrchestrateArgs:
    """The options of `%%flow NAME --mode orchestrate` (the Orchestrator's defaults)."""
    agents: str | None = None          # --agents A,B (None: the default team)
    budget_s: float | None = 300.0     # --budget-s
    max_turns: int | None = 8          # --max-turns


@dataclass
class SlimArgs:
    """The options of `%flow slim NAME`."""
    cheaper: dict[str, str]            # --cheaper big=small,...
    tau: float = 0.95                  # --tau: the share of the baseline score a step must keep


@dataclass
class Command:
    """A `%flow` subcommand and its arguments."""
    name: str
    args: list[str]
    debug: bool = False


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting the kernel."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog}: {message}; see %flow help")

    def exit(self, status: int = 0, message: str | None = None):
        raise ConfigError(f"{self.prog}: {(message or 'bad arguments').strip()}; see %flow help")


def _positive(kind: type, what: str, minimum: float):
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        if not math.isfinite(value):   # NaN compares false with everything: it would pass
            raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, not {text}")
        return value
    convert.__name__ = what
    return convert


def _rate(what: str):
    def convert(text: str):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
        if not 0.0 <= value <= 1.0:
            raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
        return value
    convert.__name__ = what
    return convert


def _flow_parser() -> _Parser:
    p = _Parser(prog="%%flow", add_help=False, allow_abbrev=False,
                description="Plan the cell's task as a graph of subtasks; the next lines are the "
                "task, with {{var}} filled from the notebook.",
                epilog="%flow SUBCOMMAND ... steers a flow: %flow help lists them, "
                "%flow SUBCOMMAND --help describes one.")
    p.add_argument("name", nargs="?", default="flow", help="the variable the flow is bound to (default flow)")
    p.add_argument("--k", type=_positive(int, "--k", 1), help="candidate plans to ask for (default 3); each is a paid call")
    p.add_argument("--max-k", dest="max_k", type=_positive(int, "--max-k", 1), help="allow --k above 10, up to this (at most 1000)")
    p.add_argument("--model", help="the model for planning and nodes, e.g. gpt-4.1-mini or cheap:llama3.2")
    p.add_argument("--strategy", help="planning strategy: balanced, parallel, sequential, ...")
    p.add_argument("--update", help="when the updater revises the plan: on-failure, after-completion, concurrent, off")
    p.add_argument("--validate", help="check each output: none or llm")
    p.add_argument("--concurrency", type=_positive(int, "--concurrency", 1), help="nodes running at once (default 8)")
    p.add_argument("--context", choices=("parents", "ancestors"), help="which results a node reads")
    p.add_argument("--budget-usd", dest="budget_usd", type=_positive(float, "--budget-usd", 0), help="stop the run once it has spent this many USD")
    p.add_argument("--update-k", dest="update_k", type=_positive(int, "--update-k", 1), help="candidate updates per update")
    p.add_argument("--max-updates", dest="max_updates", type=_positive(int, "--max-updates", 0), help="updates a run may make")
    p.add_argument("--mask-rate", dest="mask_rate", type=_rate("--mask-rate"), help="fault injection: share of finished outputs turned into \"none\"")
    p.add_argument("--fail-rate", dest="fail_rate", type=_rate("--fail-rate"), help="fault injection: share of attempts that fail")
    p.add_argument("--seed", type=_positive(int, "--seed", 0), help="the seed of every model call and of fault injection")
    p.add_argument("--sandbox", choices=("bwrap", "none"), help="where model-written code runs: bwrap (default) or none (your rights: only knowingly)")
    p.add_argument("--no-interpolate", dest="interpolate", action="store_false", help="leave {{var}} in the task as written")
    p.add_argument("--tools", help="functions of this notebook the nodes may call, e.g. load_csv,plot")
    p.add_argument("--inputs", help="files copied into the run's workspace, e.g. sales.csv,regions.csv")
    p.add_argument("--execute", choices=("auto", "off"), help="run the Python an answer holds in the sandbox (auto) or keep it as text (off)")
    p.add_argument("--mode", dest="kind", choices=("aov", "orchestrate"), default="aov", help="a planned workflow (aov, default) or an orchestrator with agents")
    p.add_argument("--agents", help="with --mode orchestrate: the agents, e.g. planner,analyst,coder")
    p.add_argument("--budget-s", dest="budget_s", type=_positive(float, "--budget-s", 0.001), help="with --mode orchestrate: seconds it may take (default 300)")
    p.add_argument("--max-turns", dest="max_turns", type=_positive(int, "--max-turns", 1), help="with --mode orchestrate: turns it may take (default 8)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--plan-only", dest="mode", action="store_const", const="plan-only", help="plan and show the panel; run nothing (default)")
    mode.add_argument("--run", dest="mode", action="store_const", const="run", help="plan, then run at once")
    mode.add_argument("--step", dest="mode", action="store_const", const="step", help="plan, then run the nodes that are ready")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("--force", action="store_true", help="replace a variable NAME that holds something other than a flow")
    p.add_argument("-h", "--help", action="store_true", help="this help")
    return p


def _split(line: str, where: str) -> list[str]:
    try:
        return shlex.split(line or "")
    except ValueError as exc:   # an unclosed quote
        raise ConfigError(f"{where}: cannot split the line ({exc}); close the quote") from None


def is_flow_name(name: object) -> bool:
    """True for a name a flow may have: an ASCII Python identifier that is not a keyword (it
    becomes a variable). The one check behind %%flow, %%flow_plan and the export's names."""
    return isinstance(name, str) and bool(_NAME.match(name)) and not keyword.iskeyword(name)


def check_name(name: str) -> str:
    if not is_flow_name(name):
        raise ConfigError(f"flow name {name!r} must be a Python identifier (it becomes a "
                          "variable), e.g. report or flow2")
    return name


def parse_flow_line(line: str) -> FlowArgs:
    """The options of a `%%flow` cell; settings hold only the options given."""
    ns = _flow_parser().parse_args(_split(line, "%%flow"))
    settings = {key: getattr(ns, key) for key in
                ("k", "max_k", "model", "strategy", "update", "validate", "concurrency", "context",
                 "budget_usd", "execute", "update_k", "max_updates", "mask_rate", "fail_rate",
                 "seed", "sandbox") if getattr(ns, key) is not None}
    orchestrate = {key: getattr(ns, key) for key in ("agents", "budget_s", "max_turns")
                   if getattr(ns, key) is not None}
    if orchestrate and ns.kind != "orchestrate":
        raise ConfigError(f"%%flow: --{next(iter(orchestrate)).replace('_', '-')} applies only "
                          "with --mode orchestrate")
    if ns.tools is not None and not [t for t in ns.tools.split(",") if t.strip()]:
        raise ConfigError("%%flow: --tools takes function names, e.g. --tools load_csv,plot")
    inputs = [f.strip() for f in (ns.inputs or "").split(",") if f.strip()]
    if ns.inputs is not None and not inputs:
        raise ConfigError("%%flow: --inputs takes file names, e.g. --inputs sales.csv,regions.csv")
    return FlowArgs(name=check_name(ns.name), mode=ns.mode, interpolate=ns.interpolate,
                    tools=ns.tools, inputs=inputs, kind=ns.kind,
                    orchestrate=OrchestrateArgs(**orchestrate),
                    debug=ns.debug, help=ns.help, force=ns.force, settings=settings)


def command_usage() -> str:
    shapes = {n: " ".join([n, *a]) for n, (a, _) in SUBCOMMANDS.items()}
    width = max(map(len, shapes.values()))
    rows = [f"  %flow {shapes[n]:<{width}}  {h}" for n, (_, h) in SUBCOMMANDS.items()]
    return "\n".join([f"usage: {FLOW_USAGE}", "       %flow SUBCOMMAND ... [--debug]", *rows])


def flow_option_strings() -> list[list[str]]:
    """The option strings of a `%%flow` line (for tab completion)."""
    return [a.option_strings for a in _flow_parser()._actions if a.option_strings]


def flow_help() -> str:
    """`%%flow?` and `%%flow --help`: every option described, then the subcommands."""
    return _flow_parser().format_help() + "\n" + command_usage()


def subcommand_help(name: str) -> str:
    """`%flow NAME --help`: its shape, what it does, and what each argument and option is."""
    if name not in SUBCOMMANDS:
        raise ConfigError(f"unknown subcommand {name!r}; subcommands: {', '.join(SUBCOMMANDS)}")
    names, what = SUBCOMMANDS[name]
    lines = [f"usage: %flow {' '.join([name, *names])} [--debug]", "", what]
    plain = [a for a in names if a in ARGUMENTS]
    if plain:
        width = max(map(len, plain))
        lines += ["", "arguments:", *(f"  {a:<{width}}  {ARGUMENTS[a]}" for a in plain)]
    options = {"map": add_map_options, "slim": _slim_options}.get(name)
    if options:
        p = argparse.ArgumentParser(prog=f"%flow {name}", add_help=False)
        options(p)
        lines += ["", "options:", *p.format_help().split("options:\n", 1)[1].rstrip().splitlines()]
    return "\n".join(lines)


def parse_command(line: str) -> Command:
    """A `%flow` line: the subcommand, its arguments checked for count, and --debug."""
    words = _split(line, "%flow")
    debug = "--debug" in words
    words = [w for w in words if w != "--debug"]
    if not words:
        return Command("help", [], debug)
    name, args = words[0], words[1:]
    if name in ("-h", "--help"):
        name = "help"
    if name in SUBCOMMANDS and name != "help" and ("--help" in args or "-h" in args):
        return Command("help", [name], debug)
    if name not in SUBCOMMANDS:
        raise ConfigError(f"unknown subcommand {name!r}; subcommands: {', '.join(SUBCOMMANDS)}")
    names = SUBCOMMANDS[name][0]
    lo, hi = _VARIADIC.get(name, (len(names), len(names)))
    if len(args) < lo or (hi is not None and len(args) > hi):
        shape = " ".join(names)
        raise ConfigError(f"%flow {name} takes {shape or 'no arguments'}, got "
                          f"{len(args)} argument(s): %flow {name} {shape}".rstrip())
    return Command(name, args, debug)


def parse_cheaper(text: str) -> dict[str, str]:
    """`"big=small, gpt-4o=gpt-4o-mini"` -> {"big": "small", "gpt-4o": "gpt-4o-mini"}."""
    out: dict[str, str] = {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        src, sep, dst = pair.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise ConfigError(f"cheaper takes model=cheaper-model pairs separated by commas, "
                              f"e.g. gpt-4o=gpt-4o-mini,big=small; not {pair.strip()!r}")
        out[src.strip()] = dst.strip()
    return out


def parse_slim_options(words: list[str]) -> SlimArgs:
    """The options of `%flow slim NAME`."""
    p = _Parser(prog="%flow slim", add_help=False, allow_abbrev=False)
    _slim_options(p)
    ns = p.parse_args(words)
    if not 0 < ns.tau <= 1:
        raise ConfigError(f"%flow slim: --tau must be in (0, 1], e.g. 0.95, not {ns.tau:g}")
    return SlimArgs(parse_cheaper(ns.cheaper), ns.tau)


def _slim_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cheaper", default="", metavar="A=B,...",
                   help="the cheaper model to try for each model, e.g. gpt-4.1=gpt-4.1-mini")
    p.add_argument("--tau", type=_positive(float, "--tau", 0.0), default=0.95, metavar="T",
                   help="a step is kept when the score stays at or above T times the baseline "
                        "(default 0.95)")


def add_map_options(p: argparse.ArgumentParser) -> None:
    """The options of a batch map, shared by `%flow map` and `flowmagic map`."""
    p.add_argument("--engine", default="dask", metavar="E",
                   help="dask (FLOWMAGIC_DASK, else a LocalCluster), inprocess, or a "
                        "scheduler address tcp://host:8786")
    p.add_argument("--workers", type=_positive(int, "--workers", 1), metavar="N",
                   help="worker processes of the LocalCluster (default: one per core)")
    p.add_argument("--concurrency", type=_positive(int, "--concurrency", 1), default=4, metavar="N",
                   help="inputs at once per worker")
    p.add_argument("--budget-usd", dest="budget_usd", type=_positive(float, "--budget-usd", 0),
                   metavar="B", help="stop submitting once this is spent")
    p.add_argument("--rpm", type=_positive(int, "--rpm", 1), metavar="N",
                   help="requests per minute per endpoint, cluster-wide")
    p.add_argument("--at-once", dest="requests_at_once", type=_positive(int, "--at-once", 1),
                   metavar="N",
                   help="requests in flight per endpoint, cluster-wide")


def map_options(ns: argparse.Namespace) -> dict[str, Any]:
    """`Flow.map_file` keywords from parsed map options (the ones given, and the engine)."""
    names = ("engine", "workers", "concurrency", "budget_usd", "rpm", "requests_at_once")
    return {n: getattr(ns, n) for n in names if getattr(ns, n) is not None}


def parse_map_options(words: list[str]) -> dict[str, Any]:
    """The options of `%flow map NAME DATA` as `Flow.map_file` keywords."""
    p = _Parser(prog="%flow map", add_help=False, allow_abbrev=False)
    add_map_options(p)
    return map_options(p.parse_args(words))


_WORD_SETTINGS = frozenset(("sandbox", "validate"))


def _value(text: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_assignments(words: list[str]) -> dict[str, Any]:
    """`["k=2", "model=gpt-4o-mini"]` -> {"k": 2, "model": "gpt-4o-mini"} (literals parsed)."""
    out = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"%flow config takes key=value pairs, not {word!r}; "
                              "e.g. %flow config k=2 model=gpt-4o-mini")
        key = key.strip()
        # "none" is a word of these settings (sandbox=none opts out of isolation), not None
        out[key] = value.strip() if key in _WORD_SETTINGS else _value(value.strip())
    return out


# ---------------------------------------------------------------------------- interpolation
def _lookup(node: ast.AST, ns: Mapping[str, Any], source: str) -> Any:
    if isinstance(node, ast.Name):
        if node.id not in ns:
            raise ConfigError(f"{{{{{source}}}}} in the cell: {node.id!r} is not defined in the "
                              "notebook; define it, or use --no-interpolate to keep {{...}} as text")
        return ns[node.id]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_lookup(node.operand, ns, source)
    if isinstance(node, ast.Attribute):
        return getattr(_lookup(node.value, ns, source), node.attr)
    if isinstance(node, ast.Subscript):
        return _lookup(node.value, ns, source)[_lookup(node.slice, ns, source)]
    if isinstance(node, ast.Slice):
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if p is None else _lookup(p, ns, source) for p in parts))
    raise ConfigError(f"{{{{{source}}}}} in the cell is not a name, attribute or index; put the "
                      "value in a variable first, or use --no-interpolate")


_MAX_EXPRESSION = 300   # longer is not a variable reference; deep nesting would recurse


def _evaluate(source: str, ns: Mapping[str, Any]) -> Any:
    """The value of one `{{...}}`; any failure, whatever the user's objects raise, is one
    ConfigError line (a slice step of 0, a property that raises, deep nesting)."""
    expr = source.strip()
    shown = "{{" + one_line(expr, 60) + "}}"
    if len(expr) > _MAX_EXPRESSION:
        raise ConfigError(f"{shown} in the cell is {len(expr):,} characters long, not a name or "
                          "index; put the value in a variable, or use --no-interpolate")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ConfigError(f"{shown} in the cell is not a Python name or index; "
                          "use --no-interpolate to keep {{...}} as text") from None
    try:
        return _lookup(tree.body, ns, one_line(expr, 60))
    except ConfigError:
        raise
    except Exception as exc:   # the user's objects may raise anything; the cell says which
        raise _value_error(shown, exc) from None


def _text(value: Any, source: str) -> str:
    """str(value) for the task; a huge int or a __str__ that raises is one line too."""
    try:
        return str(value)
    except Exception as exc:
        raise _value_error("{{" + one_line(source.strip(), 60) + "}}", exc) from None


def _value_error(shown: str, exc: Exception) -> ConfigError:
    return ConfigError(f"{shown} in the cell: {type(exc).__name__}: {one_line(exc)}; fix the "
                       "value, or use --no-interpolate to keep {{...}} as text")


_TABLES = ("pandas.DataFrame", "pandas.Series")


def interpolate(text: str, ns: Mapping[str, Any], tables: dict[str, Any] | None = None) -> str:
    """Fill `{{name}}`, `{{Out[3]}}`, `{{d['key']}}`, `{{obj.attr}}` from `ns`.

    Only names, attributes, indexes and slices are evaluated (jupysql's `{{var}}`
    convention, without running arbitrary code from a task). Single braces stay as they
    are, because tasks quote code and JSON. With `tables` (a dict), a DataFrame or Series
    is not printed into the task: it goes into `tables` under a name made from the
    expression (it becomes an input file of the run) and the task names that file.
    """
    def fill(m: re.Match) -> str:
        value = _evaluate(m.group(1), ns)
        kind = f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"
        if tables is not None and kind in _TABLES:
            name = re.sub(r"\W+", "_", m.group(1).strip()).strip("_") or "table"
            tables[name] = value
            return f"the {kind.split('.')[1]} `{name}` (input file {name}.csv)"
        return _text(value, m.group(1))

    return _TEMPLATE.sub(fill, text)


def single_brace_names(text: str, ns: Mapping[str, Any], skip: Any = ()) -> list[str]:
    """Names written `{name}` (one brace) in `text` that are variables in `ns`, in order,
    each once; private names and those in `skip` left out."""
    out: list[str] = []
    for name in _SINGLE.findall(text):
        if name in ns and not name.startswith("_") and name not in skip and name not in out:
            out.append(name)
    return out
