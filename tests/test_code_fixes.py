"""Retries that fix code and repairs that fit the failure (issue 29, item 2).

A scripted agent (a loopback server) writes code that fails; what the next prompt says is
read from what the server received. A code error is answered by a retry that names the
failing line and what exists, never by a rewritten instruction or another agent; a
rewritten instruction that echoes its prompt is refused."""

import json
import re

import pytest

import flowmagic
from flowmagic.engine import summary
from flowmagic.engine.diagnosis import code_failure, code_feedback, failing_line
from flowmagic.engine.repairs import refine_instruction, refusal
from flowmagic.flow import Flow
from flowmagic.model.graph import Workflow
from flowmagic.ops.nbrun import TEMPLATES
from flowmagic.testing.loopback import LoopbackServer

from conftest import fast_llm, run

CSV = TEMPLATES / "data" / "anscombe.csv"   # columns: dataset, x, y
REFINE = "You rewrite one subtask's instruction"
SUBSTITUTE = "You choose which kind of agent"
UPDATER = "progress"   # in the updater's prompt only


def one_node(requirement="Print the mean of y in anscombe.csv.", **settings):
    plan = {"task": "Explore anscombe.csv: the mean of y.",
            "nodes": [{"id": "stats", "requirement": requirement, "agent": "analyst"}],
            "edges": []}
    return Flow.from_dict(plan, name="fix", inputs=[CSV], starter="off", **settings)


def sent(server):
    """(system, user) text of every chat request, in order."""
    return [(r["body"]["messages"][0]["content"], r["body"]["messages"][-1]["content"])
            for r in server.stats(bodies=True)["requests"] if r["path"].endswith("/chat/completions")]


def node_requests(server, node="stats"):
    """The messages of every request of `node`'s attempts, in order."""
    return [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]
            if r["path"].endswith("/chat/completions")
            and f"Your subtask ({node})" in r["body"]["messages"][1]["content"]
            # (a one-node flow's summary goes on from the node's conversation)
            and summary.SYSTEM not in r["body"]["messages"][-1]["content"]]


def node_prompts(server):
    return [m[-1]["content"] for m in node_requests(server)]


def is_retry(body):
    return len(body["messages"]) > 2 and "is not done yet" in body["messages"][-1]["content"]


def fenced(code):
    return f"```python\n{code}\n```"


def by_attempt(answers):
    """A responder giving the node's n-th attempt the n-th answer (each retry continues the
    conversation by two messages), the last one from then on."""
    def agent(body):
        return answers[min(len(body["messages"]) // 2 - 1, len(answers) - 1)]
    return agent


def retried(answers):
    """The node's requests when its attempts get `answers` in turn (one attempt each, no
    update), after checking that the last one made it done."""
    with LoopbackServer(responder=by_attempt(answers)) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node(max_attempts=len(answers), update="off")
        flow.run()
        requests = node_requests(server)
    assert flow.workflow.nodes["stats"].status == "done", flow.message
    return requests


GOOD = "import pandas as pd\ndf = pd.read_csv('anscombe.csv')\nprint(round(df['y'].mean(), 4))"
MEANS = fenced("import pandas as pd\nframe = pd.read_csv('anscombe.csv')\nprint(means.round(2))")


def test_a_retry_continues_the_conversation_the_server_has_cached():
    """The retry is the node's prompt as it was sent, the model's answer as it was given, then
    the feedback: a server that keeps the last prompt's state evaluates only the feedback."""
    with LoopbackServer(responder=lambda b: fenced(GOOD) if is_retry(b) else MEANS) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node()
        flow.run()
        first, second = node_requests(server)
    assert flow.workflow.nodes["stats"].status == "done", flow.message
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[:2] == first   # byte for byte: the prefix the server evaluated already
    assert second[2]["content"] == MEANS   # the answer as the model wrote it
    feedback = second[3]["content"]
    assert feedback.startswith("Your subtask (stats) is not done yet: attempt 1 was rejected.")
    assert "The code failed: NameError: name 'means' is not defined" in feedback
    assert "It failed at line 3:\n    print(means.round(2))" in feedback
    assert "Define 'means' in your code before using it" in feedback
    assert "```python\n" not in feedback   # the code is in the answer's turn, not restated


def test_a_name_error_is_answered_by_a_retry_that_names_the_line_and_what_exists():
    with LoopbackServer(responder=lambda b: fenced(GOOD) if is_retry(b) else MEANS) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node()
        flow.run()
        prompts = node_prompts(server)
    assert flow.workflow.nodes["stats"].status == "done", flow.message
    retry = prompts[1]
    assert "Names that exist in the session: " in retry and "df (DataFrame" in retry
    assert "The end of the traceback" not in retry   # the failing line and the error say it
    assert len(prompts) == 2


def test_a_code_error_that_persists_goes_to_the_updater_never_to_refine_or_substitute():
    def agent(body):
        system, prompt = body["messages"][0]["content"], body["messages"][-1]["content"]
        if body.get("response_format"):   # the updater (or a repair): no change
            return json.dumps({"action": "none", "rationale": "nothing to change",
                               "requirement": "x", "agent": "coder", "subtasks": []})
        return fenced("print(undefined_table.shape)")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node(max_attempts=2, max_updates=1)
        flow.run()
        systems = [s for s, _ in sent(server)]
    assert flow.workflow.nodes["stats"].status == "failed"
    assert not any(REFINE in s or SUBSTITUTE in s for s in systems)
    assert [e["kind"] for e in flow.update_log] == ["replan"]
    # every call counted, each with why it was made: in the timeline, and in the panel
    row = flow.timeline_rows()[0]
    assert row["calls_why"] == [
        "attempt (#1)",
        "retry after: The code failed: NameError: name 'undefined_table' is not defined (#2)",
        "update: re-plan after this node"]
    logged = {(r["purpose"], r["node_id"]): r["calls"] for r in flow.store.usage(flow.run_id)}
    assert row["calls"] == logged[("node", "stats")] + logged[("update", None)] == 3
    from flowmagic.jupyter.widgets import Panel
    panel = Panel(flow)
    panel.node_picker.value = "stats"
    panel._refresh()
    assert "3 model calls: attempt (#1) · retry after: The code failed: NameError" in (
        panel.node_info.value.replace("&#x27;", "'"))
    panel.close()


def test_an_update_that_would_run_a_failed_node_again_as_it_was_ends_the_run():
    """On dabench-dev q618 the bench model's updater gave the failed node back three times
    with its requirement unchanged (but for a full stop): each time three more tries failed
    the same way. Such an update is not applied; one that changes the node is."""
    requirement = "Print the mean of y in anscombe.csv."

    def agent(body):
        prompt = body["messages"][-1]["content"]
        if body.get("response_format"):   # the updater: the same node, the same words
            return json.dumps({"rationale": "try again", "action": "update", "subtasks": [
                {"id": "stats", "requirement": requirement.rstrip(".").upper(),
                 "agent": "analyst", "depends_on": [], "rerun": True}]})
        if "MEAN OF Y" in prompt:   # (never reached: the same words are not run again)
            return fenced(GOOD)
        return fenced("print(undefined_table.shape)")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node(requirement, max_attempts=2, max_updates=3)
        flow.run()
        prompts = node_prompts(server)
    node = flow.workflow.nodes["stats"]
    assert node.status == "failed" and len(prompts) == 2
    assert [e["kind"] for e in flow.update_log] == ["replan"]
    assert flow.update_log[0]["no_change"]
    assert any("would run stats again as it was" in w
               for w in flow.update_log[0]["diff"]["warnings"])


def test_an_update_that_changes_the_failed_node_runs_it_again():
    def agent(body):
        prompt = body["messages"][-1]["content"]
        if body.get("response_format"):
            return json.dumps({"rationale": "name the file", "action": "update", "subtasks": [
                {"id": "stats", "requirement": "Read anscombe.csv with pandas and print the "
                 "mean of its y column.", "agent": "analyst", "rerun": True}]})
        if "its y column" in prompt:
            return fenced(GOOD)
        return fenced("print(undefined_table.shape)")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node(max_attempts=2, max_updates=3)
        flow.run()
    assert flow.workflow.nodes["stats"].status == "done", flow.message
    assert not flow.update_log[0]["no_change"]


def test_a_key_error_retry_names_the_real_columns():
    def agent(body):
        if is_retry(body):
            return fenced(GOOD)
        return fenced("import pandas as pd\ndf = pd.read_csv('anscombe.csv')\nprint(df['Y'].mean())")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node()
        flow.run()
        retry = node_prompts(server)[1]
    assert "The code failed: KeyError: 'Y'" in retry
    # the session's DataFrames (df, anscombe) are named beside the file's columns
    hint = retry[retry.index("'Y' is not a column of the data. The real columns are ("):]
    hint = hint[:hint.index("; use those names")]
    assert "anscombe.csv: dataset, x, y" in hint and "df: dataset, x, y" in hint
    assert hint.endswith(" (did you mean 'y'?)")
    assert flow.workflow.nodes["stats"].status == "done"


def test_a_year_taken_for_a_column_name_is_told_the_name_is_text(tmp_path):
    """q496's KeyError: 1974: the column's name is the text '1974' (a wide table of years)."""
    table = tmp_path / "degrees.csv"
    table.write_text("field,1974,1975\nMath,10.5,11.0\nArt,60.0,61.5\n")
    plan = {"task": "Mean share of degrees in 1974 in degrees.csv.",
            "nodes": [{"id": "stats", "requirement": "Print the mean of the 1974 column.",
                       "agent": "analyst"}], "edges": []}

    def agent(body):
        return fenced("print(df['1974'].mean())" if is_retry(body) else "print(df[1974].mean())")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="years", inputs=[table], starter="off")
        flow.run()
        retry = node_prompts(server)[1]
    assert "The code failed: KeyError: 1974" in retry
    assert "The column is named by the text '1974', not the number 1974: write df['1974']." in retry
    assert flow.workflow.nodes["stats"].status == "done"
    assert "35.25" in flow.workflow.nodes["stats"].output


def test_a_repeated_error_is_called_one_with_what_was_tried_and_the_conversation_grows():
    """Three attempts on the same wrong line (q5's correlation unpacked three times): the third
    request is the second one continued, and it names both attempts and the line they tried."""
    answers = [fenced("r, p = df['x'].corr(df['y'])\nprint(r)"),
               fenced("# again\nr, p = df['x'].corr(df['y'])\nprint(r)"),
               fenced("print(df['x'].corr(df['y']))")]

    requests = retried(answers)
    second, third = requests[1], requests[2]
    assert third[:5] == second + [{"role": "assistant", "content": answers[1]}]
    said = third[-1]["content"]
    assert "cannot unpack non-iterable" in said
    assert "returns one numpy.float64 value, not several: assign it to one name" in said
    # what the model wanted from that line (q11: `r, p_value = ...corr(...)` three times)
    assert "for r and its p-value write `from scipy import stats` and `r, p = " in said
    assert "stats.pearsonr(x, y)`" in said
    assert ("This is the same error as attempt 1: the change since then did not fix it. "
            "Failing line(s) tried so far:\n    r, p = df['x'].corr(df['y'])") in said
    assert "same error" not in second[-1]["content"]
    assert all("```python\n" not in m["content"] for m in third[3::2])   # nothing restated


def test_a_missing_module_retry_names_the_libraries_that_exist_and_a_repeat_is_called_one():
    def agent(body):
        return fenced("import sklearn_extra_not_here\nprint(1)")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = one_node(max_attempts=3, update="off")
        flow.run()
        prompts = node_prompts(server)
    second, third = prompts[1], prompts[2]
    assert "There is no module 'sklearn_extra_not_here' here" in second
    assert "Libraries that exist: import numpy as np; import pandas as pd" in second
    assert "same error as attempt" not in second
    assert "This is the same error as attempt 1: the change since then did not fix it" in third


def test_failing_line_reads_the_node_file_frame_and_the_sessions_own_record():
    stderr = ('Traceback (most recent call last):\n  File "<python>/runpy.py", line 9, in x\n'
              '  File "stats.py", line 2, in <module>\nNameError: name \'a\' is not defined')
    code = "x = 1\nprint(a)\n"
    assert failing_line({"stderr": stderr, "code": code}, "stats.py") == (2, "print(a)")
    assert failing_line({"stderr": stderr, "code": code, "failing_line": 1}) == (1, "x = 1")
    assert failing_line({"error_line": {"line": 4, "text": "df.plot()"}}) == (4, "df.plot()")
    assert failing_line({"stderr": "SyntaxError: bad", "code": code}) is None
    text = code_feedback({"error": "NameError: name 'a' is not defined", "code": code,
                          "stderr": stderr, "names": {"df": "DataFrame 44x3", "pd": "module"}},
                         node_id="stats")
    assert "Names that exist in the session: df (DataFrame 44x3), pd (module)." in text
    # the session's record: its names (with a DataFrame's columns) and its failing line
    record = {"error": "KeyError: 'mpgg'", "code": code, "error_line": {"line": 2, "text": "x"},
              "names": [{"name": "cars", "type": "DataFrame", "about": "32 rows x 2 columns",
                         "columns": ["mpg", "wt"]}, {"name": "pd", "type": "module"}]}
    text = code_feedback(record, node_id="stats")
    assert "It failed at line 2:\n    x" in text
    assert "The real columns are (cars: mpg, wt) (did you mean 'mpg'?)" in text


@pytest.mark.parametrize("attempts, code", [
    ([{"passed": False, "execution": {"ran": True, "ok": False}}], True),
    ([{"passed": False, "feedback": "The code crashed: ZeroDivisionError"}], True),
    ([{"passed": False, "feedback": "too short"}], False),
    ([{"passed": False, "feedback": "empty answer"}], False),
    ([{"passed": False, "execution": {"ran": True, "ok": True}, "feedback": "wrong"}], False),
    ([], False),
])
def test_code_failure_tells_a_code_error_from_a_rejection(attempts, code):
    assert code_failure(attempts) is code


TASK = "Report on sales.csv"
PLAN = {"task": TASK, "nodes": [
    {"id": "parse", "requirement": "parse the dates of sales.csv", "agent": "writer",
     "status": "failed", "attempts": [{"output": "dates", "feedback": "no table was given"}]}],
    "edges": []}


@pytest.mark.parametrize("answer, why", [
    ("the rewritten instruction", "repeated the prompt"),
    ("<the new instruction, in your own words>", "placeholder"),
    ("Rewrite the instruction for <subtask>", "placeholder"),
    ("   ", "empty"),
    ("Keep its goal; make it concrete and self-contained", "repeated the prompt"),
    ("List five facts about green tea and its history", "about nothing"),
])
def test_a_rewrite_that_echoes_its_prompt_or_drifts_is_refused(answer, why):
    server = LoopbackServer(responder=lambda body: json.dumps({"requirement": answer}))
    server.start()
    try:
        flowmagic.configure(base_url=server.base_url, model="m")
        llm = fast_llm()
        fixed = run(lambda: refine_instruction(Workflow.from_dict(PLAN), "parse", None, llm), llm)
    finally:
        server.stop()
    requirement = fixed.update["subtasks"][0]["requirement"]
    assert requirement.startswith("parse the dates of sales.csv")
    assert answer.strip() not in requirement.split("\n")[0] or not answer.strip()
    assert not fixed.model_used and why in fixed.reason


def test_a_good_rewrite_is_kept():
    node = Workflow.from_dict(PLAN).nodes["parse"]
    good = "Parse the date column of sales.csv with pandas.to_datetime and print the range."
    assert refusal(good, node, TASK, "no table was given") is None
    assert re.search("repeated the requirement",
                     refusal("Parse the dates  of sales.csv", node, TASK, "") or "")


def test_each_call_of_a_node_says_why_it_was_made():
    from flowmagic.engine.calls import calls_text, node_calls
    wf = Workflow.from_dict({"task": "t", "nodes": [{"id": "a", "requirement": "r"}], "edges": []})
    node = wf.nodes["a"]
    node.attempts = [
        {"attempt": 1, "start": 1.0, "why": "attempt", "call_id": 1, "continuations": 1,
         "judged": True, "feedback": "too short"},
        {"attempt": 2, "start": 3.0, "error": "injected failure (fail_rate)", "output": None},
        {"attempt": 3, "start": 5.0, "why": "rerun", "call_id": 4, "cached": True}]
    log = [{"kind": "refine_instruction", "trigger": ["a"], "time": 4.0, "calls": 1},
           {"kind": "replan", "trigger": ["b"], "time": 4.5, "calls": 2}]
    rows = node_calls(node, log)
    assert [r["why"] for r in rows] == [
        "attempt (#1)", "continuation 1 of #1 (cut at the token limit)",
        "validation of #1 by the judge", "repair: refine instruction", "rerun (#3)"]
    assert calls_text(rows).startswith("5 model calls (1 from the cache): attempt (#1) · ")


def test_feedback_on_an_attempt_without_an_answer_joins_the_prompts_user_message():
    from flowmagic.engine.node_runner import _continued
    from flowmagic.engine.validation import retry_turns
    prompt = [{"role": "system", "content": "rules"}, {"role": "user", "content": "do it"}]
    turns = retry_turns([{"output": None, "error": "injected failure", "passed": False},
                         {"output": "ans", "feedback": "wrong", "passed": False}], "a", "End.")
    messages = _continued(prompt, turns)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"].startswith("do it\n\nYour subtask (a) is not done yet: attempt 1")
    assert messages[2]["content"] == "ans" and messages[3]["content"].endswith("wrong\n\nEnd.")
    assert prompt[1]["content"] == "do it"   # the node's prompt itself is left as it was


def test_the_last_subtasks_code_that_prints_nothing_goes_back_and_a_parents_does_not():
    """dabench-dev q114: the one subtask's code found the answer, printed nothing, and the
    summary answered "none". A subtask whose names a later one reads may print nothing (and
    so may any subtask of a task with no answer form: tests/test_session.py)."""
    def agent(body):
        prompt = body["messages"][-1]["content"]
        if "printed nothing" in prompt:
            return fenced("top = df['y'].max()\nprint('highest y', top)")
        if "Your subtask (prep)" in prompt:
            return fenced("ys = df['y']")
        return fenced("top = df['y'].max()")

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        plan = {"task": "Using anscombe.csv, find the highest y.\n\n"
                        "Answer format: @highest_y[value]",
                "nodes": [{"id": "prep", "requirement": "Keep the y column.", "agent": "analyst"},
                          {"id": "stats", "requirement": "Find the highest y.", "agent": "analyst"}],
                "edges": [["prep", "stats"]]}
        flow = Flow.from_dict(plan, name="quiet", inputs=[CSV], starter="off", update="off")
        flow.run()
        prompts = node_prompts(server)
    prep, stats = flow.workflow.nodes["prep"], flow.workflow.nodes["stats"]
    assert prep.status == "done" and len(prep.attempts) == 1   # its child reads `ys`
    assert stats.status == "done" and len(prompts) == 2
    assert "ran without error but printed nothing" in prompts[1]
    assert "highest y 12.74" in stats.output


def test_a_keyword_a_function_does_not_take_is_named_and_ddof_is_said_to_be_for_spreads():
    """q25 of issue 29's seventh sample: told that a standard deviation is the sample one
    (ddof=1), the bench model wrote `skew(ddof=1)`; the retry said only the TypeError, and the
    next answer imported the table as a module. The retry names the argument to leave out."""
    answers = [fenced("s = df['y'].skew(ddof=1)\nprint(s)"), fenced("print(df['y'].skew())")]

    said = retried(answers)[1][-1]["content"]
    assert "got an unexpected keyword argument 'ddof'" in said
    assert "skew() takes no argument 'ddof': leave it out of that call." in said
    assert "Only the standard deviation and variance take ddof" in said


def test_the_answers_form_written_as_a_line_of_code_is_said_to_be_printed():
    """q25 and q300 (issue 29, the task's one subtask asked to print the form): the bench model
    wrote `@bmi_distribution[normal]` as a statement under an if, three times on q25, and each
    retry said only the IndentationError it caused two lines further."""
    answers = [fenced("s = df['y'].skew()\nif abs(s) < 0.5:\n    @y_shape[normal]\nelse:\n"
                      "    @y_shape[skewed]"),
               fenced("s = df['y'].skew()\nprint('@y_shape[normal]' if abs(s) < 0.5 else "
                      "'@y_shape[skewed]')")]

    said = retried(answers)[1][-1]["content"]
    assert "A line of your code is the answer's form written as Python (@y_shape[normal])" in said
    assert "write that line as print('@y_shape[normal]')" in said
    assert 'print(f"@y_shape[{value}]")' in said
