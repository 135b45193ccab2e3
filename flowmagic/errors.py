"""The exceptions flowmagic raises for things a user can fix.

Every class here derives from `FlowError`; the magics and the CLI catch only
`FlowError` and print its message as one line. Anything else is a bug and keeps
its traceback.
"""

__all__ = [
    "FlowError",
    "ConfigError",
    "EndpointError",
    "ModelOutputError",
    "TruncatedError",
    "OffTopicError",
    "PlanError",
    "NodeError",
    "BudgetError",
    "StoreError",
    "SandboxError",
    "WorkspaceError",
    "write_error",
]


class FlowError(Exception):
    """Base class: the message is one line that says what was wrong and what to do."""


class ConfigError(FlowError):
    """No usable endpoint, a malformed URL, an unknown model id, a bad setting."""


class EndpointError(FlowError):
    """The endpoint refused, failed or timed out after the retries allowed."""


class ModelOutputError(FlowError):
    """The model answered, but not with what was asked (no JSON, wrong shape)."""


class TruncatedError(ModelOutputError):
    """The model's answer was cut off (length limit); it is never completed by guessing."""


class PlanError(FlowError):
    """A plan that cannot be turned into a workflow, even after repair."""


class OffTopicError(PlanError):
    """A plan that copies the prompt's example or is not about the task."""


class NodeError(FlowError):
    """An unknown node id, or an action that does not apply to the node's state."""


class BudgetError(FlowError):
    """A run would go, or went, beyond its budget."""


class StoreError(FlowError):
    """The SQLite store cannot be opened or is from a newer flowmagic."""


class SandboxError(FlowError):
    """Generated code could not be run in the sandbox."""


class WorkspaceError(FlowError):
    """A file name that leaves the workspace or that the file system refuses, or a file
    flowmagic will not read there (a symlink, a FIFO, a socket, a device, too big)."""


def write_error(path, exc: OSError) -> ConfigError:
    """The one line for a file flowmagic could not write (a folder, no permission, full)."""
    why = exc.strerror or type(exc).__name__
    return ConfigError(f"cannot write {path} ({why}); choose another path, or make its folder "
                       "writable")
