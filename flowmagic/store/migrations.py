"""The store's schema, one numbered function a migration, in the order they run.

`Store` runs those not yet recorded in its `_migrations` table, each in a transaction of
its own, and records each by its function's name (simonw/llm's scheme). A change to the
schema is a new function at the end, never an edit of one that shipped: a store any earlier
version made is then brought up to date by running the ones it lacks.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

__all__ = ["MIGRATIONS", "m001_initial", "m002_tools", "m003_map_inputs", "m004_run_state",
           "m005_cached_tokens"]


def _script(db: sqlite3.Connection, sql: str) -> None:
    # executescript() would COMMIT first; one statement at a time stays in our transaction.
    for statement in sql.split(";"):
        if statement.strip():
            db.execute(statement)


# The first schema: calls, the cache, runs, their nodes, events and updates (the longest
# script; byte for byte as shipped).
_INITIAL = """
        CREATE TABLE calls (
            id INTEGER PRIMARY KEY,
            ts REAL NOT NULL,
            endpoint TEXT NOT NULL,
            model TEXT NOT NULL,
            messages TEXT NOT NULL,
            params TEXT NOT NULL,
            response TEXT,
            input_tokens INTEGER,
            output_tokens INTEGER,
            latency_s REAL,
            cost_usd REAL,
            cache_key TEXT,
            cached INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            run_id TEXT,
            node_id TEXT,
            purpose TEXT
        );
        CREATE INDEX calls_run ON calls(run_id);
        CREATE TABLE cache (
            key TEXT PRIMARY KEY,
            payload TEXT NOT NULL,
            created REAL NOT NULL
        );
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            name TEXT,
            task TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            status TEXT NOT NULL,
            workflow TEXT NOT NULL,
            candidates TEXT,
            settings TEXT,
            result TEXT
        );
        CREATE TABLE nodes (
            run_id TEXT NOT NULL REFERENCES runs(id),
            node_id TEXT NOT NULL,
            data TEXT NOT NULL,
            updated REAL NOT NULL,
            PRIMARY KEY (run_id, node_id)
        );
        CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            node_id TEXT,
            ts REAL NOT NULL,
            kind TEXT NOT NULL,
            data TEXT
        );
        CREATE INDEX events_run ON events(run_id);
        CREATE TABLE updates (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            ts REAL NOT NULL,
            data TEXT NOT NULL
        );
"""


def m001_initial(db: sqlite3.Connection) -> None:
    _script(db, _INITIAL)


def m002_tools(db: sqlite3.Connection) -> None:
    """Every tool call a node made, and the messages of orchestrator runs."""
    _script(
        db,
        """
        CREATE TABLE tool_calls (
            id INTEGER PRIMARY KEY,
            run_id TEXT,
            node_id TEXT,
            ts REAL NOT NULL,
            tool TEXT NOT NULL,
            arguments TEXT,
            result TEXT,
            duration_s REAL,
            error TEXT,
            round INTEGER,
            protocol TEXT
        );
        CREATE INDEX tool_calls_run ON tool_calls(run_id);
        CREATE TABLE orchestrator (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            ts REAL NOT NULL,
            sender TEXT NOT NULL,
            recipient TEXT NOT NULL,
            kind TEXT NOT NULL,
            content TEXT,
            tokens_in INTEGER,
            tokens_out INTEGER,
            cost_usd REAL,
            cached INTEGER NOT NULL DEFAULT 0,
            call_id INTEGER
        );
        CREATE INDEX orchestrator_run ON orchestrator(run_id);
        """
    )


def m003_map_inputs(db: sqlite3.Connection) -> None:
    """The inputs a distributed map finished, by fingerprint (workflow, settings, input), so
    a map started again skips them."""
    _script(
        db,
        """
        CREATE TABLE map_inputs (
            fingerprint TEXT PRIMARY KEY,
            run_id TEXT,
            created REAL NOT NULL,
            item TEXT NOT NULL
        );
        """
    )


def m004_run_state(db: sqlite3.Connection) -> None:
    """A run's status, last change and result in a small row of their own: changing them
    rewrote the whole `runs` row with its workflow JSON (3 MB at 10,000 nodes). A run
    without a row here (one older flowmagic wrote) has them in `runs` still."""
    _script(
        db,
        """
        CREATE TABLE run_state (
            run_id TEXT PRIMARY KEY,
            status TEXT NOT NULL,
            updated REAL NOT NULL,
            result TEXT
        );
        """
    )


def m005_cached_tokens(db: sqlite3.Connection) -> None:
    """The input tokens of a call that its endpoint served from its prompt cache (OpenAI's
    `prompt_tokens_details.cached_tokens`, a local server's reused prefix): they are billed
    at a cached rate, and evaluated / sent is how much of the prompt the server computed."""
    db.execute("ALTER TABLE calls ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [m001_initial, m002_tools,
                                                           m003_map_inputs, m004_run_state,
                                                           m005_cached_tokens]
