"""Updates as the Flow paper means them: a fix beats "no change", a running child of a
rerun node runs again, the prompt checks sufficiency and says why it was called, no token
cap cuts an update, and the settings are visible. All over real HTTP to loopback."""

import json
import re
import threading

import pytest

import flowmagic
from flowmagic.flow import Flow
from flowmagic.llm import LLM
from flowmagic.llm.client import CONTINUE_PROMPT
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.magic_grammar import parse_flow_line

pytestmark = pytest.mark.timeout(120)


def chain(n):
    return {"nodes": [{"id": f"s{i}", "requirement": f"step {i}"} for i in range(n)],
            "edges": [[f"s{i}", f"s{i + 1}"] for i in range(n - 1)]}


def node_of(body) -> str | None:
    for message in body.get("messages", []):
        found = re.search(r"Your subtask \((\w+)\)", str(message.get("content")))
        if found:
            return found.group(1)
    return None


def is_update(body) -> bool:
    return "Results of done subtasks" in body["messages"][-1]["content"]


def make_flow(plan, server, **settings):
    flowmagic.configure(base_url=server.base_url, model="m")
    settings.setdefault("consolidate", False)
    return Flow.from_dict(plan, task="analyse sales.csv", llm=LLM(backoff_base=0.01), **settings)


# -- 1. a fix beats "no change" -----------------------------------------------------------

def test_k3_update_prefers_the_candidate_that_reruns_the_masked_node():
    def answer(body):
        if not is_update(body):
            return f"result for {node_of(body)}"
        masked = re.findall(r"\[(\w+)\]\nnone\b", body["messages"][-1]["content"])
        if body["seed"] % 3 == 0 or not masked:   # candidate 0 always says "no change"
            return json.dumps({"rationale": "looks fine", "action": "no_change"})
        return json.dumps({"rationale": "the result is missing", "action": "update",
                           "subtasks": [{"id": m, "rerun": True} for m in masked]})

    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(2), server, mask_rate=1.0, update="on-failure", update_k=3,
                         max_updates=10)
        flow.run()
        outputs = {i: n.output for i, n in flow.workflow.nodes.items()}
        assert flow.status == "done"
        assert all(o.startswith("result for") for o in outputs.values()), outputs
        first = flow.update_log[0]
        assert first["chosen"] != 0 and first["diff"]["rerun"] == ["s0"]
        assert first["rationale"] == "the result is missing"


# -- 2. a running child of a rerun node runs again -------------------------------------------

def test_concurrent_update_reruns_the_running_child_of_a_rerun_node():
    lock, rules_calls = threading.Lock(), []

    def answer(body):
        if is_update(body):
            user = body["messages"][-1]["content"]
            if "RULES v1" in user and "- logic [running" in user:
                return json.dumps({"rationale": "the rules are outdated", "action": "update",
                                   "subtasks": [{"id": "rules", "rerun": True}]})
            return json.dumps({"rationale": "fine", "action": "no_change"})
        node = node_of(body)
        if node == "rules":
            with lock:
                rules_calls.append(1)
                return f"RULES v{len(rules_calls)}"
        found = re.search(r"RULES v\d", body["messages"][-1]["content"])
        return f"LOGIC built on {found.group(0) if found else 'nothing'}"

    def latency(body):
        return 0.8 if node_of(body) == "logic" else 0.05

    plan = {"nodes": [{"id": "rules", "requirement": "write the rules"},
                      {"id": "logic", "requirement": "write the logic"}],
            "edges": [["rules", "logic"]]}
    with LoopbackServer(responder=answer, latency=latency) as server:
        flow = make_flow(plan, server, update="concurrent", max_updates=10)
        flow.run()
        nodes = flow.workflow.nodes
        assert flow.status == "done"
        assert nodes["rules"].output == "RULES v2"
        assert nodes["logic"].output == "LOGIC built on RULES v2"
        assert not nodes["logic"].stale
        assert any("logic" in e["diff"]["stale"] for e in flow.update_log)


# -- 3. the update prompt --------------------------------------------------------------------

def _restructure():
    subtasks = [{"id": f"part_{i}", "requirement": f"analyse region {i} of the sales in detail: "
                 + "monthly totals, growth, outliers and a short comment. " * 3,
                 "depends_on": ["s0"]} for i in range(8)]
    return {"rationale": "split the analysis by region so the parts run in parallel",
            "action": "update", "subtasks": subtasks}


def capped(text: str, body: dict, cap_tokens: int | None) -> dict | str:
    """What an endpoint with a token cap sends: the first cap*4 characters, "length"."""
    if cap_tokens is not None and len(text) > cap_tokens * 4:
        return {"content": text[: cap_tokens * 4], "finish_reason": "length"}
    return text


def test_update_prompt_checks_sufficiency_says_why_and_is_not_cut_at_512_tokens():
    seen = []

    def answer(body):
        if not is_update(body):
            return f"result for {node_of(body)}"
        seen.append(body)
        if "part_0" in body["messages"][-1]["content"]:
            return json.dumps({"rationale": "done", "action": "no_change"})
        return capped(json.dumps(_restructure()), body, body.get("max_tokens"))

    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(2), server, mask_rate=1.0, update="on-failure", max_tokens=512,
                         repairs=False, max_updates=1)
        flow.run()
    user = seen[0]["messages"][-1]["content"]
    why = user.split("Task:")[0]
    assert "- subtask s0 finished" in why and "empty" not in why      # why, not which was masked
    assert "[s0]\nnone" in user                                        # the updater reads it itself
    assert "sufficient" in user                                        # D.3's check
    assert "modular and parallel" in user                              # P_update
    assert "rationale" in json.dumps(seen[0]["response_format"])
    assert seen[0]["max_tokens"] >= 2048                             # not the nodes' 512
    entry = flow.update_log[0]
    assert not entry["no_change"] and len(entry["diff"]["added"]) == 8
    assert entry["rationale"].startswith("split the analysis by region")


def test_an_update_cut_by_the_endpoint_is_continued():
    whole = json.dumps(_restructure())

    def answer(body):
        if body["messages"][-1]["content"] == CONTINUE_PROMPT:   # the one continuation prompt
            sent = body["messages"][-2]["content"]          # what the endpoint already gave
            rest = whole[len(sent):]
            return {"content": rest[:1000], "finish_reason": "length" if len(rest) > 1000 else "stop"}
        if not is_update(body):
            return f"result for {node_of(body)}"
        if "part_0" in body["messages"][-1]["content"]:
            return json.dumps({"action": "no_change"})
        return capped(whole, body, 250)                      # a server-side cap of 250 tokens

    assert len(whole) > 2000
    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(2), server, mask_rate=1.0, update="on-failure", repairs=False,
                         max_updates=1)
        flow.run()
        assert len(flow.update_log[0]["diff"]["added"]) == 8


def test_an_update_still_cut_after_its_continuations_is_a_failed_candidate_not_a_merge():
    whole = json.dumps(_restructure())
    continued = []

    def answer(body):
        if body["messages"][-1]["content"] == CONTINUE_PROMPT:
            continued.append(body)
            return {"content": " ", "finish_reason": "length"}   # never gets to the end
        if not is_update(body):
            return f"result for {node_of(body)}"
        return {"content": whole[:300], "finish_reason": "length"}

    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(2), server, mask_rate=1.0, update="on-failure", repairs=False,
                         max_updates=1)
        flow.run()
    entry = flow.update_log[0]
    assert len(continued) == 2                                   # the bound, one copy of it
    assert continued[0]["messages"][-2] == {"role": "assistant", "content": whole[:300]}
    assert "response_format" not in continued[0]                 # the rest is plain text
    (error,) = entry["errors"]
    assert "cut off" in error and "after 2 continuations" in error
    assert entry["no_change"] and not entry["diff"]["added"]     # nothing half-read was merged


# -- 4. settings visible ------------------------------------------------------------------------

def test_update_settings_are_flags_of_the_cell():
    args = parse_flow_line("report --update-k 3 --max-updates 2 --mask-rate 0.5 --fail-rate 0.1 --seed 4")
    assert args.settings == {"update_k": 3, "max_updates": 2, "mask_rate": 0.5, "fail_rate": 0.1,
                             "seed": 4}
    with pytest.raises(flowmagic.errors.ConfigError, match="between 0 and 1"):
        parse_flow_line("report --mask-rate 2")


def test_max_updates_says_in_one_line_when_it_stops_an_update():
    def answer(body):
        if not is_update(body):
            return f"result for {node_of(body)}"
        return json.dumps({"action": "no_change"})

    events = []
    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(3), server, mask_rate=1.0, update="on-failure", max_updates=1)
        flow.subscribe(events.append)
        flow.run()
    capped_events = [e for e in events if e["kind"] == "update_capped"]
    assert len(flow.update_log) == 1 and len(capped_events) == 1
    assert "max_updates (1) reached" in flow.message and "\n" not in flow.message
    assert "--max-updates" in flow.message


def test_the_masking_experiment_lets_the_updater_notice_without_naming_the_masked_node():
    # Flow's Table 4 condition: updates after completion, outputs masked to "none". The
    # updater is called after every node for the same reason and must find the "none" in
    # the results itself; the scripted updater reruns what reads "none", so the run recovers.
    prompts = []

    def answer(body):
        if not is_update(body):
            return f"result for {node_of(body)}"
        user = body["messages"][-1]["content"]
        prompts.append(user)
        masked = re.findall(r"\[(\w+)\]\nnone\b", user)
        return json.dumps({"rationale": "rerun what is missing" if masked else "fine",
                           "action": "update" if masked else "no_change",
                           "subtasks": [{"id": m, "rerun": True} for m in masked]})

    with LoopbackServer(responder=answer) as server:
        flow = make_flow(chain(3), server, mask_rate=1.0, update="after-completion",
                         repairs=False, max_updates=10)
        flow.run()
    assert {i: n.output for i, n in flow.workflow.nodes.items()} == {
        f"s{i}": f"result for s{i}" for i in range(3)}
    assert any(re.search(r"\[s\d\]\nnone\b", p) for p in prompts)   # it saw the masked output
    for user in prompts:
        why = user.split("Task:")[0].splitlines()[1:]
        assert why and all(re.fullmatch(r"- subtask s\d finished", line) for line in why if line), why
