"""The closing summary: the result a run ends with, written from its nodes' results and
checked like a node's answer.

A small model asked for a brief summary drops what the task asked for: on dabench-dev q0 the
code printed 34.65 and the summary said "the mean fare is 34.65" without the
`@mean_fare[...]` the task prescribed; on q6 the last node stated the four right values and
the summary none. So the writer is given what it must copy, and what it writes is checked:

- the prompt holds the nodes' results (a node whose code ran: its code left out, it is kept
  in the node), then what every node's code printed, on its own (the one source of numbers),
  and, when the task prescribes the answer's form, the task's own words about it with the
  request to end with the answer in that form, each value copied from a printed output;
- a summary whose numbers trace nowhere, whose form values trace nowhere (these are checked
  without the exemptions of `numbers`: a single digit, a year or a number the task writes
  must be printed too), or that lacks a form the task prescribes (`answerform`) goes back
  once, naming what is wrong; a number that still traces nowhere is withheld (written
  `[?]`, with a line saying why: the result never states a number nothing computed), a
  form still missing is marked; when only the form's names were missed, its values are
  asked for as JSON under a schema with those names and the form is written from them;
- a one-node flow's summary is the next turn of that node's conversation (its prompt and
  answer as sent and received, in the process that ran it), so a server that holds them
  evaluates only what the code printed, the task and the request;
- when a done node already states the whole answer in the task's form with every value
  traced to a printed output, that answer is the result and no summary is written: a
  rewrite could only lose it (one model call less).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from .._internal.text import cut as text_cut
from ..errors import ModelOutputError
from ..model.status import Status
from . import answerform, numbers
from .answerform import Form
from .node_runner import shares
from .answer_code import report
from .prompt_start import HOUSE_RULES
from .working_start import shown_above, start_run

__all__ = ["Summary", "write", "summary_messages", "printed_outputs", "kept_answer",
           "partial_mark", "untraced_values", "SYSTEM", "recheck", "RECHECK"]

SYSTEM = "You write the closing summary of a team's work."
# After the start a flow's nodes share, which says that their code blocks are run.
PROSE = "Write prose: nothing you write now is run."
CODE_LEFT_OUT = "[its Python code, which ran in the sandbox: what it printed is listed below]"
_RUNNABLE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*(?:python3?|py)?[ \t]*\n.*?^[ \t]*\1[`~]*[ \t]*$",
                       re.MULTILINE | re.DOTALL | re.IGNORECASE)

Ask = Callable[..., Awaitable]   # (messages, schema=None) -> a Reply


@dataclass
class Summary:
    """The result's text and how it was made."""
    text: str
    cut: bool = False
    calls: int = 0
    kept_from: str | None = None                        # the node whose answer is the result
    untraced: list[str] = field(default_factory=list)
    lacking: list[str] = field(default_factory=list)


def _cut(text: str, limit: int) -> str:
    return text_cut(text, limit, "\n[cut here: {n} more characters not shown]")


def _runs(execution) -> list[dict]:
    """The working start's run, then the model's, that ran."""
    if not execution:
        return []
    start = execution.get("working_start")
    runs = ([start] if isinstance(start, dict) else []) + [execution]
    return [r for r in runs if r.get("ran")]


def printed_outputs(workflow, start: bool = True) -> list[tuple[str, str]]:
    """(node, what its code printed) of every done node whose code printed something;
    `start=False` leaves out the working start's printout (the prompt shows it above)."""
    out = []
    for node in workflow.nodes.values():
        if node.status != Status.DONE:
            continue
        text = seen = ""
        for run in _runs(node.execution):   # a printout an earlier one holds whole: listed once
            printed = str(run.get("stdout") or "").rstrip()
            if printed.strip() and printed not in seen:
                seen = f"{seen}\n{printed}"
                if start or not run.get("starter"):
                    text = f"{text}\n{printed}" if text else printed
        if text.strip():
            out.append((node.id, text.strip("\n")))
    return out


def _body(node, shown: str = "") -> str:
    """A node's result for the summary: when its code ran, the code is left out (kept in the
    node) and its printout is listed with the others', so the prose and numbers both fit;
    the working start's report `shown` above is not repeated."""
    text = shown_above(node.output or "", shown)
    runs = _runs(node.execution)
    if not runs:
        return text
    text = _RUNNABLE.sub(CODE_LEFT_OUT, text)
    for run in runs:
        printed = str(run.get("stdout") or "").rstrip()
        if printed:
            text = text.replace("Printed output:\n" + printed, "Printed output: listed below")
    return text


def _ending(form: Form | None) -> str:
    ask = ("Answer the task from these results, briefly: what was done and what it found. "
           f"{numbers.SUMMARY_NUMBERS} Do not rewrite or repeat the results whole: they are "
           "kept as they are.")
    if form is None:
        return ask
    # (no template of our own: the bench model echoed "@a[...] with each ... replaced")
    return (f"{ask}\n\nThe task prescribes the form of its answer, in its own words:\n"
            f"{form.words}\nEnd your summary with the answer in exactly that form, each value "
            "copied from a printed output above.")


def summary_messages(workflow, budget: int, form: Form | None, start: str | None = None,
                     conversation: list[dict] | None = None) -> list[dict]:
    """The summary's prompt: the task, the nodes' results, what the code printed, what to write.

    `start` (prompt_start.flow_start up to the working start: a flow on input files) opens it
    as the nodes' prompts open, the house rules and that start; what follows is the summary's
    prompt as without it, the whole task again included (after the start alone, the task
    ~1,000 tokens back behind the inputs' rows, the bench model answered dabench-dev q10's
    @is_normal the wrong way round in two replays of stored prompts). So the summary evaluates
    about what it did, but a server that keeps the last prompt still holds the start after it:
    a node run again after the summary (`recheck`; 5 of analysis-s11/s12's 28 bench-model
    flows) evaluated its whole ~1,100-token prompt again (39-82 s on one thread).
    When the start shows the working start's run (as the nodes' prompts did), its code and
    printout are not listed again.

    `conversation` (the prompt and answer the one done node passed with, in this process):
    the summary goes on from it (`_going_on`), when it fits in twice the budget."""
    active = [n for n in workflow.nodes.values() if n.status == Status.DONE]
    if start and conversation and len(active) == 1:
        going_on = _going_on(workflow, budget, form, conversation)
        if sum(len(m["content"]) for m in going_on) <= 2 * budget:
            return going_on
    shown, printed = _beyond(workflow, start or "")
    texts = [_body(n, shown) for n in active]
    printed_room = shares([len(t) for _, t in printed], budget // 2) if printed else []
    printed_text = [_cut(t, k) for (_, t), k in zip(printed, printed_room)]
    allowed = shares([len(t) for t in texts], budget - sum(map(len, printed_text)))
    body = "\n\n".join(f"[{n.id}] {n.requirement}\n{_cut(t, k)}"
                       for n, t, k in zip(active, texts, allowed))
    if printed:
        body += (f"\n\n{_copy_from('the code', shown)}\n"
                 + "\n\n".join(f"[{nid}]\n{t}" for (nid, _), t in zip(printed, printed_text)))
    own = f"Task:\n{workflow.task}\n\nResults of the subtasks:\n{body}\n\n{_ending(form)}"
    if start:
        return [{"role": "system", "content": HOUSE_RULES},
                {"role": "user", "content": f"{start}\n\n{SYSTEM} {PROSE}\n\n{own}"}]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": own}]


def _beyond(workflow, above: str) -> tuple[str, list[tuple[str, str]]]:
    """(the working start's run report when the prompt `above` already shows it, else "";
    what the done nodes' code printed, that report's printout left out when shown)."""
    shown = report(start_run(workflow)) if above else ""
    shown = shown if shown and shown in above else ""
    return shown, printed_outputs(workflow, start=not shown)


def _copy_from(whose: str, shown: str) -> str:
    """The heading of the printouts a summary copies its numbers from."""
    return (f"What {whose} printed (copy every number from here"
            + (", or from the working start's output above" if shown else "") + "):")


def _going_on(workflow, budget: int, form: Form | None, conversation: list[dict]) -> list[dict]:
    """The summary of a one-node flow as the next turn of the node's own conversation: the
    node's prompt and answer (its code included) are then the start a server already holds,
    and what follows is what the code printed, the task again and what to write. Laid out
    as the other summary, it restated the node's subtask and answer after the shared start,
    and a server evaluated them again: SmolLM2 on dabench-dev q6 evaluated 767 of the
    summary's 1,501 prompt tokens that way, 407 of 1,913 this way."""
    shown, printed = _beyond(workflow, conversation[1]["content"])
    own = f"Task:\n{workflow.task}"
    if printed:
        own += (f"\n\n{_copy_from('your code', shown)}\n"
                + _cut("\n\n".join(t for _, t in printed), budget // 2))
    return [*conversation, {"role": "user", "content": f"{SYSTEM} {PROSE}\n\n{own}\n\n"
                                                           f"{_ending(form)}"}]


def _all_printed_lines(workflow) -> list[tuple[str, str]]:
    return [(nid, line) for nid, node in workflow.nodes.items()
            for line in numbers.printed_lines(node.execution)]


def untraced_values(workflow, form: Form | None, text: str) -> list[str]:
    """The numbers in the values the text gives in the task's form that no printed output
    holds (every number: the form's slots are the answer, nothing in them is exempt)."""
    if form is None or not form.pairs:
        return []
    lines = _all_printed_lines(workflow)
    stated = [s for _, value in answerform.in_form(form, text)
              for s in numbers.every_number(value)]
    return numbers.untraced(numbers.trace(stated, lines))


def _gives(workflow, form: Form, text: str) -> str | None:
    """The text's answer in the task's form when it gives it whole with every value traced."""
    parts = answerform.in_form(form, text)
    if not parts:
        return None
    if form.keys:
        answer = parts[0][1]
        lines = _all_printed_lines(workflow)
        return None if numbers.untraced(numbers.trace(numbers.every_number(answer), lines)) else answer
    answer = ", ".join(f"@{name}[{value}]" for name, value in parts)
    return None if untraced_values(workflow, form, answer) else answer


def kept_answer(workflow, form: Form | None) -> tuple[str, str, str] | None:
    """(node, its answer in the task's form, "printed" or "stated") when a done node's code
    printed the whole form, or else its answer gave it, with every value traced; the last
    node in the run's order first. A printout comes before any answer: code computed it,
    while a later answer may have copied the values into the wrong slots."""
    if form is None or not form.checked:
        return None
    done = [workflow.nodes[i] for i in reversed(workflow.order())
            if workflow.nodes[i].status == Status.DONE]
    printed = dict(printed_outputs(workflow))
    for node in done:
        answer = _gives(workflow, form, printed.get(node.id, ""))
        if answer:
            return node.id, answer, "printed"
    for node in done:
        plain = _RUNNABLE.sub(" ", numbers.strip_claims(node.output or ""))
        answer = _gives(workflow, form, plain)
        if answer:
            return node.id, answer, "stated"
    return None


def _kept(node_id: str, answer: str, how: str) -> str:
    said = "the code of subtask {} printed it" if how == "printed" else "subtask {} gave it"
    return (f"{answer}\n\n(The answer in the task's form as {said.format(node_id)}; each "
            "value traces to a printed output: see flow.trace_numbers().)")


def _wrong(workflow, form, text, data) -> tuple[list[str], list[str]]:
    loose = numbers.result_untraced(workflow, text, data)
    if data or any(_runs(n.execution) for n in workflow.nodes.values()):   # else: nothing to trace to
        loose += [v for v in untraced_values(workflow, form, text) if v not in loose]
    return loose, answerform.missing(form, text)


def _feedback(workflow, form, loose, lacking) -> str:
    lines = [line for _, line in _all_printed_lines(workflow)]
    parts = [numbers.summary_feedback(loose, lines)] if loose else []
    if lacking:
        parts.append(answerform.form_feedback(form, lacking))
    return "\n\n".join(parts)


async def _form_values(ask: Ask, back: list[dict], form: Form, lacking: list[str]) -> str:
    """The answer in the form, written here from the values a JSON answer gives: asked for
    when a summary missed the form's names (the bench model wrote `@0[0]` for
    `@number_of_outliers[...]` on dabench-dev q468, and again when asked for the form alone);
    an endpoint that follows the schema cannot answer with other names. "" when none."""
    try:
        reply = await ask([*back, {"role": "user",
                                   "content": answerform.values_request(form, lacking)}],
                          schema=answerform.values_schema(form))
    except ModelOutputError:   # not JSON even so: the form stays missing, and is marked
        return ""
    return answerform.from_values(form, reply.data)


async def write(workflow, ask: Ask, *, budget: int, data: bool,
                start: str | None = None, conversation: list[dict] | None = None) -> Summary:
    """The result: a node's traced answer in the task's form when one gave it whole, else a
    summary written by `ask` and checked (back once; a number that still traces nowhere is
    withheld, a form still missing is marked)."""
    form = answerform.prescribed(workflow.task or "")
    kept = kept_answer(workflow, form)
    if kept is not None:
        node_id, answer, how = kept
        return Summary(_kept(node_id, answerform.rounded(form, answer), how), kept_from=node_id)
    messages = summary_messages(workflow, budget, form, start, conversation)
    reply, calls = await ask(messages), 1
    text, cut = reply.text, reply.cut
    loose, lacking = _wrong(workflow, form, text, data)
    if loose or lacking:   # back once, naming what is wrong
        back = [*messages, {"role": "assistant", "content": text}]
        if loose:   # written again as a whole
            reply = await ask([*back, {"role": "user", "content": _feedback(workflow, form, loose, lacking)}])
            text, cut = reply.text, reply.cut
        elif form.pairs:   # only the form's values are asked for, and the form written here
            line = await _form_values(ask, back, form, lacking)
            if line:
                text = f"{text.rstrip()}\n\n{line}"
        else:   # only the answer in the form is asked for, and added to the summary
            reply = await ask([*back, {"role": "user",
                                       "content": answerform.form_feedback(form, lacking, only=True)}])
            if not answerform.missing(form, reply.text):
                text = f"{text.rstrip()}\n\n{reply.text.strip()}"
        calls = 2
        loose, lacking = _wrong(workflow, form, text, data)
    if loose:   # a number nothing computed is not stated: withheld, and the mark says why
        text = f"{numbers.withhold(text, loose)}\n\n{numbers.WITHHELD_MARK}"
        lacking = answerform.missing(form, text)
    text = answerform.rounded(form, text)   # as the task's words ask; it still traces
    text = _to_form_places(workflow, form, text)
    if lacking:   # (no node gave it whole with traced values, or it would be the result)
        text += f"\n\n{answerform.missing_mark(lacking)}"
    return Summary(text, cut=cut, calls=calls, untraced=loose, lacking=lacking)


def _to_form_places(workflow, form: Form | None, text: str) -> str:
    """Each `@name[value]` the summary wrote with fewer decimal places than the form asks for
    it, written again from the printed number it rounds (`numbers.to_places`)."""
    lines = [line for _, line in _all_printed_lines(workflow)]
    return answerform.with_places(form, text,
                                  lambda value, places: numbers.to_places(value, places, lines))


def partial_mark(failed: list[str]) -> str:
    """The line that ends a result written from part of the work: which subtasks failed."""
    names = ", ".join(failed) or "a subtask"
    return (f"[incomplete: {names} failed; this result is written from the subtasks that "
            "finished (flow.rerun or flow.edit on it, then run(), writes it again)]")


RECHECK = "answer_check"   # the update log's kind for it


def recheck(workflow, written: Summary) -> tuple[str, str] | None:
    """(node, its requirement with what the answer lacks) when the result has no traced value
    for some of the task's answer form and a done node's code ran: the code of the last
    such node (in the run's order) printed something else, and is asked once more for those
    values, by name. On dabench-dev q308 the node's filter kept no title ('Mr' is not
    'Mr.'), it printed "Other 32.2", and the summary's four values traced nowhere; q129's
    node printed a standard deviation of another column. None when nothing is lacking."""
    form = answerform.prescribed(workflow.task or "")
    if form is None or not form.pairs or written.kept_from:
        return None
    names = answerform.unfilled(form, written.text)
    ran = [i for i in workflow.order() if workflow.nodes[i].status == Status.DONE
           and _runs(workflow.nodes[i].execution)]
    if not names or not ran:
        return None
    node = workflow.nodes[ran[-1]]
    printed = dict(printed_outputs(workflow)).get(node.id, "")
    said = (f" Its code printed:\n{_cut(printed, 400)}\nwhich holds none of them." if printed
            else " Its code printed nothing.")
    return node.id, (f"{node.requirement.rstrip()}\nThe task's answer needs these values, which "
                     f"no output held: {', '.join(names)}.{said} Compute each one with code and "
                     "print it with its name.")
