"""flow.map(engine="dask"): the batch on a LocalCluster of worker processes, over a loopback server."""

import re

import pandas as pd
import pytest

import flowmagic
from flowmagic.errors import ConfigError
from flowmagic.flow import Flow
from flowmagic.ops.distributed import to_inputs
from flowmagic.testing.loopback import LoopbackServer

pytest.importorskip("dask.distributed")

PLAN = {"nodes": [{"id": "ask", "requirement": "Look up {{city}} in {{year}}"}], "edges": []}


def echo(body) -> str:
    found = re.search(r"Look up (\w+) in (\d+)", str(body.get("messages")))
    return f"found {found.group(1)}/{found.group(2)}" if found else "?"


def test_dask_map_of_a_dataframe_returns_every_row_in_input_order():
    cities = [f"c{i}" for i in range(24)]
    frame = pd.DataFrame({"city": cities, "year": [2000 + i for i in range(24)]})

    def latency(body):  # early rows answer slowest, so they finish last
        found = re.search(r"Look up c(\d+)", str(body.get("messages")))
        return 0.01 * (24 - int(found.group(1))) if found else 0.01

    with LoopbackServer(responder=echo, latency=latency) as server:
        flowmagic.configure(base_url=server.base_url, model="m")
        flow = Flow.from_dict(PLAN, task="answer questions")
        out = flow.map(frame, engine="dask")
        asked = [r for r in server.requests if "Look up" in str(r["body"])]
    assert list(out["city"]) == cities
    assert list(out["result"]) == [f"found c{i}/{2000 + i}" for i in range(24)]
    assert list(out["node:ask"]) == list(out["result"])
    assert set(out["status"]) == {"done"} and out["error"].isna().all()
    assert (out["tokens_in"] > 0).all() and (out["time_s"] > 0).all()
    assert len(asked) == 24   # each input ran once
    # Answers did not come back in input order: the order was restored, not inherited.
    finished = sorted(asked, key=lambda r: r["finished"])
    assert [re.search(r"c(\d+)", str(r["body"])).group(1) for r in finished][:3] != ["0", "1", "2"]
    # A list is one input per item; a single string is a one-line mistake, not 30 inputs.
    assert to_inputs(["a", "b"]) == (["a", "b"], [])
    with pytest.raises(ConfigError, match="wrap a single input in a list"):
        to_inputs("not a list")
