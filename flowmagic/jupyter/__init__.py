"""The Jupyter front end: the magics, the widget panel, the slimming panel, the chat view.
Every button is one call on a `Flow`; no logic lives here that the Python API lacks."""
