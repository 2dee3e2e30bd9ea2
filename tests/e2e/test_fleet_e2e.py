"""End to end on loopback: the real ASGI server, Celery worker and beat, and two real agent processes."""
from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

from tests.e2e.livestack import LiveStack, wait_until

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def stack(tmp_path):
    s = LiveStack(tmp_path, nodes=[("e2e-h100", "h100-80gb:2"), ("e2e-l4", "l4:1")],
                  env={"FLEET_HEARTBEAT_TIMEOUT": "3", "FLEET_OFFLINE_CHECK": "1", "FLEET_METRICS_FLUSH": "0.5"},
                  agent_interval=0.5)
    with s.running():
        yield s


def test_agents_register_carve_a_mig_instance_stream_metrics_and_a_killed_agent_goes_offline(stack):
    h100, l4 = stack.seed["nodes"]

    def nodes_online():
        status, body = stack.api("GET", "/api/v1/nodes/")
        nodes = {n["name"]: n for n in body.get("results", [])}
        ok = all(nodes.get(n["name"], {}).get("status") == "online" for n in (h100, l4))
        return nodes if ok and nodes["e2e-h100"]["gpu_count"] == 2 and nodes["e2e-l4"]["gpu_count"] == 1 else None
    nodes = wait_until(nodes_online, timeout=30, what="both agents to register")
    assert nodes["e2e-h100"]["backend"] == "simulated"

    status, gpus = stack.api("GET", f"/api/v1/gpus/?node={h100['id']}")
    gpu = gpus["results"][0]
    assert gpu["mig_enabled"] and gpu["model"] == "h100-80gb"
    status, sl = stack.api("POST", "/api/v1/slices/", {"gpu": gpu["uuid"], "profile": "3g.40gb", "start": 4})
    assert status == 201, sl

    def slice_ready():
        _, body = stack.api("GET", f"/api/v1/slices/{sl['id']}/")
        return body if body.get("state") == "ready" else None
    ready = wait_until(slice_ready, timeout=15, what="the agent to carve the instance")
    assert ready["instance_uuid"].startswith("MIG-") and ready["cuda_visible_devices"] == ready["instance_uuid"]

    # A console subscriber (a signed-in browser session) receives the agent's metrics as they arrive.
    with connect(f"ws://127.0.0.1:{stack.port}/ws/console/", open_timeout=10,
                 additional_headers={"Cookie": f"sessionid={stack.seed['session']}",
                                     "Origin": stack.url}) as ws:
        ws.send(json.dumps({"subscribe": {"node": h100["id"]}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "subscribed"
        frames = [json.loads(ws.recv(timeout=10)) for _ in range(3)]
    metrics = [f for f in frames if f["type"] == "metrics"]
    assert metrics and {g["uuid"] for g in metrics[-1]["gpus"]} == {g["uuid"] for g in gpus["results"]}

    # Latest values reach the database through the batched flush.
    wait_until(lambda: stack.api("GET", f"/api/v1/gpus/{gpu['uuid']}/")[1].get("latest"), timeout=10,
               what="the latest metrics to be flushed")

    stack.kill(f"agent-{l4['name']}")

    def l4_offline():
        _, body = stack.api("GET", f"/api/v1/nodes/{l4['id']}/")
        return body.get("status") == "offline"
    wait_until(l4_offline, timeout=20, what="beat to mark the silent node offline")
    assert stack.api("GET", f"/api/v1/nodes/{h100['id']}/")[1]["status"] == "online"
