"""What a run's agents said and did besides model calls: tool calls, and the messages of an
orchestrator's transcript."""

from __future__ import annotations

import time
from typing import Any

from .database import Database
from .encoding import dumps

__all__ = ["Transcripts"]


class Transcripts(Database):
    """The tool calls and orchestrator transcripts of a `Store`."""

    def add_tool_call(self, run_id: str | None, node_id: str | None, *, tool: str,
                      arguments: Any = None, result: str | None = None,
                      duration_s: float | None = None, error: str | None = None,
                      round: int | None = None, protocol: str | None = None) -> int:  # noqa: A002
        cur = self._execute(
            "INSERT INTO tool_calls (run_id, node_id, ts, tool, arguments, result, duration_s,"
            " error, round, protocol) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (run_id, node_id, time.time(), tool, dumps(arguments), result, duration_s, error,
             round, protocol), doing="record the tool call")
        return int(cur.lastrowid)

    def tool_calls(self, run_id: str, node_id: str | None = None) -> list[dict]:
        sql, args = "SELECT * FROM tool_calls WHERE run_id = ?", [run_id]
        if node_id is not None:
            sql += " AND node_id = ?"
            args.append(node_id)
        rows = self._query(sql + " ORDER BY id", tuple(args))
        for row in rows:
            row["arguments"] = self._loads(row["arguments"] or None, "tool_calls",
                                           f"id = {row['id']}")
        return rows

    def add_message(self, run_id: str, message: dict) -> int:
        """One orchestrator transcript message (seq, turn, sender, recipient, kind, ...)."""
        m = message
        cur = self._execute(
            "INSERT INTO orchestrator (run_id, seq, turn, ts, sender, recipient, kind, content,"
            " tokens_in, tokens_out, cost_usd, cached, call_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, m["seq"], m["turn"], m.get("time") or time.time(), m["sender"],
             m["recipient"], m.get("kind") or "message", m.get("content"),
             m.get("tokens_in") or 0, m.get("tokens_out") or 0, m.get("cost_usd") or 0.0,
             int(bool(m.get("cached"))), m.get("call_id")), doing="record the message")
        return int(cur.lastrowid)

    def transcript(self, run_id: str) -> list[dict]:
        rows = self._query("SELECT * FROM orchestrator WHERE run_id = ? ORDER BY seq, id",
                           (run_id,))
        for row in rows:
            row["cached"] = bool(row["cached"])
            row["time"] = row.pop("ts")
        return rows
