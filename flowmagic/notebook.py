"""Kept for notebooks exported before the layer folders, and for the tutorials: they import
`show_result`, `show_drawings`, `load_cache`, `export`, ... from `flowmagic.notebook`.
The code lives in `flowmagic.ops.export` (and the replay in `flowmagic.ops.replay`; the
cell magics of an exported notebook in `flowmagic.jupyter.replay_magics`)."""

from .ops.export import (NBVAL_IGNORE, RECORD_FORMAT, build, drawing_bundles, export,
                         load_cache, plan_json, save_cache, show_drawings, show_result)

__all__ = ["export", "build", "plan_json", "drawing_bundles", "show_result", "show_drawings",
           "load_cache", "save_cache", "NBVAL_IGNORE", "RECORD_FORMAT"]
