"""`Flow`, the user's facade, and the ways to get one (`plan`, `aplan`, `load`,
`flow_from_plan`).

One module a concern of a Flow: `facade` (the class: its parts and record), `running`,
`steering`, `readings`, `tools`, `operations` (what ops/ does on a whole flow), and
`construction` (planning a task, loading a run). This folder sits above ops/ and below the
front ends (see pyproject.toml's layer contracts).
"""

from ..settings import DEFAULTS, Settings
from .construction import aplan, flow_from_plan, load, plan, say_where_code_cannot_run
from .facade import Flow

__all__ = ["Flow", "plan", "aplan", "load", "flow_from_plan", "DEFAULTS", "Settings"]
