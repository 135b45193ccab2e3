"""Running a workflow: the executor (scheduling), the node runner, validation, the sandbox,
tools and the tool loop, the planner, the updater and the repair moves."""
