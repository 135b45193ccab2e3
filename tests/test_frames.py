"""What a data scientist expects back: flow.cost(), flow.timeline() and the candidates as
pandas DataFrames (the plain data without pandas), the old accessors still working."""

import json
import sys

import pandas as pd

import flowmagic
from flowmagic.testing.loopback import LoopbackServer

PLAN = {"subtasks": [
    {"id": "leaves", "requirement": "Pick the green tea leaves.", "agent": "writer", "depends_on": []},
    {"id": "steep", "requirement": "Steep the green tea.", "agent": "writer", "depends_on": ["leaves"]}]}


def respond(body):
    return json.dumps(PLAN) if body.get("response_format") else "Green tea is steeped at 80 C."


def planned_and_run():
    flow = flowmagic.plan("Write a short guide to green tea", k=2)
    return flow.run()


def test_cost_timeline_and_candidates_are_dataframes():
    with LoopbackServer(responder=respond) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = planned_and_run()
    cost = flow.cost()
    assert isinstance(cost, pd.DataFrame)
    assert {"purpose", "node_id", "model", "calls", "cost_usd"} <= set(cost.columns)
    assert set(cost["node_id"].dropna()) == {"leaves", "steep"}
    assert cost.total["calls"] == cost["calls"].sum() == cost["total"]["calls"] >= 4
    assert cost["rows"] == flow.cost_data()["rows"]
    timeline = flow.timeline()
    assert isinstance(timeline, pd.DataFrame) and list(timeline["node"]) == ["leaves", "steep"]
    assert (timeline["end"] >= timeline["start"]).all()
    table = flow.candidates.to_frame()
    assert isinstance(table, pd.DataFrame) and len(table) == 2 == len(flow.candidates)
    assert "<table" in flow.candidates._repr_html_()
    assert flow.candidates[0].workflow is not None   # still the list of candidates


def test_without_pandas_the_plain_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)   # pandas not installed
    with LoopbackServer(responder=respond) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = planned_and_run()
    assert isinstance(flow.cost(), dict) and flow.cost()["total"]["calls"] >= 4
    assert isinstance(flow.timeline(), list) and flow.timeline()[0]["node"] == "leaves"
    assert isinstance(flow.candidates.to_frame(), list)
