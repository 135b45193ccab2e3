"""flow.map and flow.importance in a script, for tests/test_progress.py (run under a terminal)."""
import flowmagic
from flowmagic.testing.loopback import LoopbackServer

with LoopbackServer(responder=lambda body: "an answer about " + body["messages"][-1]["content"][-40:]) as server:
    flowmagic.configure(base_url=server.base_url, model="m")
    flow = flowmagic.Flow.from_dict({
        "nodes": [{"id": "a", "requirement": "Say something about {{input}}"},
                  {"id": "b", "requirement": "Sum it up", "depends_on": ["a"]}],
        "edges": [["a", "b"]]}, name="demo")
    run = flow.map(["tea", "coffee", "water"], concurrency=2)
    print("MAPPED", len(run.items))
    flow.attach_probe([{"input": "tea", "expected": "tea"}], scorer="contains")
    flow.importance()
    print("RANKED")
