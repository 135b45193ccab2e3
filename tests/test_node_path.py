"""What a node's prompt costs: the parts every node of a run shares are worked out once a
run, not once a node (engine/node_runner.py)."""

from __future__ import annotations

import flowmagic
from flowmagic.engine import answerform
from flowmagic.flow import Flow
from flowmagic.testing.loopback import LoopbackServer

NODES = 30


def test_the_task_is_read_for_its_answer_form_once_a_run_not_once_a_node(monkeypatch):
    task = ("Write a short guide in thirty steps, one a subtask.\n\n"
            "Answer format: @steps[n] where n is the number of steps written.")
    plan = {"task": task,
            "nodes": [{"id": f"s{i:02d}", "requirement": f"Write step {i}."}
                      for i in range(NODES)],
            "edges": [[f"s{i:02d}", f"s{i + 1:02d}"] for i in range(NODES - 1)]}
    read = []
    prescribed = answerform.prescribed
    monkeypatch.setattr(answerform, "prescribed", lambda t: read.append(t) or prescribed(t))
    with LoopbackServer(responder=lambda messages: "Done.") as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(plan, name="guide", consolidate=False, update="off")
        flow.run()
        prompts = [r["body"]["messages"][-1]["content"]
                   for r in server.stats(bodies=True)["requests"]
                   if r["path"].endswith("/chat/completions")]
    assert len(prompts) == NODES and all(n.output == "Done." for n in flow.workflow.nodes.values())
    # every node is still shown the task without its answer form
    assert all("Write a short guide in thirty steps" in p and "@steps[" not in p for p in prompts)
    assert len([t for t in read if t == task]) <= 2, len(read)   # was 2 a node: 60
