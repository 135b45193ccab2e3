"""Optional dependencies: a module of an extra, or one line naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ConfigError

__all__ = ["require", "missing"]


def missing(module: str, extra: str, what: str) -> ConfigError:
    """The one line for `what` when `module` (of the extra `extra`) is not installed."""
    top = module.split(".")[0]
    return ConfigError(f"{what} needs {top}, which is not installed: "
                       f"pip install \"flowmagic[{extra}]\" (or pip install {top})")


def require(module: str, extra: str, what: str) -> ModuleType:
    """`module` imported, or a ConfigError naming the extra that brings it (a module that is
    installed but fails to import for another reason raises as it is: that is not a missing
    extra)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == module.split(".")[0]:
            raise missing(module, extra, what) from None
        raise
