"""Orchestrator mode (CORAL's star): the engine (hub) and its agents, messages and
protocol (protocol). `flowmagic.orchestrator.start`, `Orchestrator`, ... as before."""

from .hub import Orchestrator, aorchestrate, orchestrate, start
from .protocol import (DEFAULT_AGENTS, ROLES, Agent, Message, Orchestration, as_agents,
                       load_orchestration)

__all__ = ["Orchestrator", "orchestrate", "aorchestrate", "start", "Agent", "Message",
           "Orchestration", "as_agents", "load_orchestration", "ROLES", "DEFAULT_AGENTS"]
