"""flowmagic: plan a task as a graph of subtasks, run it in parallel, steer it, export it.

Heavy modules load on first use, so `%load_ext flowmagic` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._internal.version import __version__
from .llm.endpoints import configure
from .errors import (BudgetError, ConfigError, EndpointError, FlowError, ModelOutputError,
                     NodeError, PlanError, SandboxError, StoreError, TruncatedError)

__all__ = [
    "__version__", "configure", "LLM", "Reply", "get_llm", "Store", "get_store",
    "Workflow", "Node", "Status", "RunState", "Settings", "Flow", "plan", "aplan", "load", "tool", "evaluate",
    "orchestrate", "aorchestrate", "trials", "atrials",
    "FlowError", "ConfigError", "EndpointError", "ModelOutputError", "TruncatedError",
    "PlanError", "NodeError", "BudgetError", "StoreError", "SandboxError",
    "load_ipython_extension", "unload_ipython_extension",
]

_LAZY = {
    "LLM": "llm.client", "Reply": "llm.client", "get_llm": "llm.client",
    "Store": "store", "get_store": "store",
    "Workflow": "model.graph", "Node": "model.graph",
    "Status": "model.status", "RunState": "model.status", "Settings": "settings",
    "Flow": "flow", "plan": "flow", "aplan": "flow", "load": "flow",
    "tool": "engine.tools",
    "orchestrate": "orchestrator.hub", "aorchestrate": "orchestrator.hub",
    "trials": "ops.trials", "atrials": "ops.trials",
}


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        return importlib.import_module(".evaluate", __name__)
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'flowmagic' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from .jupyter.magics import load_ipython_extension as load
    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .jupyter.magics import unload_ipython_extension as unload
    unload(ipython)
