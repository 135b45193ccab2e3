"""Running a workflow: the scheduler (which node runs when), the node runner (one node's
attempts), the answer's code (answer_code: files saved, Python run in the sandbox),
validation, the sandbox, tools and the tool loop, the planner and plan selection, the
updater and the repair moves."""
