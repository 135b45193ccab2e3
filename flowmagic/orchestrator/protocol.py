"""Orchestrator mode's data and protocol: agents, messages, the outcome, its export.

The engine is `flowmagic.orchestrator.hub`. Here: the worker roles and `as_agents`; a
transcript `Message`; the `Orchestration` a run returns (answer, transcript, turns,
tokens, cost) with `script()` for an exact replay; the two protocols the orchestrator
speaks (function calling: `send_message` / `submit_answer`; or JSON actions:
`{"action": "send", "messages": [{"agent", "content"}, ...]}` / `{"action": "submit",
"answer": ...}`) and their tolerant readers; the notebook export, whose code cell replays
the run from the response cache; and `load_orchestration` from the store.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError
from ..model.status import AnswerState

__all__ = ["Agent", "Message", "Orchestration", "RunSettings", "ROLES", "DEFAULT_AGENTS", "as_agents",
           "load_orchestration", "export_notebook", "transcript_markdown", "transcript_text",
           # the action protocol, for the hub
           "new_run_id", "tool_specs", "action_schema", "system_prompt", "read_native_calls",
           "read_actions"]

# name -> (role prompt, what the orchestrator is told the agent does)
ROLES: dict[str, tuple[str, str]] = {
    # CORAL: the planner decomposes, the orchestrator alone assigns (a planner that names
    # agents takes the orchestrator's one decision and often names agents that do not exist).
    "planner": ("You are the planner. Break the task you are given into a short numbered list of "
                "concrete steps (at most 6), each saying only what must be done. Do not name, "
                "assign or suggest agents, roles or people for the steps.",
                "breaks a task into numbered steps; it names no agents: you decide who does each"),
    "analyst": ("You are the analyst. Reason carefully about the data, numbers and facts you are "
                "given and state concrete findings.", "reasons about data, numbers and facts"),
    "coder": ("You are the coder. Write correct, complete Python code for what you are asked, in "
              "one fenced block, with one line saying what it does.", "writes Python code"),
    "writer": ("You are the writer. Write clear, well-organised prose for what you are asked.",
               "writes summaries, reports and explanations"),
    "researcher": ("You are the researcher. Collect the facts and background a question needs.",
                   "collects relevant facts and background"),
    "reviewer": ("You are the reviewer. Check the draft you are given for mistakes and say "
                 "exactly what to fix.", "checks a draft and says what to fix"),
}
DEFAULT_AGENTS = ("planner", "analyst", "coder")


@dataclass
class Agent:
    """A worker: a role prompt, optionally tools and its own model."""
    name: str
    role: str
    summary: str = ""
    tools: list = field(default_factory=list)
    model: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "role": self.role, "summary": self.summary,
                "tools": [t.name for t in self.tools], "model": self.model}


def as_agents(spec: Any = None, tools: Any = None) -> list[Agent]:
    """Agents from "planner,analyst", names, dicts ({"name", "role", "tools", "model"}) or Agents.

    Known names (ROLES) get their role prompt; other names a generic one. `tools` go to
    every agent that names none of its own.
    """
    from ..engine.tools import as_tools

    spec = DEFAULT_AGENTS if spec is None else spec
    items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    shared, out = as_tools(tools), []
    for item in items:
        if isinstance(item, str):
            item = {"name": item}
        if isinstance(item, Agent):
            agent = item
        elif isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"].strip():
            name = item["name"].strip()
            role, summary = ROLES.get(name, (f"You are the {name}.", f"the {name}"))
            agent = Agent(name, item.get("role") or role, item.get("summary") or summary,
                          as_tools(item["tools"]) if item.get("tools") is not None else list(shared),
                          item.get("model"))
        else:
            raise ConfigError(f"an agent must be a name, a dict with a 'name', or an Agent, "
                              f"not {item!r}")
        if agent.name in ("orchestrator", "user", "flowmagic") or any(a.name == agent.name for a in out):
            raise ConfigError(f"agent name {agent.name!r} is reserved or given twice; rename it")
        out.append(agent)
    if not out:
        raise ConfigError("orchestrator mode needs at least one agent, e.g. --agents planner,coder")
    return out


@dataclass
class Message:
    """One message of the transcript. kind: task, send, reply, error, note or submit."""
    seq: int
    turn: int
    sender: str
    recipient: str
    kind: str
    content: str
    time: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    cached: bool = False
    call_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class RunSettings(BaseModel):
    """What an orchestration ran with: stored with the run and in an exported notebook's
    metadata (as a dict, in this order), read back by `load_orchestration` and the replay cell.
    Keys of other versions are kept as they are."""

    model_config = ConfigDict(extra="allow")

    mode: str | None = None          # "orchestrate" (a workflow run's settings have none)
    model: str | None = None
    endpoint: str | None = None
    budget_s: int | float | None = None
    max_turns: int | None = None
    replayed: bool = False
    protocol: str = "auto"           # the one used, once the run is saved
    reply_chars: int = 3000
    continuations: int = 0
    consensus: bool = False          # a submission waited for the agents' agreement
    seed: int | None = 0
    temperature: int | float | None = None
    max_tokens: int | None = None

    def to_dict(self) -> dict:
        return self.model_dump()


@dataclass
class Orchestration:
    """The outcome: the answer, the transcript and what it cost."""
    run_id: str
    task: str
    agents: list[Agent]
    settings: RunSettings          # (a dict is read into one)
    name: str = "orchestration"
    answer: str = ""
    status: AnswerState = AnswerState.RUNNING
    ended_by: str | None = None    # submit | turns | time | stopped | error
    note: str | None = None        # why the answer is a fallback
    transcript: list[Message] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    final: str | None = None       # None | "answered" | "failed": the forced last call
    elapsed_s: float = 0.0
    calls: int = 0
    cached_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.settings, RunSettings):   # a dict, as stored
            self.settings = RunSettings(**(self.settings or {}))

    def script(self) -> dict:
        """What `replay=` needs to repeat this run's turns exactly (from the cache)."""
        return {"turns": [{k: t[k] for k in ("turn", "action", "sent", "fed", "cut") if k in t}
                          for t in self.turns], "ended_by": self.ended_by, "final": self.final,
                "limits": [self.settings.max_turns, self.settings.budget_s]}

    def messages(self, turn: int | None = None) -> list[Message]:
        return [m for m in self.transcript if turn is None or m.turn == turn]

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "name": self.name, "task": self.task,
                "agents": [a.to_dict() for a in self.agents], "settings": self.settings.to_dict(),
                "answer": self.answer, "status": self.status, "ended_by": self.ended_by,
                "note": self.note, "transcript": [m.to_dict() for m in self.transcript],
                "turns": self.turns, "final": self.final, "elapsed_s": self.elapsed_s,
                "calls": self.calls, "cached_calls": self.cached_calls, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "cost_usd": self.cost_usd, "script": self.script()}

    def to_notebook(self, path) -> Any:
        """Write the transcript as notebook cells whose code replays the run from the cache."""
        return export_notebook(self, path)

    def __repr__(self) -> str:
        return (f"<Orchestration {self.name!r} run={self.run_id} {self.status} by {self.ended_by}: "
                f"{len(self.turns)} turn(s), {len(self.transcript)} message(s), "
                f"{self.calls} call(s), ${self.cost_usd:.4f}>")


# ---------------------------------------------------------------------------- the protocol
def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def tool_specs(names: list[str]) -> list[dict]:
    send = {"type": "object", "properties": {
        "agent": {"enum": names, "description": "who gets the message"},
        "content": {"type": "string", "description": "the whole instruction, self-contained"}},
        "required": ["agent", "content"]}
    submit = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    return [{"type": "function", "function": {"name": "send_message", "parameters": send,
                                              "description": "Send a message to one agent; it "
                                              "works while you go on, and its reply comes as a "
                                              "message when it arrives."}},
            {"type": "function", "function": {"name": "wait_for_replies",
                                              "parameters": {"type": "object", "properties": {}},
                                              "description": "Do nothing until the next reply "
                                              "of an agent that is still working."}},
            {"type": "function", "function": {"name": "submit_answer", "parameters": submit,
                                              "description": "Submit the final answer; ends the work."}}]


def action_schema(names: list[str]) -> dict:
    item = {"type": "object", "properties": {"agent": {"enum": names}, "content": {"type": "string"}},
            "required": ["agent", "content"]}
    return {"anyOf": [
        {"type": "object", "properties": {"action": {"const": "send"},
                                          "messages": {"type": "array", "items": item, "minItems": 1}},
         "required": ["action", "messages"]},
        {"type": "object", "properties": {"action": {"const": "wait"}}, "required": ["action"]},
        {"type": "object", "properties": {"action": {"const": "submit"}, "answer": {"type": "string"}},
         "required": ["action", "answer"]}]}


def system_prompt(agents: list[Agent], max_turns: int | None, budget_s: float | None, protocol: str,
                  consensus: bool = False) -> str:
    team = "\n".join(f"- {a.name}: {a.summary or a.role[:150]}" for a in agents)
    limits = f"at most {max_turns} turns" if max_turns else "a limited number of turns"
    if budget_s:
        limits += f" and about {budget_s:g} seconds"
    how = ("Use the send_message tool (several calls in one turn run at the same time), "
           "wait_for_replies, and the submit_answer tool." if protocol == "native" else
           'Answer with JSON only: {"action": "send", "messages": [{"agent": NAME, "content": TEXT}, '
           '...]} to message agents (all at the same time), {"action": "wait"} to wait for the '
           'next reply, or {"action": "submit", "answer": TEXT} to finish.')
    return ("You are the orchestrator of a team of agents working on one task. You do not do the "
            "work yourself: you send messages to agents, read their replies, and submit the final "
            "answer.\nThe agents (each sees only the messages you send it, not the task or the other "
            f"agents, so make every message self-contained):\n{team}\n"
            "Agents work while you go on: you see each reply as soon as it arrives, with the "
            "agents still working named, and agents may write to you first.\n"
            "Good moves: ask the planner (if there is one) for a decomposition; send independent "
            "pieces to several agents in the same turn; act on a reply at once when it is enough "
            "for the next step; if a reply is weak, send a refined instruction or give the work "
            f"to another agent. You have {limits}: submit as soon as the answer is good enough.\n"
            + ("Before an answer is submitted, the agents who worked on it are asked whether they "
               "agree; one they do not confirm comes back to you with their reasons.\n"
               if consensus else "") + how)


def read_native_calls(reply, names: set[str]) -> list[tuple]:
    """[("send", agent, content, id) | ("submit", answer, None, id) | ("invalid", why, None, id)]."""
    out = []
    for tc in reply.tool_calls or []:
        fn, cid = tc.get("function") or {}, tc.get("id")
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            out.append(("invalid", "the arguments were not a JSON object", None, cid))
        elif fn.get("name") == "submit_answer":
            out.append(_submit(args.get("answer"), cid))
        elif fn.get("name") == "wait_for_replies":
            out.append(("wait", None, None, cid))
        elif fn.get("name") == "send_message":
            out.append(_send(args.get("agent"), args.get("content"), names, cid))
        else:
            out.append(("invalid", f"there is no tool {fn.get('name')!r}", None, cid))
    return out


def _send(agent: Any, content: Any, names: set[str], cid: Any = None) -> tuple:
    if agent not in names:
        return ("invalid", f"there is no agent {agent!r}; agents: {', '.join(sorted(names))}", None, cid)
    if not isinstance(content, str) or not content.strip():
        return ("invalid", f"the message to {agent} was empty", None, cid)
    return ("send", agent, content.strip(), cid)


def _submit(answer: Any, cid: Any = None) -> tuple:
    text = answer if isinstance(answer, str) else "" if answer is None else json.dumps(answer)
    if not text.strip():   # small models submit "" at once; that is no answer
        return ("invalid", "the submitted answer was empty", None, cid)
    return ("submit", text.strip(), None, cid)


def read_actions(data: Any, names: set[str]) -> list[tuple]:
    """The JSON action protocol, tolerant of small models' variations."""
    if not isinstance(data, dict):
        return [("invalid", "the answer was not a JSON object", None, None)]
    action = str(data.get("action", "")).lower()
    if action in ("wait", "wait_for_replies", "wait_for_mention"):
        return [("wait", None, None, None)]
    if action in ("submit", "submit_answer", "answer") or ("answer" in data and "messages" not in data):
        answer = data.get("answer", data.get("content", ""))
        return [_submit(answer)]
    items = data.get("messages")
    if items is None and any(k in data for k in ("agent", "recipient", "to")):
        items = [data]
    if not isinstance(items, list) or not items:
        return [("invalid", "no messages to send and no answer", None, None)]
    return [_send(i.get("agent", i.get("recipient", i.get("to"))),
                  i.get("content", i.get("message")), names) if isinstance(i, dict)
            else ("invalid", f"message {i!r} is not an object", None, None) for i in items]


# ---------------------------------------------------------------------------- export and loading
def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in (text or "(empty)").splitlines())


def transcript_text(o: Orchestration) -> str:
    """The transcript as plain text, one message a paragraph (a terminal's chat view)."""
    lines = [repr(o)]
    for m in o.transcript:
        lines.append(f"[turn {m.turn}] {m.sender} -> {m.recipient} ({m.kind}): {m.content}")
    return "\n\n".join(lines)


def transcript_markdown(o: Orchestration, turn: int | None = None) -> str:
    """The transcript (or one turn of it) as Markdown: the exported cells, a simple chat view."""
    turns = sorted({m.turn for m in o.transcript}) if turn is None else [turn]
    return "\n\n".join(_turn_markdown(o, t) for t in turns)


def _turn_markdown(o: Orchestration, turn: int) -> str:
    lines = [f"### Turn {turn}" if turn else "### The task"]
    for m in o.messages(turn):
        usage = (f" — {m.tokens_in}+{m.tokens_out} tokens, ${m.cost_usd:.4f}"
                 + (", cached" if m.cached else "")) if (m.tokens_in or m.tokens_out) else ""
        lines += ["", f"**{m.sender} → {m.recipient}** ({m.kind}{usage})", "", _quote(m.content)]
    return "\n".join(lines)


def _replay_source(o: Orchestration) -> str:
    import pprint

    s = o.settings
    agents = pprint.pformat([a.to_dict() for a in o.agents], width=88, sort_dicts=False)
    script = pprint.pformat(o.script(), width=88, sort_dicts=False)
    where = f"model {s.model or '(the default)'} on {s.endpoint or 'the default endpoint'}"
    return "\n".join([
        "import flowmagic",
        f"# Exported by flowmagic from orchestrator run {o.run_id}. This cell repeats the run's",
        "# turns through the response cache: no model call when the cache holds them, which needs",
        f"# the same endpoint ({where}; keys are never written here).",
        "# Agents with tools need those tools registered (@flowmagic.tool) before this cell.",
        f"orch = flowmagic.orchestrate(\n    {o.task!r},",
        f"    agents={agents},".replace("\n", "\n    "),
        f"    model={s.model!r}, seed={s.seed!r}, "
        f"temperature={s.temperature!r}, max_tokens={s.max_tokens!r},",
        f"    protocol={s.protocol!r}, reply_chars={s.reply_chars!r},",
        f"    name={o.name!r},",
        f"    replay={script})".replace("\n", "\n    "),
        "orch"])


def export_notebook(o: Orchestration, path) -> Path:
    """An nbformat v4 notebook: the task, a cell replaying the run, the transcript, the answer."""
    from .._internal.nbformat_import import nbformat, v4

    from ..view.safe import markdown_cell   # the messages are model text

    intro = (f"# {o.name}: orchestrator mode\n\n**Task.** {o.task}\n\n**Agents.** "
             + ", ".join(f"{a.name} ({a.summary or a.role[:60]})" for a in o.agents)
             + f"\n\n{len(o.turns)} turn(s), ended by {o.ended_by}, answer {o.status}; "
             f"{o.calls} model call(s), {o.tokens_in}+{o.tokens_out} tokens, ${o.cost_usd:.4f}, "
             f"{o.elapsed_s:.1f} s.")
    cells = [v4.new_markdown_cell(intro), v4.new_code_cell(_replay_source(o))]
    for turn in sorted({m.turn for m in o.transcript}):
        cells.append(v4.new_markdown_cell(markdown_cell(_turn_markdown(o, turn))))
    cells.append(v4.new_code_cell("print(orch.answer)"))
    meta = {"flowmagic": {"run": o.run_id, "mode": "orchestrate", "settings": o.settings.to_dict(),
                          "status": o.status, "ended_by": o.ended_by, "cost_usd": o.cost_usd,
                          "calls": o.calls}}
    nb = v4.new_notebook(cells=cells, metadata=meta)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def load_orchestration(run: str, *, store=None) -> Orchestration:
    """An Orchestration from the store (by run id or name), transcript included."""
    from ..store import get_store
    from ..engine.tools import registry

    store = store or get_store()
    data = store.load_run(run)
    stored = dict(data.get("settings") or {})
    agents_, outcome = stored.pop("agents", []), stored.pop("outcome", {})
    try:
        settings = RunSettings(**stored)
    except ValidationError:
        settings = None
    if settings is None or settings.mode != "orchestrate":
        raise ConfigError(f"run {run!r} is a workflow, not an orchestration; use flowmagic.load")
    tools = registry()
    agents = [Agent(a["name"], a["role"], a.get("summary", ""),
                    [tools[n] for n in a.get("tools", []) if n in tools], a.get("model"))
              for a in agents_]
    o = Orchestration(data["id"], data["task"], agents, settings, name=data.get("name") or "orchestration",
                      answer=data.get("result") or "", **outcome)
    o.transcript = [Message(**{k: m[k] for k in Message.__dataclass_fields__})
                    for m in store.transcript(data["id"])]
    return o
