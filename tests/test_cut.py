"""Nothing is cut silently: answers that stop at the token limit are continued or marked cut,
a child is told when its inputs were cut, the 512-token cap is gone, and an unreadable
verdict is a failure. Model traffic goes to a loopback server that sends finish_reason
"length" when the test says so."""

import re

import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.view.render import draw

PAIR = {"task": "Write two paragraphs on tea", "nodes": [
    {"id": "draft", "requirement": "Draft the text.", "agent": "writer"},
    {"id": "edit", "requirement": "Edit the draft.", "agent": "editor"}],
    "edges": [["draft", "edit"]]}


def chat_bodies(server):
    return [r["body"] for r in server.stats(bodies=True)["requests"]
            if r["path"].endswith("/chat/completions")]


def subtask(body):
    match = re.search(r"Your subtask \((\w+)\)", body["messages"][1]["content"])
    return match.group(1) if match else "summary"


def run_flow(responder, **settings):
    with LoopbackServer(responder=responder) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PAIR, name="pair", **settings)
        flow.run()
        return flow, chat_bodies(server)


def test_an_answer_cut_once_is_continued_and_joined():
    def responder(body):
        if body["messages"][-1]["content"].startswith("Your answer stopped at the length limit"):
            return "and the second half."
        return {"content": f"{subtask(body)}: the first half ", "finish_reason": "length"}

    flow, bodies = run_flow(responder)
    draft = flow.workflow.nodes["draft"]
    assert flow.status == "done"
    assert draft.output == "draft: the first half and the second half."
    assert draft.attempts[-1]["continuations"] == 1
    # the continuation saw the cut answer as its own words
    cont = next(b for b in bodies if b["messages"][-1]["content"].startswith("Your answer stopped"))
    assert cont["messages"][-2] == {"role": "assistant", "content": "draft: the first half "}


def test_an_answer_still_cut_after_the_continuations_is_never_done():
    flow, bodies = run_flow(lambda body: {"content": "on and on ", "finish_reason": "length"},
                            max_attempts=2, continuations=1, update="off")
    draft = flow.workflow.nodes["draft"]
    assert draft.status == "failed" and flow.status != "done"
    assert "cut: the answer reached the token limit" in draft.error
    assert all(a["cut"] and not a["passed"] for a in draft.attempts)
    assert flow.workflow.nodes["edit"].status == "pending"       # nothing built on it
    assert len(bodies) == 2 * 2                                   # 2 attempts x (1 call + 1 continuation)
    assert "cut at the token limit" in draw(flow).source          # visible in the drawing


def test_an_empty_answer_is_not_a_passed_node():
    flow, _ = run_flow(lambda body: "", max_attempts=1, update="off")
    assert flow.workflow.nodes["draft"].status == "failed"
    assert "empty answer" in flow.workflow.nodes["draft"].error


def test_a_child_is_told_its_inputs_were_cut_and_short_inputs_stay_whole():
    def responder(body):
        return "x" * 3000 if subtask(body) == "draft" else "edited"

    flow, bodies = run_flow(responder, context_chars=1000)
    child = next(b for b in bodies if subtask(b) == "edit")["messages"][1]["content"]
    assert "the results of draft were too long for your context and were cut" in child
    assert "[cut here: 2000 more characters not shown]" in child
    flow2, bodies2 = run_flow(lambda body: "short" if subtask(body) == "draft" else "ok",
                              context_chars=1000)
    child2 = next(b for b in bodies2 if subtask(b) == "edit")["messages"][1]["content"]
    assert "[draft] (writer): short" in child2 and "cut" not in child2


def test_a_configured_endpoint_gets_the_models_own_limit_unless_the_user_sets_one():
    flow, bodies = run_flow(lambda body: "fine")
    assert flow.settings["max_tokens"] is None
    assert bodies and all("max_tokens" not in b for b in bodies)
    flow, bodies = run_flow(lambda body: "fine", max_tokens=700)
    assert bodies and all(b["max_tokens"] == 700 for b in bodies)


def test_a_cut_summary_says_so():
    def responder(body):
        if subtask(body) == "summary":
            return {"content": "In short", "finish_reason": "length"}
        return "done"

    flow, _ = run_flow(responder, continuations=0)
    assert flow.status == "done"
    assert flow.result.startswith("In short") and "[cut: this summary reached the token limit" in flow.result
    assert "cut" in flow.message


def test_bad_settings_are_one_line():
    with pytest.raises(flowmagic.errors.ConfigError, match="max_tokens must be at least 1"):
        Flow.from_dict(PAIR, max_tokens=0, save=False)
    with pytest.raises(flowmagic.errors.ConfigError, match="continuations"):
        Flow.from_dict(PAIR, continuations=-1, save=False)


def test_a_continuation_that_opens_its_code_block_again_is_stitched_into_the_open_one():
    """SmolLM2 cut inside a code block often continues with a new ```python fence and the cut
    line written again: the joined answer must hold one block of code that runs, not the
    broken line glued to the fence ("for x in range(2```python")."""
    from flowmagic.engine.code_blocks import extract_code

    def responder(body):
        if body["messages"][-1]["content"].startswith("Your answer stopped at the length limit"):
            return "```python\nfor x in range(2):\n    print(math.sqrt(x))\n```\nDone."
        return {"content": "Here:\n```python\nimport math\nfor x in range(2",
                "finish_reason": "length"}

    flow, _ = run_flow(responder)
    draft = flow.workflow.nodes["draft"]
    assert draft.output.startswith("Here:\n```python\nimport math\nfor x in range(2):\n"
                                   "    print(math.sqrt(x))\n```\nDone.")
    assert extract_code(draft.output) == ["import math\nfor x in range(2):\n    print(math.sqrt(x))\n"]
    assert draft.execution["ok"] and draft.execution["stdout"] == "0.0\n1.0\n"   # and it ran


@pytest.mark.parametrize("text, more, joined", [
    # prose, and code continued mid-line as asked: joined as they are
    ("the first half ", "and the second.", "the first half and the second."),
    ("```python\nfor x in ra", "nge(2):\n    pass\n```", "```python\nfor x in range(2):\n    pass\n```"),
    # the block closed by the continuation: a bare fence is a close, not a new block
    ("```python\nprint(1)\n", "```\nThat prints 1.", "```python\nprint(1)\n```\nThat prints 1."),
    # a new block after a closed one is a new block
    ("```python\nprint(1)\n```\n", "```python\nprint(2)\n```", "```python\nprint(1)\n```\n```python\nprint(2)\n```"),
    # the whole block written again from its first line: the first try is replaced
    ("```python\nimport os\nx = os.get", "```python\nimport os\nx = os.getcwd()\n```",
     "```python\nimport os\nx = os.getcwd()\n```"),
    # a restart from a line the block does not hold: the cut line goes (its end is unknown,
    # "os.get" parses but was "os.getcwd()"), the finished lines stay
    ("```py\nimport os\nx = os.get", "\n```python\nprint(os.sep)\n```", "```py\nimport os\nprint(os.sep)\n```"),
    # a line cut right after its end is dropped too, unless the restart repeats it
    ("```python\nimport os\nprint(1)", "```python\nprint(2)\n```", "```python\nimport os\nprint(2)\n```"),
    ("```python\nimport os\nprint(1)", "```python\nprint(1)\nprint(2)\n```", "```python\nimport os\nprint(1)\nprint(2)\n```"),
    # ~~~ blocks the same way; a ``` restart inside a ~~~ block is code, not a fence of it
    ("~~~python\nimport os\nx = 1", "~~~python\nx = 1\n~~~", "~~~python\nimport os\nx = 1\n~~~"),
])
def test_join_continued(text, more, joined):
    from flowmagic.json_extract import join_continued

    assert join_continued(text, more) == joined
