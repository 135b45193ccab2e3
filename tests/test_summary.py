"""The closing summary states the numbers the task asked for, in the form it prescribes,
copied from the printed outputs (engine/summary.py, engine/answerform.py)."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

import flowmagic
from flowmagic.engine import answerform, summary
from flowmagic.flow import Flow
from flowmagic.model.graph import Workflow
from flowmagic.model.status import Status
from flowmagic.ops.nbrun import TEMPLATES
from flowmagic.testing.loopback import LoopbackServer

from conftest import is_summary

CSV = TEMPLATES / "data" / "anscombe.csv"
FRAME = pd.read_csv(CSV)
MEAN = round(FRAME["y"].mean(), 4)          # 7.5007
ABOVE_9 = int((FRAME["y"] > 9).sum())        # 7
FORM = "Answer format: @mean_y[mean_value] where \"mean_value\" is rounded to 4 decimal places."
TASK = f"Using anscombe.csv, calculate the mean of y.\n\n{FORM}"
PLAN = {"task": TASK,
        "nodes": [{"id": "stats", "requirement": "Compute the mean of y.", "agent": "analyst"},
                  {"id": "report", "requirement": "Write the finding.", "agent": "writer"}],
        "edges": [["stats", "report"]]}
STATS = ("```python\nprint('mean of y', round(df['y'].mean(), 4))\n```\n\n"
         "The mean of y is as printed.")
PARAPHRASE = (f"The data was loaded and the mean of y computed: the output indicates that the "
              f"mean of y is {MEAN}.")   # what the bench model wrote on dabench-dev q0


def run_flow(agent, plan=PLAN):
    """(the flow run against `agent`, the messages of every summary request)."""
    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="summ", inputs=[CSV], starter="off", update="off")
        flow.run()
        sent = [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]
                if r["path"].endswith("/chat/completions")]
    return flow, [m for m in sent if is_summary(m)]


def nodes_answer(stats=STATS, report="The mean of y is as the analysis printed."):
    def agent(messages):
        return stats if "Your subtask (stats)" in messages[-1]["content"] else report
    return agent


def pairs(text):
    return dict(re.findall(r"@(\w+)\[(.*?)\]", text or ""))


def test_the_result_gives_the_form_the_task_prescribes_with_the_value_the_code_printed():
    """A writer that follows the last words it is given (as a small model does): told only
    "briefly: what was done and what it found", it paraphrases and the form is lost."""
    nodes = nodes_answer()

    def agent(body):
        messages = body["messages"]
        if not is_summary(messages):
            return nodes(messages)
        prompt = messages[-1]["content"]
        printed = re.search(r"^mean of y (\S+)$", prompt, re.MULTILINE)
        if "@mean_y[" in prompt[-400:] and printed:   # asked for the form, with the printout at hand
            return f"The mean of y was computed from the data.\n\n@mean_y[{printed.group(1)}]"
        return PARAPHRASE

    flow, summaries = run_flow(agent)
    assert flow.status == "done", flow.message
    assert pairs(flow.result) == {"mean_y": str(MEAN)}
    assert len(summaries) == 1   # right the first time: nothing went back
    prompt = summaries[0][-1]["content"]
    assert FORM in prompt[prompt.index("Results of the subtasks"):]   # the task's own words, again
    assert "print('mean of y'" not in prompt   # the code is the node's, the printout is the summary's
    table = flow.trace_numbers()
    assert list(table["number"]) == [str(MEAN)] and list(table["node"]) == ["stats"]


def test_a_summary_without_the_form_goes_back_once_naming_it_and_is_marked_if_still_without():
    nodes = nodes_answer()
    asked = []

    def agent(body):
        messages = body["messages"]
        if not is_summary(messages):
            return nodes(messages)
        asked.append(body)
        if "Answer with one JSON value" in messages[-1]["content"]:   # the form's values
            return json.dumps({"mean_y": str(MEAN)})
        if "does not give the answer in the form" in messages[-1]["content"]:
            return "@0[0]"   # as the bench model answered dabench-dev q468, twice
        return PARAPHRASE

    flow, _ = run_flow(agent)
    assert len(asked) == 2 and "lacks @mean_y[mean_value]" in asked[1]["messages"][-1]["content"]
    assert "one JSON object with exactly these keys: \"mean_y\"" in asked[1]["messages"][-1]["content"]
    assert '"required":["mean_y"],"additionalProperties":false' in asked[1]["messages"][-1]["content"]
    assert flow.result.startswith(f"{PARAPHRASE}\n\n@mean_y[{MEAN}]")   # the form written here
    assert pairs(flow.result) == {"mean_y": str(MEAN)}

    flow, summaries = run_flow(lambda body: (PARAPHRASE if is_summary(body["messages"])
                                             else nodes(body["messages"])))
    assert len(summaries) == 2 and flow.result.count(PARAPHRASE) == 1
    assert flow.result.endswith("[the answer form the task prescribes is missing: "
                                "a value for mean_y]")
    assert pairs(flow.result) == {}   # the mark holds no pair a reader would take for the answer


def test_a_subtask_is_not_shown_the_answer_form_so_it_writes_code_and_the_summary_fills_it():
    """Shown "Answer format: @mean_y[...]", the bench model answered a code subtask with the
    form and a made-up value, no code (dabench-dev q6, q9, q521), again when sent back."""
    node_prompts = []

    def agent(body):
        messages = body["messages"]
        prompt = messages[-1]["content"]
        if is_summary(messages):
            printed = re.search(r"^mean of y (\S+)$", prompt, re.MULTILINE)
            return f"@mean_y[{printed.group(1)}]" if "@mean_y[" in prompt and printed else "?"
        node_prompts.append(prompt)
        if "@mean_y[" in prompt:   # drawn into the form, as the bench model is
            return "@mean_y[7.1234]"
        return STATS if "Your subtask (stats)" in prompt else "The mean of y is as printed."

    flow, summaries = run_flow(agent)
    assert pairs(flow.result) == {"mean_y": str(MEAN)}, flow.result
    assert node_prompts and not any("@mean_y[" in p for p in node_prompts)
    assert "Using anscombe.csv, calculate the mean of y." in node_prompts[0]   # the rest is kept
    assert FORM in summaries[0][-1]["content"]


@pytest.mark.parametrize("task, seen", [
    (TASK, "Using anscombe.csv, calculate the mean of y."),
    ("Count the rows. Report it as @rows[n] where n is an integer. Then plot y.\n\nData: a.csv",
     "Count the rows. Then plot y.\n\nData: a.csv"),
    ("Describe the data in the following format: a JSON object {\"rows\": n}.",   # no pairs: as is
     "Describe the data in the following format: a JSON object {\"rows\": n}."),
])
def test_a_subtask_sees_the_task_without_its_pair_form(task, seen):
    assert answerform.without_pairs(task) == seen


COUNT_TASK = ("How many of the 44 rows of anscombe.csv have a y above 9?\n\n"
              "Answer format: @rows_above[count] where \"count\" is an integer.")
COUNT_PLAN = {"task": COUNT_TASK,
              "nodes": [{"id": "count", "requirement": "Count the rows with y above 9.",
                         "agent": "analyst"}], "edges": []}


@pytest.mark.parametrize("paraphrased", ["44", "6"])   # the task's own number; a single digit
def test_a_summary_that_paraphrases_the_answer_into_a_new_number_is_caught(paraphrased):
    count = "```python\nprint('rows above 9:', int((df['y'] > 9).sum()))\n```\n\nCounted."
    asked = []

    def agent(body):
        messages = body["messages"]
        if not is_summary(messages):
            return count
        asked.append(messages)
        if len(asked) == 1:
            return f"The rows were counted. @rows_above[{paraphrased}]"
        return f"The rows were counted. @rows_above[{ABOVE_9}]"

    flow, _ = run_flow(agent, COUNT_PLAN)
    assert flow.workflow.nodes["count"].execution["stdout"] == f"rows above 9: {ABOVE_9}\n"
    assert len(asked) == 2
    assert f"appear in no printed output above: {paraphrased}" in asked[1][-1]["content"]
    assert pairs(flow.result) == {"rows_above": str(ABOVE_9)}


def test_a_node_that_gave_the_whole_answer_in_the_form_with_traced_values_is_the_result():
    """As on dabench-dev q6: the last node stated the right values in the form; a summary
    written over it lost them. No summary call is made."""
    nodes = nodes_answer(report=f"@mean_y[{MEAN}]")

    def agent(body):
        messages = body["messages"]
        return PARAPHRASE if is_summary(messages) else nodes(messages)

    flow, summaries = run_flow(agent)
    assert summaries == [] and pairs(flow.result) == {"mean_y": str(MEAN)}
    assert "as subtask report gave it" in flow.result
    assert list(flow.trace_numbers()["node"]) == ["stats"]
    assert "consolidate" not in {row["purpose"] for row in flow.cost_data()["rows"]}


# --------------------------------------------------------------- the rule, as tables
@pytest.mark.parametrize("task, words, pairs_, keys", [
    (TASK, FORM, (("mean_y", "mean_value"),), ()),
    ("Find the mean. Report it as a percentage with one decimal.",
     "Report it as a percentage with one decimal.", (), ()),
    ("Count rows. Return the result as JSON: {\"rows\": 0, \"mean\": 0.0}",
     "Return the result as JSON: {\"rows\": 0, \"mean\": 0.0}", (), ("rows", "mean")),
    ("Answer in the following format: mean=<value>", "Answer in the following format: mean=<value>",
     (), ()),
    ("Q.\n\nAnswer format: @per_month[{'month_1':avg_1, 'month_2':avg_2",   # cut open
     "Answer format: @per_month[{'month_1':avg_1, 'month_2':avg_2",
     (("per_month", "{'month_1':avg_1, 'month_2':avg_2"),), ()),
])
def test_the_form_a_task_prescribes_is_found_in_its_own_words(task, words, pairs_, keys):
    form = answerform.prescribed(task)
    assert (form.words, form.pairs, form.keys) == (words, pairs_, keys)


@pytest.mark.parametrize("task", [
    "Write a report on data.csv with three findings.",
    "Summarise the columns as well as the means. Save them to results.json.",
    "Report statistics such as the mean and the median.",
])
def test_a_task_that_prescribes_no_form_has_none(task):
    assert answerform.prescribed(task) is None


@pytest.mark.parametrize("text, lacking", [
    (f"@mean_y[{MEAN}]", []),
    (f"the mean is {MEAN}", ["@mean_y[mean_value]"]),
    ("@mean_y[mean_value]", ["@mean_y[mean_value]"]),   # the placeholder is no value
    ("@mean_y[]", ["@mean_y[mean_value]"]),
])
def test_a_text_lacks_the_pairs_it_does_not_fill(text, lacking):
    assert answerform.missing(answerform.prescribed(TASK), text) == lacking


def test_a_json_shape_is_present_only_with_every_key():
    form = answerform.prescribed('Return the result as JSON: {"rows": 0, "mean": 0.0}')
    assert answerform.missing(form, 'Result: {"rows": 44, "mean": 7.5}') == []
    assert answerform.missing(form, '{"rows": 44}') == ['a JSON object with the keys "rows", "mean"']


def _workflow(answers: dict[str, str], printed: str, task: str = TASK) -> Workflow:
    """Done nodes in a chain, the first of which printed `printed`."""
    ids = list(answers)
    wf = Workflow.from_dict({"task": task, "nodes": [
        {"id": i, "requirement": "r", "agent": "a"} for i in ids],
        "edges": [[a, b] for a, b in zip(ids, ids[1:])]})
    for i, text in answers.items():
        node = wf.nodes[i]
        node.status, node.output = Status.DONE, text
    wf.nodes[ids[0]].execution = {"ran": True, "ok": True, "stdout": printed}
    return wf


def test_a_node_answer_in_the_form_is_kept_only_when_every_value_traces():
    form = answerform.prescribed(TASK)
    assert summary.kept_answer(_workflow({"a": "@mean_y[7.5007]"}, "7.5007\n"), form) == (
        "a", "@mean_y[7.5007]", "stated")
    assert summary.kept_answer(_workflow({"a": "@mean_y[8.12]"}, "7.5007\n"), form) is None
    assert summary.kept_answer(_workflow({"a": "```python\nprint('@mean_y[7.5007]')\n```"},
                                         "7.5007\n"), form) is None   # code is no answer


def test_what_code_printed_in_the_form_comes_before_a_later_answer_that_swapped_the_values():
    """As on dabench-dev q6 (8b816b0): the first node's code printed the four right values,
    a later node put them in the wrong slots (each still traces)."""
    task = "Means of y and x.\n\nAnswer format: @mean_y[value], @mean_x[value]"
    wf = _workflow({"a": "Computed.", "b": "@mean_y[9.0], @mean_x[7.5007]"},
                   "@mean_y[7.5007], @mean_x[9.0]\n", task)
    assert summary.kept_answer(wf, answerform.prescribed(task)) == (
        "a", "@mean_y[7.5007], @mean_x[9.0]", "printed")


def test_a_value_the_summary_copied_unrounded_is_rounded_as_the_task_asks():
    """The subtasks are not shown the form, so their code prints what it computed, and the
    summary copies it: dabench-dev q210's result was @mean_neg[0.0687] where the task asked
    for two places (the label 0.07). The result rounds it, and it still traces."""
    whole = FRAME["y"].mean()   # 7.500681818181818...
    stats = "```python\nprint('mean of y', df['y'].mean())\n```"

    def agent(body):
        messages = body["messages"]
        if not is_summary(messages):
            return nodes_answer(stats=stats)(messages)
        printed = re.search(r"^mean of y (\S+)$", messages[-1]["content"], re.MULTILINE)
        return f"The mean of y was computed.\n\n@mean_y[{printed.group(1)}]"

    flow, _ = run_flow(agent)
    assert flow.status == "done", flow.message
    assert pairs(flow.result) == {"mean_y": f"{whole:.4f}"}
    table = flow.trace_numbers()
    assert list(table["number"]) == [f"{whole:.4f}"] and list(table["node"]) == ["stats"]


@pytest.mark.parametrize("words, text, out", [
    ("@m[v] where v is rounded to two decimal places.", "@m[0.0687]", "@m[0.07]"),
    ("@m[v], a float rounded to 2 decimals.", "@m[-3.14159] and @m[12]", "@m[-3.14] and @m[12]"),
    ("@m[v] rounded to four decimal places.", "@m[0.5]", "@m[0.5]"),            # fewer: kept
    ("@m[v] rounded to two decimal places.", "@m[1.57e-10]", "@m[1.57e-10]"),   # not plain
    ("@m[v] rounded to two decimal places.", "@other[0.123]", "@other[0.123]"),  # not the form's
    ("@m[v] to two decimal places and @p[p] to four decimal places.", "@m[0.0687] @p[0.123456]",
     "@m[0.0687] @p[0.123456]"),   # which value gets which places is not read: left as written
    ("@m[v], the mean.", "@m[0.0687]", "@m[0.0687]"),   # no places asked
    # per value, where a clause names its placeholder (dabench-dev q668, q144)
    ('@r[r_value], @p[p_value], @s[s] where "r_value" is a number between -1 and 1, rounded '
     'to two decimal places; "p_value" is a number between 0 and 1, rounded to four decimal '
     'places; "s" is a boolean', "@r[0.1333], @p[0.03241234], @s[true]",
     "@r[0.13], @p[0.0324], @s[true]"),
    ('@mean_dem[mean_dem]\n@std_dem[std_dem]\nwhere "mean_dem" is the mean, rounded to two '
     'decimal places.\nwhere "std_dem" is the standard deviation, rounded to three decimal '
     'places.', "@mean_dem[42.1234] @std_dem[1.23456]", "@mean_dem[42.12] @std_dem[1.235]"),
    # in the placeholder itself (dabench-dev q269: the summary's 0.9915 scored wrong for 0.99)
    ("@kind[a string] @r[The Pearson correlation coefficient, rounded to two decimal places] "
     "@p[The p-value of the test, rounded to three decimal places]",
     "@kind[Positive] @r[0.9915] @p[0.00012]", "@kind[Positive] @r[0.99] @p[0.000]"),
    # one sentence for all, each part opening with its quoted placeholder (q685)
    ('@r[r_value] @p[value] @s[significance], where "r_value" is a number between -1 and 1, '
     'rounded to two decimal places, "value" is the p-value of the test, rounded to four '
     'decimal places, and "significance" is a string', "@r[0.3418] @p[0.102345] @s[no]",
     "@r[0.34] @p[0.1023] @s[no]"),
])
def test_values_are_rounded_to_the_places_the_form_asks_for_them(words, text, out):
    form = answerform.prescribed(f"Compute it.\n\nAnswer format: {words}")
    assert answerform.rounded(form, text) == out


def test_a_result_whose_form_values_no_output_holds_sends_their_node_back_once_by_name():
    """dabench-dev q308: the node's code kept no row ('Mr' is not 'Mr.') and printed
    "Other 32.2"; the summary's values traced nowhere. The node is asked once more, for the
    values by name, and the result is written from what it then prints."""
    plan = {"task": TASK, "nodes": [{"id": "stats", "requirement": "Compute the mean of y.",
                                     "agent": "analyst"}], "edges": []}
    node_prompts = []

    def agent(body):
        messages = body["messages"]
        prompt = messages[-1]["content"]
        if is_summary(messages):
            printed = re.search(r"^mean_y (\S+)$", prompt, re.MULTILINE)
            return f"@mean_y[{printed.group(1) if printed else '7.77'}]"
        node_prompts.append(prompt)
        if "no output held: mean_y" in prompt:
            return "```python\nprint('mean_y', round(df['y'].mean(), 4))\n```"
        return "```python\nprint('count of x', df['x'].count())\n```"

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="again", inputs=[CSV], starter="off")
        flow.run()
    assert flow.status == "done", flow.message
    assert pairs(flow.result) == {"mean_y": str(MEAN)}, flow.result
    assert len(node_prompts) == 2 and "Its code printed:\ncount of x 44" in node_prompts[1]
    assert [e["kind"] for e in flow.update_log] == ["answer_check"]
    # once a run: a node that still prints something else leaves the value withheld
    with LoopbackServer(responder=lambda body: (
            "@mean_y[7.77]" if is_summary(body["messages"])
            else "```python\nprint('count of x', df['x'].count())\n```")) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="again2", inputs=[CSV], starter="off")
        flow.run()
        calls = len(server.stats(bodies=True)["requests"])
    assert pairs(flow.result) == {"mean_y": "?"} and calls == 6   # 2 node, 2 x 2 summary


def test_the_summary_of_a_flow_on_data_opens_with_the_start_its_nodes_prompts_share():
    """A server that keeps a node's prompt evaluates only what follows the start the summary
    shares with it: opening with a system message of its own, the summary reused 4 of its
    ~1,200 prompt tokens on dabench-dev's embedded flows. On data it opens with the house rules
    and the nodes' start up to their working start (the task without its form, which the ending
    gives); it says its answer is not run; a text flow's summary opens as before."""
    sent: dict[str, list] = {}

    def agent(body):
        sent.setdefault(name, []).append(body["messages"])
        return (f"The mean of y is {MEAN}.\n\n@mean_y[{MEAN}]" if is_summary(body["messages"])
                else STATS)

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        for name, inputs in (("data", [CSV]), ("text", None)):
            flow = Flow.from_dict(PLAN, name=name, inputs=inputs, starter="off",
                                  update="off", execute="auto" if inputs else "off")
            flow.run()
            assert flow.status == "done", flow.message
    (node, summ), (text_node, text_summ) = (
        (calls[0], next(m for m in calls if is_summary(m))) for calls in sent.values())
    assert summ[0] == node[0]   # the house rules
    start = node[1]["content"].split("\n\nA working start")[0]
    assert "anscombe.csv (table)" in start and "Answer format" not in start
    assert summ[1]["content"].startswith(start + f"\n\n{summary.SYSTEM} Write prose")
    # then the summary's own prompt, the whole task again (the bench model lost q10's
    # direction with the task only in the start, ~1,000 tokens back)
    assert f"Write prose: nothing you write now is run.\n\nTask:\n{TASK}\n\nResults" \
        in summ[1]["content"]
    assert FORM in summ[1]["content"][len(start):]   # the form, in the ending
    assert text_summ[0]["content"] == summary.SYSTEM and text_summ[0] != text_node[0]
    assert text_summ[1]["content"].startswith(f"Task:\n{TASK}")


MEAN_TASK = ("What is the mean of y in anscombe.csv?\n\n"
             "Answer format: @mean_y[mean] where \"mean\" is rounded to 4 decimal places.")


def test_a_summary_number_cut_short_instead_of_rounded_goes_back_with_it_rounded():
    """dabench-dev q684: the code printed 0.9165830498668011, the summary wrote 0.9165 twice
    (cut short: rounded it is 0.9166) and was told only that 0.9165 was printed nowhere; the
    number was then withheld. The retry says it is the printed one cut short, and rounded."""
    plan = {"task": MEAN_TASK, "nodes": [{"id": "mean", "requirement": "Compute the mean of y.",
                                          "agent": "analyst"}], "edges": []}
    printed = repr(float(FRAME["y"].mean()))
    cut = printed[:printed.index(".") + 5]
    rounded = f"{float(printed):.4f}"
    assert cut != rounded   # the data makes the two differ (else the test proves nothing)
    asked = []

    def agent(body):
        messages = body["messages"]
        if not is_summary(messages):
            return "```python\nprint('mean of y:', repr(float(df['y'].mean())))\n```"
        asked.append(messages)
        if "cut short" in messages[-1]["content"]:
            return f"The mean was computed. @mean_y[{rounded}]"
        return f"The mean was computed. @mean_y[{cut}]"

    flow, _ = run_flow(agent, plan)
    assert len(asked) == 2, flow.message
    said = asked[1][-1]["content"]
    assert f"appear in no printed output above: {cut}." in said
    assert f"{cut} is {printed} cut short, not rounded: rounded to 4 decimals it is {rounded}." in said
    assert pairs(flow.result) == {"mean_y": rounded}


def test_a_value_the_summary_rounded_to_fewer_places_than_the_form_asks_is_written_from_its_print():
    """dabench-dev q685: the code printed the p-value 0.10233..., the form asks four places, and
    the summary wrote 0.10 (it traces, as a rounding, so no check sent it back); the label is
    0.1023. The value is written again from the printed number, to the places asked."""
    task = ("Using anscombe.csv, test the correlation of x and y.\n\nAnswer format: @r[r_value] "
            '@p[p_value], where "r_value" is rounded to two decimal places and "p_value" is '
            "rounded to four decimal places.")
    plan = {"task": task, "nodes": [{"id": "stats", "requirement": "Compute r and its p-value.",
                                     "agent": "analyst"}], "edges": []}

    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return "The correlation was tested.\n\n@r[0.82] @p[0.00]"
        return "```python\nprint('r', 0.816420516, 'p', 0.0021696288)\n```"

    flow, _ = run_flow(agent, plan)
    assert flow.status == "done", flow.message
    assert pairs(flow.result) == {"r": "0.82", "p": "0.0022"}


ONE_NODE = {"task": TASK, "nodes": [{"id": "stats", "requirement": "Compute the mean of y.",
                                      "agent": "analyst"}], "edges": []}
# the node prints the mean, not in the task's form: the summary writes the form
ONE_NODE_ANSWER = ("```python\nprint('mean of y', round(df['y'].mean(), 4))\n```\n\n"
                   "The mean of y is printed above.")


def _one_node_run(answers):
    """The loopback agent of a one-node flow on data: its node answers with `answers` in
    turn, its summary gives the mean in the form."""
    given = iter(answers)

    def agent(body):
        if is_summary(body["messages"]):
            return f"The mean of y was computed.\n\n@mean_y[{MEAN}]"
        return next(given)

    return agent


def _requests(server) -> list[list[dict]]:
    return [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]
            if r["path"].endswith("/chat/completions")]


def test_the_summary_of_a_one_node_flow_goes_on_from_the_nodes_own_conversation():
    """A one-node flow on data (most dabench-dev flows) wrote its summary as a new prompt: the
    start it shares with the node, then the task, the node's subtask and its result restated,
    which a server that holds the node's prompt and answer evaluated again (SmolLM2, q6: 767
    of 1,501 tokens). Now the summary is the next turn of the node's conversation: the node's
    prompt and answer exactly as sent and received, then what its code printed, the task
    again and the form to end with."""
    with LoopbackServer(responder=_one_node_run([ONE_NODE_ANSWER])) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(ONE_NODE, name="one", inputs=[CSV], starter="off", update="off")
        flow.run()
        sent = _requests(server)
    assert flow.status == "done", flow.message
    assert pairs(flow.result) == {"mean_y": str(MEAN)}, flow.result
    (node,) = [m for m in sent if not is_summary(m)]
    (summ,) = [m for m in sent if is_summary(m)]
    assert summ[:len(node)] == node
    assert summ[len(node)] == {"role": "assistant", "content": ONE_NODE_ANSWER}
    assert len(summ) == len(node) + 2 and summ[-1]["role"] == "user"
    request = summ[-1]["content"]
    assert request.startswith(f"{summary.SYSTEM} Write prose: nothing you write now is run.\n\n"
                              f"Task:\n{TASK}\n\nWhat your code printed")
    assert f"mean of y {MEAN}" in request and request.rstrip().endswith("a printed output above.")
    assert FORM in request and "```" not in request   # not the code again: it is in the answer


def test_a_rerun_nodes_new_answer_is_the_conversation_its_summary_goes_on_from():
    """The node run again answers anew: the summary goes on from that answer, not the first."""
    again = ONE_NODE_ANSWER.replace("round(df['y'].mean(), 4)", "round(float(df.y.mean()), 4)")
    with LoopbackServer(responder=_one_node_run([ONE_NODE_ANSWER, again])) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(ONE_NODE, name="rerun", inputs=[CSV], starter="off",
                              update="off")
        flow.run()
        flow.rerun("stats")
        sent = _requests(server)
    assert flow.status == "done", flow.message
    summaries = [m for m in sent if is_summary(m)]
    assert len(summaries) == 2
    assert [m[-2]["content"] for m in summaries] == [ONE_NODE_ANSWER, again]


def test_a_summary_written_again_after_a_restart_is_laid_out_from_the_store():
    """The conversation lives in the process that ran the node (nothing more is stored): a
    flow loaded after a kernel restart writes its summary as before, from what is stored."""
    fail = {"on": True}

    def agent(body):
        if is_summary(body["messages"]) and fail["on"]:
            raise RuntimeError("the endpoint is down")   # (the server answers HTTP 500)
        return _one_node_run([ONE_NODE_ANSWER])(body)

    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(ONE_NODE, name="restart", inputs=[CSV], starter="off",
                              update="off")
        flow.run()
        assert flow.result is None and "run() again" in (flow.message or "")
        fail["on"] = False
        again = flowmagic.load(flow.run_id)   # a new Flow object, as after a restart
        again.run()
        (summ,) = [m for m in _requests(server)[-1:] if is_summary(m)]
    assert pairs(again.result) == {"mean_y": str(MEAN)}, again.result
    assert len(summ) == 2 and summ[0]["content"] == summary.HOUSE_RULES
    assert summ[1]["content"].count(f"Task:\n{TASK}") == 1 and "mean of y" in summ[1]["content"]
