"""`%load_ext flowmagic`: the `%%flow` cell magic and the `%flow` subcommands.

One `Magics` class with one entry point (`flow`) that dispatches to `handle_*` methods;
the grammar lives in `parsers.py`. A `%%flow` cell plans its body (the task, `{{var}}`
filled from the notebook), binds the `Flow` to NAME and shows the drawing with the
control panel; `--run` / `--step` also start it as a task on the kernel's loop, so the
cell returns at once and the panel's buttons stay live.

Defaults come, weakest first, from flowmagic's own, `[tool.flowmagic]` in the project's
pyproject.toml, `%config FlowMagics.default_model = ...`, `%flow config key=value`, and
the cell's options. Errors flowmagic raises (`FlowError`) become IPython's `UsageError`:
one line on stderr, and the cell fails, so Run All and papermill stop at a broken flow;
`--debug` (or `%config FlowMagics.debug = True`) shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.display import display
from traitlets import Bool, Dict, Enum, Float, Int, TraitError, Unicode

from ..view.display import Report, table
from ..errors import BudgetError, ConfigError, FlowError
from ..magic_grammar import (SUBCOMMANDS, Command, command_usage, flow_help, flow_option_strings,
                       interpolate,
                       parse_assignments, subcommand_help,
                       parse_command, parse_flow_line, parse_map_options, parse_slim_options,
                       single_brace_names)
from ..model.status import AnswerState
from .replay_magics import HANDLERS

if TYPE_CHECKING:   # imported when a flow is made: %load_ext stays light
    from ..settings import Settings

__all__ = ["FlowMagics", "Report", "load_ipython_extension", "unload_ipython_extension",
           "pyproject_settings"]

# %%flow option -> trait; everything else in flow.DEFAULTS goes to the `settings` trait.
_TRAITS = {"k": "default_k", "model": "default_model", "strategy": "default_strategy",
           "update": "default_update", "validate": "default_validate",
           "concurrency": "default_concurrency", "context": "default_context",
           "budget_usd": "default_budget_usd", "mode": "default_mode"}
_KEY_VARS = ("OPENAI_API_KEY", "FLOWMAGIC_API_KEY")


def pyproject_settings(start: Path | None = None) -> tuple[dict, Path | None]:
    """`[tool.flowmagic]` of the nearest pyproject.toml at or above `start` (the cwd)."""
    try:
        import tomllib
    except ImportError:   # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {}, None
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        path = folder / "pyproject.toml"
        if path.is_file():
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{path} cannot be read as TOML ({exc}); fix it or "
                                  "remove its [tool.flowmagic] table") from None
            table = data.get("tool", {}).get("flowmagic")
            return (dict(table), path) if table else ({}, None)
    return {}, None


def _fail(exc: FlowError) -> UsageError:
    """The one line a user error shows (no API key in it); as a UsageError it also fails
    the cell."""
    from ..llm.endpoints import scrub
    return UsageError(f"flowmagic: {scrub(str(exc))}")


def _run_blocking(make: Callable[[], Any], llm: Any = None) -> Any:
    """Await `make()` to the end (a cell runs inside the kernel's loop: see aio)."""
    from ..llm.client import run_closing   # on first use: %load_ext loads no openai
    return run_closing(make, llm, name="flowmagic-plan")


@magics_class
class FlowMagics(Magics):
    """`%%flow` plans and shows a workflow; `%flow SUBCOMMAND` steers it (see `%flow help`)."""

    default_k = Int(None, allow_none=True, help="candidate plans per %%flow cell (--k; None: 3, "
                    "or a server you run's slots when fewer)").tag(config=True)
    default_model = Unicode(None, allow_none=True,
                            help="model id for planning and nodes (--model)").tag(config=True)
    default_strategy = Unicode("balanced", help="planning strategy (--strategy)").tag(config=True)
    default_update = Unicode("on-failure", help="update strategy (--update)").tag(config=True)
    default_validate = Unicode("none", help="validation of outputs (--validate)").tag(config=True)
    default_concurrency = Int(8, help="nodes running at once (--concurrency)").tag(config=True)
    default_context = Enum(("parents", "ancestors"), "parents",
                           help="which results a node sees (--context)").tag(config=True)
    default_budget_usd = Float(None, allow_none=True,
                               help="USD a run may spend (--budget-usd)").tag(config=True)
    default_mode = Enum(("plan-only", "run", "step"), "plan-only",
                        help="what a %%flow cell does after planning").tag(config=True)
    settings = Dict(help="other Flow settings, e.g. {'max_tokens': 2048, 'seed': 1}").tag(config=True)
    debug = Bool(False, help="show tracebacks instead of one-line errors").tag(config=True)

    def __init__(self, shell=None, **kwargs: Any):
        super().__init__(shell=shell, **kwargs)
        self.pyproject: Path | None = None
        self._brace_warned: set[str] = set()
        try:
            given, self.pyproject = pyproject_settings()
            configured = set(self.config.get("FlowMagics", {})) if self.config else set()
            self._apply(given, skip=configured, source=f"[tool.flowmagic] in {self.pyproject}")
        except FlowError as exc:   # a broken pyproject.toml must not stop the notebook
            print(_fail(exc), file=sys.stderr)

    # -- the entry point ---------------------------------------------------------------
    @line_cell_magic
    def flow(self, line: str, cell: str | None = None):
        """%%flow [NAME] [options]: plan the cell's task; %flow SUBCOMMAND: see %flow help."""
        debug = self.debug or "--debug" in line.split()
        try:
            if cell is None:
                return self.handle_command(parse_command(line))
            return self.handle_cell(line, cell)
        except FlowError as exc:
            if debug:
                raise
            raise _fail(exc) from None

    def handle_command(self, command: Command):
        return getattr(self, f"handle_{command.name}")(*command.args)

    # -- %%flow ------------------------------------------------------------------------
    def handle_cell(self, line: str, cell: str):
        args = parse_flow_line(line)
        if args.help:
            print(flow_help())
            return None
        self._check_free(args.name, args.force)
        tables: dict = {}
        task = interpolate(cell, self.shell.user_ns, tables) if args.interpolate else cell
        if args.interpolate:
            self._warn_single_braces(cell)
        settings = self.flow_settings(args.settings)
        inputs = [*args.inputs, *([tables] if tables else [])] or None
        tools = None
        if args.tools:
            from ..engine.tools import resolve_tools
            tools = resolve_tools(args.tools, self.shell.user_ns)
        if args.kind == "orchestrate":
            return self.handle_orchestrate(args, task, settings, tools)
        from ..flow import aplan

        self._stop_previous(args.name)
        if settings.k is None:   # said in the planning line, so decided here
            from ..engine.planner import default_k
            settings.k = default_k(settings.model)
        progress = self._planning_progress(args.name, settings)
        mode = args.mode or self.default_mode
        flow = _run_blocking(lambda: aplan(task, name=args.name, tools=tools, inputs=inputs,
                                           progress=progress,
                                           start_session=mode != "plan-only", **settings))
        self.shell.user_ns[args.name] = flow
        panel = self._show(flow)
        if mode != "plan-only":
            self._check_budget(flow)
        if mode == "run":
            flow.run()
        elif mode == "step":
            flow.step()
        if panel is not None:
            panel.follow()
        return None

    def handle_orchestrate(self, args, task: str, settings: Settings, tools) -> None:
        """`%%flow NAME --mode orchestrate`: agents solve the task by messages; NAME is the
        Orchestrator (NAME.result, await NAME.wait(), NAME.stop())."""
        from ..orchestrator.hub import Orchestrator

        opts = args.orchestrate
        orch = Orchestrator(task, opts.agents, tools=tools, model=settings.model,
                            budget_s=opts.budget_s, max_turns=opts.max_turns,
                            name=args.name, seed=settings.seed, max_tokens=settings.max_tokens,
                            temperature=settings.temperature)
        self._stop_previous(args.name)
        self.shell.user_ns[args.name] = orch
        if self._in_kernel():
            from .widgets import ChatView
            display(ChatView(orch))   # live: each message as it is stored, a Stop button
            orch.start()
            return None
        outcome = _run_blocking(orch.run)
        print(f"{outcome!r}\n{outcome.answer}")
        return None

    def _planning_progress(self, name: str, settings: Settings) -> Callable[[dict], None]:
        """A line that follows planning: updated in place in a notebook; in a terminal,
        printed when the plans are asked for and when one is chosen."""
        from ..view.display import PlanningLine
        from ..llm.endpoints import resolve

        try:
            embedded = resolve(settings.model)[0].local
        except FlowError:
            embedded = False   # planning itself will say what is wrong with the model
        line = PlanningLine(name, int(settings.k), embedded)
        if self._in_kernel():
            handle = display(line, display_id=True)
            return lambda event: (line.event(event), handle.update(line))
        return lambda event: event["phase"] != "received" and print(line.event(event))

    def _check_free(self, name: str, force: bool) -> None:
        """NAME may hold nothing yet, or an earlier flow or orchestrator; anything else (a
        DataFrame, `get_ipython`, a builtin) is kept unless --force."""
        import builtins

        from ..flow import Flow

        ns = self.shell.user_ns
        value = ns[name] if name in ns else getattr(builtins, name, None)
        ours = (Flow,)
        if "flowmagic.orchestrator" in sys.modules:
            ours += (sys.modules["flowmagic.orchestrator"].Orchestrator,)
        if force or value is None and name not in ns or isinstance(value, ours):
            return
        what = "a builtin" if name not in ns else f"a {type(value).__name__}"
        raise ConfigError(f"{name!r} already holds {what} in this notebook; pick another flow "
                          f"name (%%flow NAME), or add --force to replace it")

    def _stop_previous(self, name: str) -> None:
        """Re-running a cell while its flow still runs: stop the old run first, and say so
        (it would go on calling the model with no panel left to stop it)."""
        old = self.shell.user_ns.get(name)
        if not getattr(old, "busy", False):
            return
        old.stop()
        run = getattr(old, "run_id", None)
        print(f"flowmagic: stopped the earlier run of {name!r}"
              f"{f' ({run})' if run else ''} that was still going; finished nodes are kept "
              f"(flowmagic.load({run or name!r}))")

    def _warn_single_braces(self, cell: str) -> None:
        """`{var}` (jupyter-ai's style) goes to the model as written: say so once per name."""
        names = single_brace_names(cell, self.shell.user_ns, skip=self._brace_warned)
        hidden = getattr(self.shell, "user_ns_hidden", {})
        for name in [n for n in names if n not in hidden]:
            self._brace_warned.add(name)
            print(f"flowmagic: {{{name}}} in the task goes to the model as written, though "
                  f"{name} is a variable here; did you mean {{{{{name}}}}}? (said once)")

    def flow_settings(self, given: dict | None = None) -> Settings:
        """The settings a new flow gets: defaults, then the cell's options; checked here, once
        (an unknown key or a bad value is one line before any model call)."""
        from ..settings import Settings

        out = {key: getattr(self, trait) for key, trait in _TRAITS.items() if key != "mode"}
        return Settings(**{**out, **self.settings, **(given or {})})

    @staticmethod
    def _check_budget(flow) -> None:
        budget = flow.settings.budget_usd
        if budget is None:
            return
        estimate = flow.estimate()["cost_usd"]
        if flow.spent_usd + estimate > float(budget):
            raise BudgetError(
                f"a run of {flow.name!r} is estimated at ${estimate:.4f} (spent so far "
                f"${flow.spent_usd:.4f}), over the budget of ${float(budget):.4f}; raise "
                f"--budget-usd, prune or downgrade nodes, then %flow run {flow.name}")

    def _in_kernel(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    def _show(self, flow):
        """The panel in a notebook (returned); a few lines of text in a terminal."""
        if self._in_kernel():
            from .widgets import Panel
            panel = Panel(flow)
            panel.show()
            return panel
        from ..view.display import describe
        print(describe(flow))
        return None

    # -- %flow subcommands ---------------------------------------------------------------
    def _flows(self) -> dict:
        from ..flow import Flow
        return {k: v for k, v in self.shell.user_ns.items()
                if isinstance(v, Flow) and not k.startswith("_")}

    def flow_names(self) -> list[str]:
        """The flows of this notebook, by variable name (for tab completion)."""
        return sorted(self._flows())

    def _flow(self, name: str):
        flows = self._flows()
        if name not in flows:
            known = ", ".join(flows) or "none yet (make one with a %%flow NAME cell)"
            raise ConfigError(f"no flow named {name!r}; flows in this notebook: {known}")
        return flows[name]

    def handle_help(self, subcommand: str | None = None) -> None:
        print(subcommand_help(subcommand) if subcommand else command_usage())

    def handle_list(self) -> Report:
        from ..view.display import list_report
        from ..store import get_store

        return list_report(self._flows(), get_store().list_runs(10))

    def handle_show(self, name: str) -> None:
        self._show(self._flow(name))

    def _started(self, flow, what: str) -> None:
        if flow.busy:
            print(f"flow {flow.name!r}: {what} started; %flow show {flow.name} for the panel")
        else:
            from ..view.render import summary
            print(summary(flow) + (f" ({flow.message})" if flow.message else ""))

    def handle_run(self, name: str) -> None:
        flow = self._flow(name)
        self._started(flow.run(), "run")

    def handle_step(self, name: str) -> None:
        flow = self._flow(name)
        if not flow.busy and not flow.workflow.ready():
            from ..view.render import summary
            print(f"{summary(flow)}; no node is ready to run")
            return
        self._started(flow.step(), "step")

    def handle_stop(self, name: str) -> None:
        flow = self._flow(name)
        was = flow.busy
        flow.stop()
        print(f"flow {name!r}: " + ("stopping; running nodes go back to pending" if was
                                    else "nothing is running"))

    def handle_prune(self, name: str, node: str) -> None:
        flow = self._flow(name)
        flow.prune(node)
        print(f"flow {name!r}: pruned {node!r}; {flow.total()} nodes left")

    def handle_unprune(self, name: str, node: str) -> None:
        flow = self._flow(name)
        flow.unprune(node)
        print(f"flow {name!r}: {node!r} is back ({flow.workflow.nodes[node].status}); "
              f"{flow.total()} nodes")

    def handle_downgrade(self, name: str, node: str, model: str) -> None:
        flow = self._flow(name)
        flow.downgrade(node, model)
        print(f"flow {name!r}: {node!r} runs on {model} from now on")

    def handle_rerun(self, name: str, node: str) -> None:
        flow = self._flow(name)
        self._started(flow.rerun(node), f"rerun of {node!r}")

    def handle_edit(self, name: str, node: str, requirement: str) -> None:
        flow = self._flow(name)
        flow.edit(node, requirement)
        print(f"flow {name!r}: {node!r} has a new requirement; it runs again on the next run")

    def handle_cost(self, name: str) -> Report:
        from ..view.display import cost_report
        return cost_report(self._flow(name))

    def handle_timeline(self, name: str) -> Report:
        from ..view.display import timeline_report
        return timeline_report(self._flow(name))

    def _orchestration(self, name: str):
        """The outcome of the orchestrator (or orchestration) NAME, None when NAME is neither."""
        module = sys.modules.get("flowmagic.orchestrator.protocol")   # not loaded: none can exist
        value = self.shell.user_ns.get(name)
        outcome = getattr(value, "result", value)
        if module is None or not isinstance(outcome, module.Orchestration):
            return None
        if outcome.status == AnswerState.RUNNING:
            raise ConfigError(f"orchestration {name!r} has not finished; wait for its answer "
                              f"(await {name}.wait(), or {name}.stop()), then export it")
        return outcome

    def handle_export(self, name: str, path: str) -> None:
        outcome = self._orchestration(name)
        if outcome is not None:
            print(f"orchestration {name!r}: wrote {outcome.to_notebook(path)}")
            return
        flow = self._flow(name)
        write = getattr(flow, "to_notebook", None)
        if write is None:
            try:
                from ..ops.export import export
            except ImportError:
                raise ConfigError("exporting needs flowmagic.ops.export, which this install "
                                  "lacks; reinstall flowmagic") from None
            write = lambda p: export(flow, p)  # noqa: E731
        result = write(path)
        print(f"flow {name!r}: wrote {result or path}")

    def _probed(self, name: str):
        flow = self._flow(name)
        if flow.probe is None:
            raise ConfigError(f"flow {name!r} has no probe set; attach one first: "
                              f"{name}.attach_probe(examples, scorer)")
        return flow

    def handle_importance(self, name: str) -> Report:
        from ..view.display import importance_report

        flow = self._probed(name)
        return importance_report(_run_blocking(flow.aimportance, flow.llm), run=flow.run_id)

    def handle_slim(self, name: str, *words: str) -> Report:
        """Slim a flow on its probe set; the slimmed flow is bound to NAME_slim."""
        from ..view.display import slim_report
        from .slimpanel import bind_slimmed

        opts = parse_slim_options(list(words))
        flow = self._probed(name)
        slim, report = _run_blocking(lambda: flow.aslim(cheaper=opts.cheaper,
                                                        tau_prune=opts.tau,
                                                        tau_downgrade=opts.tau), flow.llm)
        bound = bind_slimmed(self.shell.user_ns, name, slim)
        return slim_report(report, name, bound, run=flow.run_id)

    def handle_map(self, name: str, data: str, *words: str):
        """Run a flow once per row of a data file (on Dask by default); the result DataFrame."""
        options = parse_map_options(list(words))
        flow = self._flow(name)
        if self._in_kernel() and options["engine"] != "inprocess":
            from IPython.display import display

            from .mapbar import map_progress_bar
            options["progress"] = map_progress_bar(display)
        return flow.map_file(data, **options)

    def handle_eval(self, name: str, gold: str) -> Report:
        from ..evaluate.run import compare_flow, format_scores
        from ..view.safe import preformatted

        flow = self._flow(name)
        scores, record, note = compare_flow(flow, gold)
        labels = {i: n.requirement for i, n in flow.workflow.nodes.items()}
        text = f"flow {name!r} against {gold}\n{format_scores(scores, record, labels)}\n{note}"
        return Report(text, html=preformatted(text), run=flow.run_id)   # labels are model text

    def handle_config(self, *pairs: str) -> Report | None:
        if pairs:
            self._apply(parse_assignments(list(pairs)), source="%flow config")
            return None
        rows = [[key, repr(getattr(self, trait))] for key, trait in _TRAITS.items()]
        rows += [[key, repr(value)] for key, value in self.settings.items()]
        rows.append(["debug", repr(self.debug)])
        text, page = table(["setting", "value"], rows)
        where = f"\n(also read from {self.pyproject})" if self.pyproject else ""
        return Report(text + where, html=page)

    def _apply(self, values: dict, *, skip: set = frozenset(), source: str = "") -> None:
        """Set defaults by short name (k=2) or trait name (default_k=2), all checked first."""
        if not values:
            return
        # the Settings model's own check, so a bad default fails here and not at the next %%flow.
        from ..settings import DEFAULTS, Settings

        traits, extra = {}, dict(self.settings)
        for key, value in values.items():
            trait = _TRAITS.get(key, key if key in _TRAITS.values() or key == "debug" else None)
            if trait is None and key not in DEFAULTS:
                known = ", ".join([*_TRAITS, "debug", *(k for k in DEFAULTS if k not in _TRAITS)])
                raise ConfigError(f"{source}: unknown setting {key!r}; known: {known}")
            if trait in skip:
                continue   # %config FlowMagics.<trait> wins over pyproject.toml
            if trait is None:
                extra[key] = value
            else:
                traits[trait] = value
        merged = {k: traits.get(t, getattr(self, t)) for k, t in _TRAITS.items() if k != "mode"}
        try:
            Settings(**{**merged, **extra})
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        for trait, value in traits.items():
            try:
                setattr(self, trait, value)
            except TraitError as exc:
                raise ConfigError(f"{source}: {trait}={value!r} is not valid "
                                  f"({str(exc).splitlines()[0][:160]})") from None
        self.settings = extra

    def handle_models(self) -> Report:
        from ..view.display import models_report
        return models_report(_KEY_VARS)

    def handle_log(self, n: str = "10") -> Report:
        from ..view.display import log_report
        from ..store import get_store

        try:
            count = int(n)
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(f"%flow log takes a number of calls, 1 or more, not {n[:20]!r}")
        return log_report(get_store().recent_calls(count))


def _notebook_magics(shell, magics: FlowMagics) -> None:
    """`%%flow_plan`, `%%flow_record`, `%%flow_node` and `%%flow_code`: an exported notebook's
    cells (replay_magics.HANDLERS).

    Their lines are written by an export and carry names a model or an endpoint gave, so
    IPython must take them as written: registered with `no_var_expand`, a `{expr}` or `$var`
    on such a line stays text and is never evaluated."""
    for name, handler in HANDLERS.items():
        def magic(line, cell=None, _handler=handler):
            debug = magics.debug or "--debug" in line.split()
            try:
                return _handler(shell, line, cell)
            except FlowError as exc:
                if debug:
                    raise
                raise _fail(exc) from None
        shell.register_magic_function(no_var_expand(magic), magic_kind="cell", magic_name=name)


# `%%flow?` shows this: every option described, then the subcommands
FlowMagics.flow.__doc__ = flow_help()

# the subcommands whose first argument is a flow of the notebook
_TAKES_A_FLOW = {n for n, (args, _) in SUBCOMMANDS.items() if args[:1] == ("NAME",)}


def complete(magics: FlowMagics, line: str) -> list[str]:
    """Tab completion of a `%flow` line: the subcommands, then a flow's name where one goes
    (and a `%%flow` line's options)."""
    words = line.split()
    typing = "" if line.endswith((" ", "\t")) else (words[-1] if len(words) > 1 else "")
    done = words[1:-1] if typing else words[1:]
    if words[0].startswith("%%"):
        options = [o for a in flow_option_strings() for o in a]
        return [o for o in options if o.startswith(typing)] if typing.startswith("-") else []
    if not done:
        return [n for n in SUBCOMMANDS if n.startswith(typing)]
    if len(done) == 1 and done[0] in _TAKES_A_FLOW:
        return [n for n in magics.flow_names() if n.startswith(typing)]
    if len(done) == 1 and done[0] == "help":
        return [n for n in SUBCOMMANDS if n.startswith(typing)]
    return []


def load_ipython_extension(shell) -> None:
    magics = FlowMagics(shell=shell, config=shell.config)
    shell.register_magics(magics)
    shell.configurables.append(magics)
    _notebook_magics(shell, magics)
    completer = lambda _self, event: complete(magics, event.line)   # noqa: E731
    for key in ("%flow", "%%flow"):
        shell.set_hook("complete_command", completer, str_key=key)


def unload_ipython_extension(shell) -> None:
    for magics in [m for m in shell.configurables if isinstance(m, FlowMagics)]:
        shell.configurables.remove(magics)
    registry = shell.magics_manager.magics
    for kind in ("line", "cell"):
        for name in ("flow", *HANDLERS):
            registry[kind].pop(name, None)
