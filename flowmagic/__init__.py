"""flowmagic: plan a task as a graph of subtasks, run it in parallel, steer it, export it.

Heavy modules load on first use, so `%load_ext flowmagic` stays fast.
"""

from __future__ import annotations

from typing import Any

from ._internal import outputs as _outputs
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

def __getattr__(name: str) -> Any:
    # Each import is a plain statement inside the function, so `lint-imports` sees every
    # arrow from the package to its layers and `import flowmagic` stays light.
    if name in ("LLM", "Reply", "get_llm"):
        from .llm import client as module
    elif name in ("Store", "get_store"):
        from . import store as module
    elif name in ("Workflow", "Node"):
        from .model import graph as module
    elif name in ("Status", "RunState"):
        from .model import status as module
    elif name == "Settings":
        from . import settings as module
    elif name in ("Flow", "plan", "aplan", "load"):
        from . import flow as module
    elif name == "tool":
        from .engine import tools as module
    elif name in ("orchestrate", "aorchestrate"):
        from .orchestrator import hub as module
    elif name in ("trials", "atrials"):
        from .evaluate import trials as module
    elif name == "evaluate":   # the subpackage ("from . import" would ask this function again)
        import flowmagic.evaluate
        return flowmagic.evaluate
    else:
        raise AttributeError(f"module 'flowmagic' has no attribute {name!r}")
    return getattr(module, name)


def _load_front_end() -> None:
    from . import jupyter  # noqa: F401 - importing it registers IPython's display


# The layers below show notebook outputs through `_internal.outputs`; the front end that
# displays them sits above them all, so it is registered here, where the layers are joined.
_outputs.on_demand(_load_front_end)


def load_ipython_extension(ipython) -> None:
    from .jupyter.magics import load_ipython_extension as load
    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .jupyter.magics import unload_ipython_extension as unload
    unload(ipython)
