"""Choosing a model: only what the endpoint lists, priced honestly, history never relabelled.

Each test talks to a real loopback server over HTTP, with the model check on (the suite turns
it off by default because the loopback answers any model name).
"""

import json

import pytest

import flowmagic
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.jupyter.widgets import Panel, model_choices
from flowmagic.llm import LLM, catalog
from flowmagic.store import Store
from flowmagic.testing.loopback import LoopbackServer
from flowmagic.view.display import cost_report, log_report
from flowmagic.view.render import summary

PLAN = {"nodes": [{"id": "draft", "requirement": "draft a note", "agent": "writer"},
                  {"id": "polish", "requirement": "polish the note", "agent": "editor"}],
        "edges": [["draft", "polish"]]}
LISTED = ["gpt-4o", "gpt-4o-mini", "text-embedding-3-small", "mystery-7b"]


@pytest.fixture(autouse=True)
def check_on(monkeypatch):
    monkeypatch.setenv("FLOWMAGIC_CHECK_MODELS", "1")
    catalog.forget()
    yield
    catalog.forget()


@pytest.fixture
def server():
    with LoopbackServer(models=LISTED, model="gpt-4o") as srv:
        flowmagic.configure(base_url=srv.base_url, model="gpt-4o")
        yield srv


def make_flow(tmp_path):
    return Flow.from_dict(PLAN, task="write a note", consolidate=False,
                          llm=LLM(store=Store(tmp_path / "s.db"), backoff_base=0.01))


def chat_calls(srv):
    return [r for r in srv.requests if r["path"].endswith("/chat/completions")]


def test_downgrade_refuses_a_model_the_endpoint_does_not_list(server, tmp_path):
    flow = make_flow(tmp_path)
    with pytest.raises(ConfigError) as err:
        flow.downgrade("draft", "gpt-9-ultra")
    line = str(err.value)
    assert "\n" not in line and "'gpt-9-ultra'" in line
    # names the chat models it lists, not the embedding one
    assert "gpt-4o, gpt-4o-mini, mystery-7b" in line and "embedding" not in line
    assert flow.workflow.nodes["draft"].model is None and not flow.workflow.nodes["draft"].downgraded_from
    flow.downgrade("draft", "gpt-4o-mini")   # listed: accepted
    assert flow.workflow.nodes["draft"].model == "gpt-4o-mini"


def test_configure_and_plan_refuse_an_unlisted_model_before_any_call(server, tmp_path):
    with pytest.raises(ConfigError, match="does not serve a model 'gpt-9-ultra'"):
        flowmagic.configure(base_url=server.base_url, model="gpt-9-ultra")
    assert flowmagic.llm.endpoints.resolve(None)[1] == "gpt-4o"   # the old choice is kept
    with pytest.raises(ConfigError, match="it lists: gpt-4o"):
        flowmagic.plan("write a note", k=1, model="gpt-9-ultra",
                       llm=LLM(store=Store(tmp_path / "p.db")))
    assert chat_calls(server) == []


def test_an_endpoint_without_a_model_list_is_used_with_one_warning(tmp_path, capsys):
    with LoopbackServer(models=False) as srv:
        url = srv.base_url
        flowmagic.configure(base_url=url, model="whatever-1")
        flow = make_flow(tmp_path)
        flow.downgrade("draft", "whatever-2")
        flow.downgrade("polish", "whatever-2")
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "whatever-2" in line] == [
        f"flowmagic: cannot check the model 'whatever-2': {url} does not list its "
        "models (GET /models failed); using it as given"]
    assert any("cannot check the model 'whatever-1'" in line for line in out)
    assert flow.workflow.nodes["polish"].model == "whatever-2"


def test_a_model_pulled_after_the_first_look_is_found(server, tmp_path):
    flow = make_flow(tmp_path)
    flow.downgrade("draft", "gpt-4o-mini")   # the list is now kept
    server.models = [*LISTED, "fresh-1b"]
    flow.downgrade("polish", "fresh-1b")     # a miss asks again
    assert flow.workflow.nodes["polish"].model == "fresh-1b"


def test_the_dropdown_offers_what_the_endpoint_lists(server):
    values = [value for _label, value in model_choices()]
    assert values == ["gpt-4o", "gpt-4o-mini", "mystery-7b"]   # no embedding, no unlisted price
    labels = dict((v, label) for label, v in model_choices())
    assert labels["mystery-7b"] == "mystery-7b (price unknown)"
    assert labels["gpt-4o-mini"].startswith("gpt-4o-mini ($0.15 / $0.6")


def test_an_unpriced_model_costs_unknown_not_zero(tmp_path):
    with LoopbackServer(models=["mystery-7b"], model="mystery-7b") as srv:
        flowmagic.configure(base_url=srv.base_url, model="mystery-7b")
        flow = make_flow(tmp_path)
        flow.run()
    assert flow.status == "done"
    assert summary(flow).endswith("2/2 done, unknown (default:mystery-7b: no price known)")
    report = cost_report(flow)
    rows = report.text.splitlines()
    assert all("$0.0" not in r for r in rows if "mystery" in r or r.startswith("total"))
    assert "unknown" in rows[-2] and "no price is known for default:mystery-7b" in rows[-1]
    assert "$0.000000" not in log_report(flow.store.recent_calls(5, run_id=flow.run_id)).text
    assert all(a["unpriced"] for n in flow.workflow.nodes.values() for a in n.attempts)
    again = flowmagic.load(flow.run_id, llm=flow.llm)   # the store remembers it too
    assert "unknown" in summary(again)


def test_downgrading_a_finished_node_changes_its_next_run_not_its_history(server, tmp_path):
    flow = make_flow(tmp_path)
    flow.run()
    flow.downgrade("draft", "gpt-4o-mini")
    draft = flow.workflow.nodes["draft"]
    assert draft.status == "done" and [a["model"] for a in draft.attempts] == ["default:gpt-4o"]
    svg = flow.draw().pipe("svg").decode()
    label = svg[svg.index('id="node&#45;draft"'):].split("</g>")[0]
    assert "ran on gpt&#45;4o<" in label and "next ↓ gpt&#45;4o&#45;mini" in label
    panel = Panel(flow)
    panel.node_picker.value = "draft"
    assert "ran on default:gpt-4o · next run: gpt-4o-mini" in panel.node_info.value
    panel.close()
    assert [r["model"] for r in flow.timeline_rows()] == ["default:gpt-4o", "default:gpt-4o"]
    nb = flow.to_notebook(tmp_path / "note.ipynb")
    meta = json.loads(nb.read_text())["metadata"]["flowmagic"]
    assert meta["nodes"]["draft"]["models"] == ["default:gpt-4o"]
    assert [r["model"] for r in meta["timeline"]] == ["default:gpt-4o", "default:gpt-4o"]
    flow.rerun("draft")   # the next run uses the new model; the old attempt keeps its own
    assert [a["model"] for a in draft.attempts] == ["default:gpt-4o", "default:gpt-4o-mini"]
    asked = [json.loads(r["body"])["model"] if isinstance(r["body"], str) else r["body"]["model"]
             for r in chat_calls(server)]
    assert asked[-2:] == ["gpt-4o-mini", "gpt-4o"]   # draft on the cheap one, polish after it
    models = {r[2] for r in [row.split() for row in cost_report(flow).text.splitlines()[2:]]
              if len(r) > 2}
    assert {"default:gpt-4o", "default:gpt-4o-mini"} <= models
