"""The AOV model, pure: `Workflow` / `Node` (graph), plan parsing and repair (plans), metrics,
update merge, label similarity. Imports nothing from the layers above and calls no model."""
