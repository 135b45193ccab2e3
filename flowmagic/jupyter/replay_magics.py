"""The cell magics of an exported notebook: `%%flow_plan`, `%%flow_record`, `%%flow_node` and
`%%flow_code`. Each reads its line (shlex, argparse that raises instead of exiting the
kernel), finds the flow it names in the notebook and calls the replay
(`flowmagic.ops.replay`, `flowmagic.ops.codecells`), where what a cell does is decided.
The flow and the replay are imported when a cell first runs, so `%load_ext` stays light.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Callable

from ..errors import ConfigError
from ..magic_grammar import check_name

__all__ = ["HANDLERS", "handle_flow_plan", "handle_flow_record", "handle_flow_node",
           "handle_flow_code"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):   # argparse would exit the kernel's process
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")   # one line
        raise ConfigError(f"{self.prog}: {message}; usage: {usage}")


def _node_parser(prog: str) -> _Parser:
    p = _Parser(prog=prog, add_help=False)
    p.add_argument("name")
    p.add_argument("node")
    p.add_argument("--after", default="")
    p.add_argument("--agent", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--allow-calls", dest="allow_calls", action="store_true")
    return p


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise ConfigError(f"cannot read the magic's line ({exc}); check its quotes") from None


def _name_and_allow(line: str, magic: str, body: str) -> tuple[str, bool]:
    args = _split(line)
    allow = "--allow-calls" in args
    args = [a for a in args if a != "--allow-calls"]
    if len(args) != 1:
        raise ConfigError(f"usage: %%{magic} NAME [--allow-calls], then {body} in the cell")
    return args[0], allow


def _user_flow(shell, name: str):
    from ..flow import Flow

    flow = shell.user_ns.get(name)
    if not isinstance(flow, Flow):
        raise ConfigError(f"no flow named {name!r}; run its %%flow_plan {name} cell first")
    return flow


def handle_flow_plan(shell, line: str, cell: str | None) -> None:
    """`%%flow_plan NAME`: make the Flow from the JSON body and bind it to NAME."""
    from ..flow import flow_from_plan
    from ..model.answers import plan_from_notebook
    from ..ops import replay

    name, allow = _name_and_allow(line, "flow_plan", "the plan as JSON")
    name = check_name(name) or name
    # The cell can be edited like any text: read as strictly as a model's plan (safe names,
    # no state but a prune), so what it names can be written on a magic line again.
    plan = replay.json_body(cell, "flow_plan")
    if not isinstance(plan, dict) or "nodes" not in plan:
        plan = None   # plan_parts says what the body should be
    flow = flow_from_plan(plan and plan_from_notebook(plan), name, shell.user_ns)
    shell.user_ns[name] = flow
    replay.session(flow).allow_calls = allow
    print(replay.plan_summary(flow))


def handle_flow_record(shell, line: str, cell: str | None) -> None:
    """`%%flow_record NAME`: what every node of NAME produced when it was exported."""
    from ..ops import replay

    name, allow = _name_and_allow(line, "flow_record", "the record as JSON")
    replay.use_record(_user_flow(shell, name), cell, allow)


def handle_flow_node(shell, line: str, cell: str | None) -> None:
    """`%%flow_node NAME NODE --after A,B --agent ROLE [--model M]`: replay or run one node."""
    from ..ops import replay

    args = _node_parser("%%flow_node").parse_args(_split(line))
    replay.replay_node(_user_flow(shell, args.name), args.node, cell, after=args.after,
                       agent=args.agent, model=args.model, allow=args.allow_calls)


def handle_flow_code(shell, line: str, cell: str | None) -> None:
    """`%%flow_code NAME NODE [--execute]` (a code node's recorded run, or its body run
    again in the flow's sandboxed session) and `%%flow_code NAME --prelude [--execute]`."""
    from ..ops import codecells

    words = _split(line)
    if "--prelude" in words:
        names = [w for w in words if w not in ("--prelude", "--execute")]
        if len(names) != 1:
            raise ConfigError("usage: %%flow_code NAME --prelude [--execute], then the "
                              "prelude's code")
        codecells.prelude_cell(_user_flow(shell, names[0]), cell, execute="--execute" in words)
        return
    parser = _node_parser("%%flow_code")
    parser.add_argument("--execute", action="store_true")
    parser.add_argument("--start", action="store_true")   # the working start's cell
    parser.add_argument("--seq", type=int, default=None)  # an earlier run the session kept
    args = parser.parse_args(words)
    codecells.code_cell(_user_flow(shell, args.name), args.node, cell, execute=args.execute,
                        start=args.start, seq=args.seq)


HANDLERS: dict[str, Callable[[object, str, str | None], None]] = {
    "flow_plan": handle_flow_plan, "flow_record": handle_flow_record,
    "flow_node": handle_flow_node, "flow_code": handle_flow_code}
