"""The rule for numbers that trace to code (flowmagic.engine.numbers), as a table."""

import pytest

from flowmagic.engine.numbers import (CLAIM_MARK, NOT_RUN, WITHHELD_MARK, withhold, stated_numbers, strip_claims, trace,
                                      untraced, without_code)

OUT = [("stats", "species"),
       ("stats", "Adelie       3700.662252"),
       ("stats", "Gentoo       5076.016260"),
       ("fit", "R-squared: 0.8268"),
       ("fit", "const  37.227270  wt  -3.877831  hp -0.031773"),
       ("fit", "share 0.4521"),
       ("fit", "rows 1203441"),
       ("fit", "3.700662e+03")]


@pytest.mark.parametrize("text, traces_to", [
    ("The mean body mass of Adelie is 3700.66 g.", "Adelie       3700.662252"),   # rounded
    ("Adelie weighs about 3701 g", "Adelie       3700.662252"),                   # to a unit
    ("Adelie weighs 3700.7 g", "Adelie       3700.662252"),
    ("in scientific form 3.70066e3", "Adelie       3700.662252"),
    ("Gentoo: 5,076.02 g", "Gentoo       5076.016260"),                            # grouped
    ("R squared is 0.83", "R-squared: 0.8268"),
    ("mpg falls by 3.88 per unit of wt", "const  37.227270  wt  -3.877831  hp -0.031773"),  # sign
    ("the weight coefficient is -3.8778", "const  37.227270  wt  -3.877831  hp -0.031773"),
    ("45.2% of the rows", "share 0.4521"),                                         # a fraction
    ("about 1.2 million rows", "rows 1203441"),                                    # a scale
    ("the coefficient of hp is −0.03", "const  37.227270  wt  -3.877831  hp -0.031773"),
])
def test_a_stated_number_traces_to_the_printed_line_that_holds_it(text, traces_to):
    [stated] = stated_numbers(text)
    [traced] = trace([stated], OUT)
    assert traced.line == traces_to and traced.node is not None


@pytest.mark.parametrize("text", [
    "The mean body mass of Adelie is 4865.95 g.",    # the invented number of the issue
    "R squared is 0.82",                              # 0.8268 does not round to 0.82
    "12.5% of the rows",
])
def test_a_number_no_output_holds_traces_nowhere(text):
    stated = stated_numbers(text)
    traced = trace(stated, OUT)
    assert len(stated) == 1 and untraced(traced) == [stated[0].text]


@pytest.mark.parametrize("text", [
    "In 2023 the survey counted penguins",           # a year
    "the 3rd and 21st rows",                         # ordinals
    "1. First finding\n2. Second finding\n12. Twelfth",   # list markers
    "three findings from 3 species",                 # a single digit
    "Qwen2.5 and log10 and x1 and sha256 and 3D",    # digits inside names
    "on 2024-01-31 at 10:30",                        # a date, a time
    "```python\nprint(df.head(20))\n```\nand `df.iloc[:25]`",   # code
    "the top 15 cars, as the task asks",             # given by the task
])
def test_numbers_that_need_no_code_are_not_checked(text):
    assert stated_numbers(text, given=["Show the top 15 cars"]) == []


def test_an_output_block_written_by_the_model_is_left_out_and_marked():
    answer = ("```python\nprint(df['body_mass_g'].mean())  # 4865.95\n# mean is 4865.95\n"
              "x = 1\n```\n\nOutput:\n```\n4865.95\n```\n\n"
              "**Expected output:**\n4865.95\n3.5\n\nThe code computes the mean.\n"
              "```output\n12.0\n```\n")
    stripped = strip_claims(answer)
    assert "4865.95" not in stripped and "12.0" not in stripped
    assert stripped.count(CLAIM_MARK) == 3
    assert "print(df['body_mass_g'].mean())\n" in stripped and "x = 1" in stripped
    assert "The code computes the mean." in stripped
    prose = "Result: the team wrote 4 pages.\nOutput: a report of 1200 words."
    assert strip_claims(prose) == prose   # no code, nothing predicted
    # prose before the code, and a deliverable kept whole (its comments are the file's)
    later = ("Here is the analysis.\n\n```python\nprint(2 + 2)  # 4\n```\n\nThis prints:\n4\n\n"
             "```python board.py\nSIZE = 15  # a 15x15 board\n```\n")
    stripped = strip_claims(later)
    assert "print(2 + 2)\n```" in stripped and "This prints" not in stripped
    assert "SIZE = 15  # a 15x15 board" in stripped and stripped.count(CLAIM_MARK) == 1
    page = "```python\nx = 1\n```\n```html index.html\n<p>\nResult:\n</p>\n```\n"
    assert strip_claims(page) == page   # a deliverable's own lines are not claims
    assert without_code(later) == ("Here is the analysis.\n\n" + NOT_RUN + "\n\nThis prints:\n4\n\n"
                                   "```python board.py\nSIZE = 15  # a 15x15 board\n```")



@pytest.mark.parametrize("head", ["The output will be:", "The result is:", "This will print:"])
def test_a_guess_headed_with_the_or_this_will_is_left_out_too(head):
    """A guess at the printout under a heading such as "The output will be:" (dabench-dev
    q409's node guessed 417 after its code, which printed 687): an unlabelled fence after the
    heading, plain lines, or the rest of its line are the model's claim, not output."""
    for guess in ("```\n417\n```\n", "417\n"):
        stripped = strip_claims(f"```python\nprint(len(df))\n```\n\n{head}\n{guess}")
        assert "417" not in stripped and stripped.count(CLAIM_MARK) == 1
        assert stripped.startswith("```python\nprint(len(df))\n```")
    inline = strip_claims(f"```python\nprint(len(df))\n```\n{head} 417\nThat is all.\n")
    assert "417" not in inline and inline.endswith(f"{CLAIM_MARK}\nThat is all.\n")

# -------------------------------------------------------------------- in a flow (loopback)
import json  # noqa: E402

import nbformat  # noqa: E402
import pandas as pd  # noqa: E402

import flowmagic  # noqa: E402
from flowmagic.flow import Flow  # noqa: E402
from flowmagic.ops.nbrun import TEMPLATES  # noqa: E402
from flowmagic.testing.loopback import LoopbackServer  # noqa: E402

from conftest import is_summary  # noqa: E402

CSV = TEMPLATES / "data" / "anscombe.csv"
TRUE_MEAN = round(pd.read_csv(CSV)["y"].mean(), 4)   # 7.5009
INVENTED = "4865.95"
PLAN = {"task": "Explore anscombe.csv: report the mean of y.",
        "nodes": [{"id": "stats", "requirement": "Print the mean of y.", "agent": "analyst"},
                  {"id": "report", "requirement": "Write the finding.", "agent": "writer"}],
        "edges": [["stats", "report"]]}
STATS = ("```python\nimport pandas as pd\ndf = pd.read_csv('anscombe.csv')\n"
         "print('mean of y', round(df['y'].mean(), 4))  # 4865.95\n```\n\n"
         f"Output:\n```\nmean of y {INVENTED}\n```\n")


def requests(server):
    return [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]
            if r["path"].endswith("/chat/completions")]


def run_flow(agent, plan=PLAN, **settings):
    """(the flow run on PLAN against `agent`, the messages of every chat request)."""
    with LoopbackServer(responder=agent) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="nums", inputs=[CSV], starter="off", **settings)
        flow.run()
        return flow, requests(server)


def prompt_of(sent, node_id):
    return next(m[-1]["content"] for m in sent if f"Your subtask ({node_id})" in m[-1]["content"])


def scripted(summary):
    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return summary(messages)
        prompt = messages[-1]["content"]
        if "Your subtask (stats)" in prompt:
            if "appear in no output of code that ran" in prompt:
                return f"The mean of y is {TRUE_MEAN}."
            return STATS + f"\nThe mean of y is {INVENTED}, well above 3.14159."
        return "The mean of y is as the analysis printed."
    return agent


def test_an_answer_with_invented_numbers_goes_back_once_and_output_blocks_reach_no_child(tmp_path):
    flow, sent = run_flow(scripted(lambda m: f"The mean of y is {TRUE_MEAN}."))
    assert flow.status == "done", flow.message
    stats = flow.workflow.nodes["stats"]
    first, second = stats.attempts
    assert first["untraced"] == [INVENTED, "3.14159"] and not first["passed"]
    stats_prompts = [m[-1]["content"] for m in sent if "Your subtask (stats)" in m[-1]["content"]]
    assert len(stats_prompts) == 2   # back once
    assert f"appear in no output of code that ran: {INVENTED}, 3.14159" in stats_prompts[1]
    assert f"Your code printed:\nmean of y {TRUE_MEAN}" in stats_prompts[1]
    # the answer sent back is the model's own turn before that feedback, not restated in it
    retry = next(m for m in sent if len(m) > 2 and "Your subtask (stats)" in m[1]["content"])
    assert retry[2] == {"role": "assistant", "content": stats.attempts[0]["output"]}
    assert INVENTED not in retry[3]["content"].split("\n", 1)[1].split("Your code printed")[1]
    assert second["passed"] and "untraced" not in second
    assert stats.output.startswith(f"The mean of y is {TRUE_MEAN}.")
    assert f"mean of y {TRUE_MEAN}" in stats.output   # the kept run's printed output
    # the child sees the real output, never the model's "Output:" block
    report_prompt = prompt_of(sent, "report")
    assert INVENTED not in report_prompt and f"mean of y {TRUE_MEAN}" in report_prompt
    table = flow.trace_numbers()
    assert list(table["number"]) == [str(TRUE_MEAN)] and list(table["node"]) == ["stats"]
    assert list(table["line"]) == [f"mean of y {TRUE_MEAN}"]


def test_a_result_stating_a_number_no_output_holds_is_sent_back_once_then_withheld(tmp_path):
    summaries = []

    def summary(messages):
        summaries.append(messages)
        return f"The mean of y is {TRUE_MEAN}; the median is 7.9."

    flow, _ = run_flow(scripted(summary))
    assert len(summaries) == 2
    assert "copied from the printed outputs above exactly" in summaries[0][-1]["content"]
    assert "appear in no printed output above: 7.9" in summaries[1][-1]["content"]
    # the result never states it: [?] where it was, and a line saying why
    assert f"The mean of y is {TRUE_MEAN}; the median is [?]." in flow.result
    assert "7.9" not in flow.result
    assert flow.result.endswith(WITHHELD_MARK)
    table = flow.trace_numbers()
    assert table.to_dict("records") == [
        {"number": str(TRUE_MEAN), "value": TRUE_MEAN, "node": "stats",
         "line": f"mean of y {TRUE_MEAN}"}]
    nb = nbformat.read(str(flow.to_notebook(tmp_path / "nums.ipynb")), as_version=4)
    shown = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "the median is [?]" in shown and "median is 7.9" not in shown


@pytest.mark.parametrize("text, numbers, expected", [
    ("@mean[1.65] @n[5]: 5 columns, 1.65 again", ["1.65", "5"],
     "@mean[?] @n[?]: 5 columns, [?] again"),   # a single digit only in a slot
    ("in 2020 the rate was 12.5%; `x = 12.5`", ["12.5%", "2020"],
     "in 2020 the rate was [?]; `x = 12.5`"),       # code and years kept
    ("11.65 and 1.655 stay", ["1.65"], "11.65 and 1.655 stay"),   # whole numbers only
])
def test_withhold_replaces_exactly_the_numbers_found(text, numbers, expected):
    assert withhold(text, numbers) == expected


def test_a_node_whose_numbers_still_do_not_trace_is_marked_for_its_children_and_the_panel():
    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return "Done."
        if "Your subtask (stats)" in messages[-1]["content"]:
            return STATS + f"\nThe mean of y is {INVENTED}."
        return "Written."

    flow, sent = run_flow(agent, max_attempts=1)
    stats = flow.workflow.nodes["stats"]
    assert stats.status == "done" and len(stats.attempts) == 2   # one extra, for the numbers
    assert stats.attempts[-1]["untraced"] == [INVENTED]
    mark = f"[numbers that trace to no executed output: {INVENTED}]"
    assert stats.output.endswith(mark)
    report_prompt = prompt_of(sent, "report")
    assert mark in report_prompt
    from flowmagic.jupyter.widgets import Panel
    panel = Panel(flow)
    panel.node_picker.value = "stats"
    panel._refresh()
    assert mark in panel.node_info.value
    panel.close()


def test_a_number_stated_without_any_code_on_a_data_task_goes_back_asking_for_code():
    plan = {"task": "Explore anscombe.csv: report the mean of y.",
            "nodes": [{"id": "stats", "requirement": "Report the mean of y.", "agent": "analyst"}],
            "edges": []}

    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return f"The mean of y is {TRUE_MEAN}."
        if "computes and prints each number" in messages[-1]["content"]:
            return ("```python\nimport pandas as pd\n"
                    "print(round(pd.read_csv('anscombe.csv')['y'].mean(), 4))\n```")
        return "@mean_y[29.70]"   # what the bench model answered: no code, an invented number

    flow, _ = run_flow(agent, plan)
    first, second = flow.workflow.nodes["stats"].attempts
    assert first["untraced"] == ["29.70"] and "computes and prints" in first["feedback"]
    assert second["execution"]["stdout"].strip() == str(TRUE_MEAN) and second["passed"]
    assert list(flow.trace_numbers()["node"]) == ["stats"]


def test_a_code_answers_own_output_block_is_left_out_even_when_its_code_ran_and_code_sent_again_is_not_run():
    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return "Done."
        prompt = messages[-1]["content"]
        if "Your subtask (stats)" in prompt and "appear in no output" in prompt:
            return ("```python\ndf['y'] = df['y'] * 2\nprint('mean of y', df['y'].mean())\n```\n"
                    f"The mean of y is {TRUE_MEAN}.")
        if "Your subtask (stats)" in prompt:
            return (STATS.replace(INVENTED, "7.5") + "\nIts mean is 7.5, from 11 rows of 4 groups "
                    "and 44 rows in all.")   # 11 and 44 are printed nowhere
        return "Written."

    flow, sent = run_flow(agent)
    stats = flow.workflow.nodes["stats"]
    first, second = stats.attempts
    assert first["untraced"] == ["11", "44"]
    assert second["execution"] == first["execution"]   # the code sent again did not run
    assert NOT_RUN in stats.output and "df['y'] * 2" not in stats.output
    report_prompt = prompt_of(sent, "report")
    assert f"mean of y {TRUE_MEAN}" in report_prompt and "mean of y 7.5\n" not in report_prompt


def test_an_output_block_is_left_out_of_a_passing_answer_whose_code_ran():
    answer = STATS.replace(INVENTED, "7.5") + "\nThe mean of y is 7.5."   # traces: no send-back

    def agent(body):
        messages = body["messages"]
        if is_summary(messages):
            return "Done."
        return answer if "Your subtask (stats)" in messages[-1]["content"] else "Written."

    flow, sent = run_flow(agent)
    stats = flow.workflow.nodes["stats"]
    assert len(stats.attempts) == 1 and CLAIM_MARK in stats.output
    assert "mean of y 7.5\n" not in stats.output and f"mean of y {TRUE_MEAN}" in stats.output
    report_prompt = prompt_of(sent, "report")
    assert CLAIM_MARK in report_prompt and "mean of y 7.5\n" not in report_prompt
