"""The OpenAPI schema is the contract, checked against a live server (uvicorn, a simulated agent, a local fake
Stripe; no Celery: nothing here waits on beat):

- schemathesis runs every operation with a buyer's key (read, trade: a funded wallet and a running lease) and a
  provider's (read, trade, provide: a node with GPUs), with the checks not_a_server_error,
  status_code_conformance, content_type_conformance and response_schema_conformance: zero failures;
- a client generated from the live schema by openapi-python-client lists offers, places an order and reads its
  lease back: a generator can use the contract.

Bounded time (CI runs it): each key's run is the examples, coverage and fuzzing phases (about 3,600 requests) at
CONTRACT_EXAMPLES examples per operation for fuzzing, a fixed seed and one worker; the two keys run at once."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.livestack import ROOT, LiveStack, wait_until

pytestmark = pytest.mark.e2e

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
EXAMPLES = int(os.environ.get("CONTRACT_EXAMPLES", "12"))
SEED = 20261201
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = LiveStack(tmp_path_factory.mktemp("contract"), stripe=True, nodes=[("contract-h100", "h100-80gb:2")],
                  celery=False, agent_interval=0.5,
                  env={"API_THROTTLE_USER": "100000/min", "API_THROTTLE_ANON": "100000/min",
                       "FLEET_HEARTBEAT_TIMEOUT": "3600"})
    # The embedded default (the demo's), also where CI has Redis: the one web process bounds the runs (the two
    # schemathesis clients need a tenth of its CPU), and with Redis behind cache and channel layer each request
    # costs it more (1.4× the run's time here, measured before config/cache.py shared one connection pool per
    # process). Redis-backed stacks are the scale-out and fault suites' subject.
    s.env.pop("REDIS_URL", None)
    with s.running():
        yield s


@pytest.fixture(scope="module")
def seeded(stack):
    """A provider whose node is online with its GPUs, and a buyer (read and trade only) with money and a running
    lease."""
    node = stack.seed["nodes"][0]
    wait_until(lambda: stack.api("GET", f"/api/v1/nodes/{node['id']}/")[1].get("status") == "online", timeout=60,
               what="the node online")
    buyer = stack.add_buyers(["contract-buyer"], credit="500")[0]
    status, key = stack.api("POST", "/api/v1/api-keys/", {"name": "contract", "scopes": ["read", "trade"]},
                            key=buyer["api_key"])
    assert status == 201 and key["scopes"] == ["read", "trade"], key
    status, order = stack.api("POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["h100-80gb"],
                                                          "memory_gb": 10}, key=key["secret"])
    assert status == 201, order
    lease_id = order["leases"][0]
    wait_until(lambda: stack.api("GET", f"/api/v1/leases/{lease_id}/", key=key["secret"])[1].get("state")
               == "running", timeout=60, what="the buyer's lease running")
    return {"buyer": key["secret"], "provider": stack.seed["api_key"], "lease": lease_id}


CLIENT_CONFIG = {"project_name_override": "gpumarket-client", "package_name_override": "gpumarket_client"}

USE_CLIENT = r"""
import json, sys
from gpumarket_client import AuthenticatedClient
from gpumarket_client.api.offers import offers_list
from gpumarket_client.api.orders import orders_create
from gpumarket_client.api.leases import leases_retrieve
from gpumarket_client.models import ModeEnum, OrderCreateRequest

client = AuthenticatedClient(base_url=sys.argv[1], token=sys.argv[2])
offers = offers_list.sync(client=client, gpu_model="h100-80gb", available=True)
unit = offers.results[0]
created = orders_create.sync_detailed(client=client, body=OrderCreateRequest(
    mode=ModeEnum.ON_DEMAND, gpu_models=[unit.gpu_model], memory_gb=unit.memory_gb))
if created.status_code not in (201, 202):
    sys.exit(f"the order was refused: {created.status_code} {created.content!r}")
order = created.parsed
lease = leases_retrieve.sync(client=client, id=order.leases[0])
print("CLIENT" + json.dumps({"offers": offers.count, "unit": unit.id, "price": str(unit.prices.on_demand),
                             "status": int(created.status_code), "order_state": str(order.state.value),
                             "lease": str(lease.id), "lease_order": str(lease.order), "lease_gpu_model": lease.gpu_model,
                             "lease_state": str(lease.state.value)}))
"""


@pytest.mark.timeout(900)  # generating and installing the client runs subprocesses: slow on a loaded machine
def test_a_client_generated_from_the_live_schema_lists_offers_places_an_order_and_reads_the_lease(stack, seeded,
                                                                                                  tmp_path):
    config = tmp_path / "client.json"
    config.write_text(json.dumps(CLIENT_CONFIG))
    generated = subprocess.run(
        [str(BIN / "openapi-python-client"), "generate", "--url", f"{stack.url}/api/schema/", "--config",
         str(config), "--meta", "none", "--output-path", str(tmp_path / "gpumarket_client")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"})  # its formatter (ruff) is in the venv
    assert generated.returncode == 0, generated.stdout[-5000:] + generated.stderr[-5000:]
    assert "Warning" not in generated.stdout, generated.stdout  # every operation and model was understood
    used = subprocess.run([sys.executable, "-c", USE_CLIENT, stack.url, seeded["buyer"]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert used.returncode == 0, used.stderr[-5000:]
    out = json.loads(used.stdout[used.stdout.index("CLIENT") + len("CLIENT"):])
    assert out["offers"] >= 1 and out["unit"].startswith("h100-80gb:") and out["status"] == 201
    assert out["order_state"] == "placed" and out["lease_gpu_model"] == "h100-80gb"
    assert out["lease_state"] in ("provisioning", "running")
    # The same lease, read back through the plain API.
    status, lease = stack.api("GET", f"/api/v1/leases/{out['lease']}/", key=seeded["buyer"])
    assert status == 200 and lease["order"] == out["lease_order"]


def test_the_console_socket_takes_a_key_with_the_read_scope(stack, seeded):
    """Scripts subscribe to metrics and market events with a key (docs/api.md): the buyer's key subscribes to its
    lease and gets its GPU's metrics; a key without `read` is refused at the handshake."""
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    def bearer(key: str) -> dict:
        return {"additional_headers": {"Authorization": f"Bearer {key}"}, "open_timeout": 10}

    async def watch(key: str) -> list[dict]:
        frames = []
        async with connect(stack.console_url(), **bearer(key)) as ws:
            await ws.send(json.dumps({"subscribe": {"lease": seeded["lease"]}}))
            while not any("gpus" in f for f in frames):
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=20)))
        return frames

    frames = asyncio.run(watch(seeded["buyer"]))
    assert frames[0]["type"] == "subscribed" and frames[0]["lease"] == seeded["lease"]
    assert len(frames[-1]["gpus"]) == 1  # its lease's GPU only, not the node's two
    status, trade_only = stack.api("POST", "/api/v1/api-keys/", {"name": "no-read", "scopes": ["trade"]},
                                   key=seeded["buyer"])
    assert status == 201

    async def refused() -> int:
        try:
            async with connect(stack.console_url(), **bearer(trade_only["secret"])) as ws:
                await ws.wait_closed()
                return ws.close_code
        except InvalidStatus as exc:  # closed before the handshake was accepted: HTTP 403
            return exc.response.status_code

    assert asyncio.run(refused()) in (403, 4401)


def test_the_schema_is_served_and_names_both_security_schemes(stack):
    import urllib.request

    with urllib.request.urlopen(f"{stack.url}/api/schema/?format=json", timeout=30) as r:
        schema = json.loads(r.read())
    assert set(schema["components"]["securitySchemes"]) == {"apiKey", "cookieAuth"}
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert ROOT.exists()


def _schemathesis(stack, key: str, tmp: Path) -> subprocess.Popen:
    """A schemathesis run in the background; its report goes to tmp/out.txt."""
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "out.txt", "w") as out:
        return subprocess.Popen(
            [str(BIN / "st"), "run", f"{stack.url}/api/schema/", "--url", stack.url, "--checks", CHECKS,
             "--header", f"Authorization: Bearer {key}", "--generation-with-security-parameters", "false",
             # A key that revokes itself (schemathesis reuses the ids a list returned) would leave the rest of the run
             # 401s: revocation is tested in tests/api/test_api_keys.py.
             "--exclude-operation-id", "api_keys_destroy",
             "--phases", "examples,coverage,fuzzing", "--max-examples", str(EXAMPLES), "--seed", str(SEED),
             # One worker each (the two keys run at once, in two processes): CPython 3.11's ast.parse is not safe
             # across threads, and schemathesis' coverage phase calls it ("AST constructor recursion depth mismatch").
             "--workers", "1", "--request-timeout", "30", "--generation-database", "none", "--no-color"],
            cwd=tmp, stdout=out, stderr=subprocess.STDOUT)


# Last in this module: what the runs do (end the buyer's lease, rotate the node's token, delete it once free) does
# not disturb the tests above. Each run has a key of its own, made for it through the API.
@pytest.mark.timeout(1200)  # two schemathesis runs at once against one live stack: minutes on a loaded machine
def test_schemathesis_finds_no_failure_with_the_buyers_key_or_the_providers(stack, seeded, tmp_path):
    runs = {}
    for who, scopes in (("buyer", ["read", "trade"]), ("provider", ["read", "trade", "provide"])):
        status, key = stack.api("POST", "/api/v1/api-keys/", {"name": f"schemathesis-{who}", "scopes": scopes},
                                key=seeded[who])
        assert status == 201, key
        runs[who] = _schemathesis(stack, key["secret"], tmp_path / who)
    deadline = time.monotonic() + 1100
    for who, run in runs.items():
        run.wait(timeout=max(1, deadline - time.monotonic()))
        out = (tmp_path / who / "out.txt").read_text()
        assert run.returncode == 0, f"schemathesis with the {who}'s key:\n{out[-20000:]}"
        generated = re.search(r"(\d+) generated, (\d+) passed", out)
        assert generated and generated.group(1) == generated.group(2) and int(generated.group(1)) > 1000, out[-3000:]
