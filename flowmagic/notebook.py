"""Kept for notebooks exported before the layer folders, and for the tutorials: they import
`show_result`, `show_drawings`, `load_cache`, `export`, ... from `flowmagic.notebook`.
The code lives in `flowmagic.ops.export` (and the replay in `flowmagic.ops.replay`)."""

from .ops.export import (MAGICS, NBVAL_IGNORE, RECORD_FORMAT, build, drawing_bundles, export,
                         handle_flow_node, handle_flow_plan, handle_flow_record, load_cache,
                         plan_json, save_cache, show_drawings, show_result)

__all__ = ["export", "build", "plan_json", "drawing_bundles", "show_result", "show_drawings",
           "handle_flow_plan", "handle_flow_record", "handle_flow_node", "load_cache",
           "save_cache", "MAGICS", "NBVAL_IGNORE", "RECORD_FORMAT"]
