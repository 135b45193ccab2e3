"""`Tools`: the Python functions a flow's nodes may call, the few offered to one node, and the
calls made.

The choice itself is the run core's `ToolChoice` (engine/tool_choice.py); the calls are read
from the store.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Tools"]


class Tools:
    """A Flow's tools: `tools` (settable), `chosen_tools`, `tools_for`, `tool_calls`. Mixed
    into `Flow`: it asks the flow's `core.tools` and `store`."""

    @property
    def tools(self) -> list:
        """The functions nodes may call: those set here, else every @flowmagic.tool."""
        return self.core.tools.all()

    @tools.setter
    def tools(self, value: Any) -> None:
        self.core.tools.set(value)

    @property
    def chosen_tools(self) -> list | None:
        """The tools set on this flow, or None when it offers every @flowmagic.tool (a copy
        of the flow elsewhere, a Dask worker say, then offers that process's tools)."""
        chosen = self.core.tools.chosen
        return None if chosen is None else list(chosen)

    def tools_for(self, node_id: str) -> list:
        """The tools offered to a node: the `tools_top_n` most similar to its requirement."""
        return self.core.tools.for_requirement(self.workflow.node(node_id).requirement,
                                               self.settings)

    def tool_calls(self, node_id: str | None = None) -> list[dict]:
        """Every tool call of this run (or of one node): tool, arguments, result, duration, error."""
        return self.store.tool_calls(self.run_id, node_id)
