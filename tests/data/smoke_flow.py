"""A flow planned and run to the end on a loopback model: the smoke test of an installed wheel."""

import json, sys
import flowmagic
from flowmagic.testing.loopback import LoopbackServer

def respond(body):
    if body["messages"][0]["content"].startswith("You plan work"):
        return json.dumps({"subtasks": [
            {"id": "steep", "requirement": "Steep the green tea leaves", "agent": "writer", "depends_on": []},
            {"id": "serve", "requirement": "Serve the green tea", "agent": "writer", "depends_on": ["steep"]}]})
    return "Green tea is steeped at 80 C."

with LoopbackServer(responder=respond) as server:
    flowmagic.configure(base_url=server.base_url, model="m")
    flow = flowmagic.plan("Write a short guide to green tea", k=1)
    flow.run()
    print("python %d.%d" % sys.version_info[:2], flow.status, sorted(flow.workflow.nodes))
