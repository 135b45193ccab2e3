"""What the commands share about their arguments: the flow settings of their options and
`--set`, the planning options, and output paths checked (and written) with one line on
failure, before any paid call."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, write_error

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["settings_from", "planning_options", "writable_folder", "writable_file", "write_text"]


def settings_from(pairs: list[str] | None, **options: Any) -> Settings:
    """The flow settings of the command's own options (those not None) with `--set key=value`
    on top (typed on purpose, where an option may be its default), checked once: an unknown
    key or a bad value is one line, before any model call."""
    from ..magic_grammar import parse_assignments
    from ..settings import Settings

    try:
        given = parse_assignments(list(pairs)) if pairs else {}
    except ConfigError:
        raise ConfigError(f"--set takes key=value, not {' '.join(pairs)!r}") from None
    return Settings(**{**{k: v for k, v in options.items() if v is not None}, **given})


def planning_options(p: argparse.ArgumentParser) -> None:
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


def writable_folder(folder: Path) -> Path:
    """`folder`, made if need be, or one line now: before any paid planning call."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc) from None
    if not os.access(folder, os.W_OK):
        raise write_error(folder, PermissionError(13, "Permission denied"))
    return folder


def writable_file(path: str | None) -> None:
    if path:
        if Path(path).is_dir():
            raise write_error(path, IsADirectoryError(21, "it is a folder"))
        writable_folder(Path(path).parent)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise write_error(path, exc) from None
