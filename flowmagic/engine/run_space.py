"""`RunSpace`: where a run's files and code live: its workspace folder, made when first
needed, and its sandboxed Python session, started when first needed.

A run with no input (none added, no workdir, no folder left by an earlier session) makes no
folder for its prompts: `inputs()` answers without making one.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from .run_record import RunRecord

__all__ = ["RunSpace"]


class RunSpace:
    def __init__(self, home: Path, record: RunRecord):
        self.home = home   # the store's folder: runs/<run id>/workspace is under it
        self.record = record
        self._workspace = None
        self._session = None
        self._no_folder = False   # this run has no workspace folder yet (see inputs)

    @property
    def workspace(self):
        """The folder of this run's inputs and files (made when first needed)."""
        if self._workspace is None:
            from .workspace import Workspace
            settings = self.record.settings
            self._workspace = Workspace.for_run(self.home, self.record.run_id, settings.workdir,
                                                settings.workdir_writes)
        return self._workspace

    def _folder(self) -> Path:
        """Where this run's workspace is (or would be) when no workdir is set."""
        return self.home / "runs" / self.record.run_id / "workspace"

    def files(self) -> list[str]:
        """The files in the workspace now: inputs, deliverables, what code wrote, figures."""
        made = self._workspace is not None or self.record.settings.workdir or self._folder().is_dir()
        return self.workspace.files() if made else []

    def inputs(self) -> list:
        """The declared inputs, without making the workspace folder: a run with none needs no
        folder for its prompts, and asks for every node."""
        if self._workspace is None and not self.record.settings.workdir:
            if self._no_folder or not self._folder().is_dir():
                self._no_folder = True   # (adding inputs makes the workspace, which is seen first)
                return []
        return self.workspace.inputs

    def session(self):
        """The run's sandboxed Python session, where its nodes' code runs one cell at a time
        (started when first needed; after a restart it runs the recorded cells again)."""
        if self._session is None:
            from .session import Session
            self.adopt(Session(self.workspace, sandbox=self.record.settings.sandbox))
        return self._session

    def adopt(self, session) -> None:
        """Take `session` (a Session on this run's workspace folder, started while the run
        was planned: `flowmagic.aplan(start_session=True)`) as the run's session, its
        workspace as the run's, and the run's record as its history from now on."""
        from .session import recorded_cells
        record = self.record   # the session's history reads the run, never its flow

        def history() -> list[dict]:
            return recorded_cells(record.workflow)

        session.history = history
        if self._workspace is None:
            self._workspace = session.workspace
        self._session = session
        weakref.finalize(self, session.close)   # it ends with its run's flow

    def close(self) -> None:
        """End the session and every process it started (a later code run starts a new one,
        which first runs the recorded cells again)."""
        if self._session is not None:
            self._session.close()

    def add(self, inputs: Any) -> list:
        """Declare inputs: file paths, or {name: DataFrame / value / path}; see Workspace.add."""
        return self.workspace.add(inputs)
