"""The installed `gpum` against a live server: the CLI's own wheel in a fresh venv (nothing of this checkout), a real
uvicorn + Celery worker and beat, simulated agents, a local fake Stripe; every command run as a subprocess the way a
buyer or a script runs it, its output and exit status checked against what the REST API says. The last test adds a
node whose containers run on Podman and logs into one with `gpum ssh`."""
from __future__ import annotations

import json
import queue
import re
import shlex
import stat
import subprocess
import sys
import threading
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

import gpumarket
from nodeagent.packaging import build
from nodeagent.runtime.base import LABEL_LEASE, LABEL_NODE
from nodeagent.runtime.docker import listed_containers
from tests.e2e.livestack import LiveStack, call_api, wait_until
from tests.enginefix import free_port_block, remove_quietly, ssh_keypair
from tests.wheels import absent, every_module_imports, install_alone

pytestmark = [pytest.mark.e2e]

NODES = [("cli-a100", "a100-80gb:2"), ("cli-l4", "l4:2")]
SECRET = "hf_cli_secret_value_42"
SLICE = "a100-80gb:1g.10gb:eu-west"


class Gpum:
    """The installed console script, run as a buyer runs it: its own HOME, the server's URL in GPUM_URL, a key in
    GPUM_API_KEY (or the file `gpum login` writes), no terminal."""

    def __init__(self, exe: Path, home: Path, url: str) -> None:
        self.exe, self.home, self.url = exe, home, url

    def env(self, key: str | None, extra: dict | None = None) -> dict:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "GPUM_URL": self.url, "LANG": "C.UTF-8",
               "HF_TOKEN": SECRET}
        if key:
            env["GPUM_API_KEY"] = key
        return env | (extra or {})

    def __call__(self, *args: str, key: str | None = None, expect: int = 0, input: str = "", env: dict | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([str(self.exe), *args], env=self.env(key, env), capture_output=True, text=True,
                             input=input, timeout=timeout)
        assert SECRET not in out.stdout + out.stderr, f"gpum {shlex.join(args)} printed a secret value"
        assert out.returncode == expect, (f"gpum {shlex.join(args)} exited {out.returncode}, not {expect}\n"
                                          f"stdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-3000:]}")
        return out

    def json(self, *args: str, key: str | None = None):
        return json.loads(self("--json", *args, key=key).stdout)

    def follow(self, *args: str, key: str) -> tuple[subprocess.Popen, "queue.Queue[str]"]:
        """A long-running gpum (logs -f, metrics -f) whose stdout lines arrive in a queue."""
        proc = subprocess.Popen([str(self.exe), *args], env=self.env(key), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
        return proc, lines


@pytest.fixture(scope="module")
def gpum_bin(tmp_path_factory) -> Path:
    """`gpum` from the CLI's wheel, installed alone into a fresh venv from the offline wheelhouse."""
    tmp = tmp_path_factory.mktemp("cli-wheel")
    wheel = build.build_wheel(tmp / "dist", build.CLI)
    bin_dir = install_alone(wheel, tmp / "venv")
    for module in ("django", "scheduler", "nodeagent", "marketplace"):
        assert absent(bin_dir / "python", module, tmp), f"{module} is importable beside the CLI"
    assert every_module_imports(bin_dir / "python", "gpumarket", tmp).is_relative_to(tmp / "venv")
    return bin_dir / "gpum"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-live")
    s = LiveStack(tmp, nodes=NODES, stripe=True, agent_interval=0.5, env={
        "FLEET_METRICS_FLUSH": "0.5", "FLEET_OFFLINE_CHECK": "2", "MARKET_METER_SECONDS": "0.5",
        "MARKET_QUEUE_SECONDS": "0.5", "MARKET_LEASE_TICK_SECONDS": "0.5"})
    with s.running():
        wait_until(lambda: all(n["status"] == "online" for n in s.api("GET", "/api/v1/nodes/")[1]["results"]),
                   timeout=60, what="the agents online")
        # The keys a buyer's scripts hold: read what is theirs and trade (buy, end, top up); nothing of providing.
        s.buyers = {b["name"]: b for b in s.add_buyers(["cli-buyer", "cli-seller", "cli-login"], credit="100",
                                                       scopes=["read", "trade"])}
        yield s


@pytest.fixture(scope="module")
def gpum(gpum_bin, stack, tmp_path_factory) -> Gpum:
    return Gpum(gpum_bin, tmp_path_factory.mktemp("home"), stack.url)


def key_of(stack, name: str) -> str:
    return stack.buyers[name]["api_key"]


def api(stack, method: str, path: str, body: dict | None = None, *, buyer: str) -> tuple[int, dict]:
    return call_api(stack.url, method, path, body, key=key_of(stack, buyer))


def test_the_installed_gpum_says_its_version_and_helps(gpum):
    assert gpum("--version").stdout.strip() == f"gpum {gpumarket.__version__}"
    out = gpum("--help").stdout
    for command in ("login", "offers", "order", "leases", "lease", "ssh", "logs", "metrics", "resale", "balance",
                    "statements", "topup"):
        assert re.search(rf"^\s+{command}\s+\S", out, re.M), f"`{command}` missing from gpum --help"
    assert "exit status: 0 ok, 1" in out
    assert "usage: gpum order spot" in gpum("order", "spot", "--help").stdout
    assert "the following arguments are required: --bid" in gpum("order", "spot", "--model", "l4", expect=2).stderr


def test_login_checks_the_key_stores_it_for_its_owner_only_and_logout_forgets_it(gpum, stack, tmp_path):
    login = Gpum(gpum.exe, tmp_path, stack.url)
    bad = "gpm_key_" + "x" * 43
    refused = login("login", "--key", "-", "--url", stack.url, input=bad + "\n", env={"GPUM_URL": ""}, expect=3)
    status, body = call_api(stack.url, "GET", "/api/v1/wallet/", key=bad)
    assert status == 401 and refused.stderr.startswith(f"gpum: {body['error']['message']}\n")
    assert not (tmp_path / ".config" / "gpumarket" / "config.json").exists()

    key = key_of(stack, "cli-login")
    out = login("login", "--key", "-", "--url", stack.url + "/api/v1/", input=key + "\n", env={"GPUM_URL": ""})
    path = tmp_path / ".config" / "gpumarket" / "config.json"
    assert f"Logged in to {stack.url} " in out.stdout and key not in out.stdout
    assert json.loads(path.read_text()) == {"url": stack.url, "key": key}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # The next commands read the file: no URL or key in the environment.
    balance = login("--json", "balance", env={"GPUM_URL": ""})
    assert json.loads(balance.stdout) == call_api(stack.url, "GET", "/api/v1/wallet/", key=key)[1]
    # The environment wins over the file.
    env_refused = login("balance", env={"GPUM_URL": "", "GPUM_API_KEY": bad}, expect=3)
    assert env_refused.stderr.startswith(f"gpum: {body['error']['message']}\n")

    assert "Logged out" in login("logout", env={"GPUM_URL": ""}).stdout and not path.exists()
    gone = login("balance", env={"GPUM_URL": ""}, expect=3)
    assert "not logged in" in gone.stderr and "gpum login" in gone.stderr
    assert "cannot reach http://127.0.0.1:9" in login("balance", key=key, env={"GPUM_URL": "http://127.0.0.1:9"},
                                                      expect=5).stderr


def test_offers_are_the_catalogs_with_its_filters_in_a_table_that_fits(gpum, stack):
    key = key_of(stack, "cli-buyer")
    listed = gpum.json("offers", "--model", "a100-80gb", "--min-memory", "20", "--mode", "spot", key=key)
    status, body = call_api(stack.url, "GET", "/api/v1/offers/?gpu_model=a100-80gb&min_memory_gb=20&mode=spot",
                            key=key)
    assert status == 200 and listed == body["results"] and listed
    assert all(o["memory_gb"] >= 20 and o["id"].startswith("a100-80gb:") for o in listed)
    # No key needed to browse the catalog.
    table = gpum("offers", "--available", "--sort", "pu", "--desc", env={"COLUMNS": "72"}).stdout.splitlines()
    assert table[0].split()[:5] == ["OFFER", "MEM", "GB", "PU", "FREE"]
    assert all(len(line) <= 72 for line in table)
    assert any(line.startswith("a100-80gb:7g.80gb:eu-west") for line in table)
    assert any(line.startswith("l4:whole:eu-west") for line in table)
    pus = [float(line.split()[2]) for line in table[1:]]
    assert pus == sorted(pus, reverse=True)
    assert {o["id"] for o in gpum.json("offers", "--gpus", "8")} == {  # at least 8 instances free now
        "a100-80gb:1g.20gb:eu-west", "a100-80gb:1g.10gb:eu-west"}
    assert gpum("offers", "--gpus", "15").stderr.strip() == "no offers match"
    unknown = gpum("offers", "--model", "b200", expect=1)
    assert "unknown GPU model 'b200'" in unknown.stderr


def test_an_on_demand_container_from_order_to_end(gpum, stack):
    key = key_of(stack, "cli-buyer")
    ordered = gpum("order", "on-demand", "--offer", SLICE, "--image", "docker.io/library/busybox:latest",
                   "--cmd", "sh -c 'sleep 3600'", "--env", "GREETING=hi", "--secret-env", "HF_TOKEN",
                   "--port", "22", "--port", "8888/http", "--duration", "30m", "--wait", key=key)
    lease_id = re.search(r"^lease ([0-9a-f]{8}) running: a100-80gb 1g\.10gb in eu-west", ordered.stdout, re.M)[1]
    lease = gpum.json("lease", "show", lease_id, key=key)
    assert api(stack, "GET", f"/api/v1/leases/{lease['id']}/", buyer="cli-buyer")[1]["id"] == lease["id"]
    conn = lease["connection"]
    assert lease["state"] == "running" and conn["ssh"] in ordered.stdout and conn["urls"][0] in ordered.stdout
    assert "provisioning" in ordered.stderr  # what it waited for, on stderr

    # The order shows its workload without the secret's value (the API has it null; the CLI names it only).
    order = gpum.json("order", "show", lease["order"][:8], key=key)
    assert {"name": "HF_TOKEN", "value": None, "secret": True} in order["workload"]["env"]
    assert "HF_TOKEN(secret)" in gpum("order", "show", lease["order"][:8], key=key).stdout

    listed = gpum("leases", key=key, env={"COLUMNS": "200"}).stdout
    assert re.search(rf"^{lease_id}\s+on-demand\s+running\s+a100-80gb 1g\.10gb\s+eu-west", listed, re.M)
    assert [x["id"] for x in gpum.json("leases", key=key)] == [lease["id"]]
    shown = gpum("lease", "show", lease["id"][:5], key=key).stdout
    assert re.search(rf"^ssh\s+{re.escape(conn['ssh'])}    \(gpum ssh {lease_id}\)$", shown, re.M)
    assert re.search(r"^state\s+running$", shown, re.M) and re.search(r"^container\s+running$", shown, re.M)
    assert re.search(rf"^CUDA_VISIBLE_DEVICES\s+{re.escape(conn['device_uuid'])}$", shown, re.M)

    # The kept output, and the same followed live until the lease ends.
    logs = wait_until(lambda: (lambda o: o if "step" in o else None)(gpum("logs", lease_id, key=key).stdout),
                      timeout=30, what="the container's output")
    assert "[simulated] docker.io/library/busybox:latest" in logs
    follower, lines = gpum.follow("logs", lease_id, "-f", key=key)

    # Metrics: frames of the lease's GPU from the console socket, with the buyer's key.
    frames = [json.loads(line) for line in gpum("metrics", lease_id, "-n", "3", "--json", key=key,
                                                 timeout=60).stdout.splitlines()]
    assert len(frames) == 3 and all(f["type"] == "metrics" for f in frames)
    assert {g["uuid"] for f in frames for g in f["gpus"]} == {conn["gpu_uuid"]}  # its GPU only, not the node's
    table = gpum("metrics", lease_id, key=key, timeout=60).stdout.splitlines()
    assert table[0].split()[:3] == ["TIME", "UTIL", "%"] and len(table) == 2

    # ssh: the lease's line, its host key kept under the lease's alias, the caller's arguments last.
    line = gpum("ssh", lease_id, "-i", "/keys/id_ed25519", "--print", "--", "-L", "8888:localhost:8888",
                "nvidia-smi", key=key).stdout.strip()
    port, dest = conn["ssh"].split()[2], conn["ssh"].split()[3]
    known = gpum.home / ".config" / "gpumarket" / "known_hosts"
    assert shlex.split(line) == ["ssh", "-p", port, "-i", "/keys/id_ed25519", "-o", "IdentitiesOnly=yes",
                                 "-o", f"HostKeyAlias=gpum-{lease['id']}", "-o", f"UserKnownHostsFile={known}",
                                 "-o", "StrictHostKeyChecking=accept-new", dest, "-L", "8888:localhost:8888",
                                 "nvidia-smi"]

    # Ending asks first: nobody can answer here, so it refuses; --yes ends it.
    refused = gpum("lease", "end", lease_id, key=key, expect=2)
    assert "pass --yes" in refused.stderr
    assert gpum.json("lease", "show", lease_id, key=key)["state"] == "running"
    saw = wait_until(lambda: _drain(lines), timeout=30, what="followed output")
    assert "step" in saw
    ended = gpum("lease", "end", lease_id, "--yes", key=key)
    assert re.match(rf"lease {lease_id} (ending|ended): billing stopped; it cost \$\d", ended.stdout)
    assert follower.wait(timeout=60) == 0, follower.stderr.read()
    final = wait_until(lambda: (lambda x: x if x["state"] == "ended" else None)(
        gpum.json("lease", "show", lease_id, key=key)), timeout=60, what="the lease ended")
    assert gpum("leases", key=key).stderr.strip() == "no open leases (--all shows ended ones)"
    assert re.search(rf"^{lease_id}\s+on-demand\s+ended", gpum("leases", "--all", key=key,
                                                               env={"COLUMNS": "200"}).stdout, re.M)
    assert f"lease {lease_id} is already ended" in gpum("lease", "end", lease_id, "--yes", key=key, expect=1).stderr

    # What it cost: the wallet's latest movement and the month's statement say it as the API does.
    wallet = gpum.json("balance", key=key)
    assert wallet == api(stack, "GET", "/api/v1/wallet/", buyer="cli-buyer")[1]
    assert "usage" in {e["transaction"]["kind"] for e in wallet["recent_entries"]}
    assert re.match(r"balance\s+\$\d+\.\d\d", gpum("balance", key=key).stdout)
    month = datetime.now(timezone.utc).strftime("%Y-%m")
    statement = gpum.json("statements", "--month", month, key=key)
    assert statement == api(stack, "GET", f"/api/v1/statements/?month={month}", buyer="cli-buyer")[1]
    assert statement["projects"][0]["slices"][0]["amount"] == final["cost_charged"]
    text = gpum("statements", "--month", month, key=key, env={"COLUMNS": "120"}).stdout
    assert "usage a100-80gb 1g.10gb" in text and re.search(r"^total\s+\$", text, re.M)
    assert gpum("statements", "--month", month, "--csv", key=key).stdout.startswith(
        "month,project,item,gpu_model,profile,gpu_seconds,amount_usd")


def _drain(lines: "queue.Queue[str]") -> str:
    out = []
    while True:
        try:
            out.append(lines.get_nowait())
        except queue.Empty:
            return "".join(out)


def test_errors_say_the_apis_words_with_their_exit_status(gpum, stack):
    key = key_of(stack, "cli-buyer")
    absent_lease = str(uuid.uuid4())
    assert gpum("lease", "show", absent_lease, key=key, expect=4).stderr.startswith("gpum: not found")
    # Prefixes none of the buyer's leases has (a lease ID starts with "0" one time in 16): a letter and a digit.
    ids = [lease["id"] for lease in gpum.json("leases", "--all", key=key)]
    letters, digits = ([p for p in candidates if not any(i.startswith(p) for i in ids)][0]
                       for candidates in (("abc", "fed", "bad", "dec"), ("0", "1", "42", "907")))
    assert "no lease of yours has an ID starting with" in gpum("logs", letters, key=key, expect=4).stderr + \
        gpum("logs", digits, key=key, expect=4).stderr
    # A bid under the spot price: refused with the market's sentence, as the API refuses the same body, and not
    # the engine's reason keys under it.
    body = {"mode": "spot", "gpu_models": ["l4"], "whole_gpu": True, "max_price_per_hour": "0.10"}
    status, refusal = api(stack, "POST", "/api/v1/orders/", body, buyer="cli-buyer")
    assert status == 409
    out = gpum("order", "spot", "--model", "l4", "--whole-gpu", "--bid", "0.10", key=key, expect=1)
    assert out.stderr.startswith(f"gpum: {refusal['error']['message']}\n")
    assert refusal["error"]["details"]["explain"] and refusal["error"]["details"]["reasons"]
    for reason in refusal["error"]["details"]["reasons"]:
        assert f"  - {reason}" not in out.stderr
    # A field the server refuses is named with the flag that set it.
    bad = gpum("order", "on-demand", "--model", "no-such-gpu", key=key, expect=1)
    assert "(gpu_models is --model)" in bad.stderr
    # Usage errors never reach the server.
    assert "--port" in gpum("order", "on-demand", "--port", "70000", key=key, expect=2).stderr
    assert "needs --image or --template" in gpum("order", "on-demand", "--env", "A=1", key=key, expect=2).stderr


def test_a_reserved_window_is_listed_for_resale_and_bought_by_another_buyer(gpum, stack):
    seller, buyer = key_of(stack, "cli-seller"), key_of(stack, "cli-buyer")
    order = gpum.json("order", "reserved", "--offer", "l4:whole:eu-west", "--start", "+2h", "--hours", "3", key=seller)
    assert order["state"] == "placed" and len(order["reservations"]) == 1
    reservation = order["reservations"][0]
    assert [r["id"] for r in gpum.json("reservations", key=seller)] == [reservation]
    sold = gpum("resale", "sell", reservation[:6], "--start", "+3h", "--hours", "1", "--ask", "0.50", key=seller)
    listing_id = re.search(r"listing ([0-9a-f]{8})$", sold.stdout.strip())[1]

    listed = gpum("resale", "list", "--model", "l4", key=buyer, env={"COLUMNS": "150"}).stdout
    assert re.search(rf"^{listing_id}\s+l4 whole\s+eu-west\s+.+\s1\s+0\.5000\s+\$0\.50$", listed, re.M)
    assert [x["id"][:8] for x in gpum.json("resale", "list")] == [listing_id]  # public: no key needed
    wallet_before = gpum.json("balance", key=buyer)["balance"]
    bought = gpum("resale", "buy", listing_id, key=buyer).stdout
    assert f"Bought listing {listing_id} for $0.50" in bought
    mine = gpum.json("reservations", key=buyer)
    assert len(mine) == 1 and mine[0]["price_total"] == "0.500000" and mine[0]["gpu_model"] == "l4"
    assert Decimal(gpum.json("balance", key=buyer)["balance"]) == Decimal(wallet_before) - Decimal("0.5")
    # Sold: no open listing has that ID any more.
    assert f"no open listing has an ID starting with {listing_id}" in gpum("resale", "buy", listing_id, key=buyer,
                                                                         expect=4).stderr


def test_a_top_up_pays_with_a_card_and_a_declined_card_is_the_apis_error(gpum, stack):
    key = key_of(stack, "cli-seller")
    before = Decimal(gpum.json("balance", key=key)["balance"])
    assert gpum("topup", "10", "--card", "4242424242424242", key=key).stdout.startswith("Paid $10.00")
    assert Decimal(gpum.json("balance", key=key)["balance"]) == before + 10
    declined = gpum("topup", "10", "--card", "4000000000000341", key=key, expect=1)
    payments = api(stack, "GET", "/api/v1/payments/?status=failed", buyer="cli-seller")[1]["results"]
    assert payments and declined.stderr.startswith(f"gpum: {payments[0]['failure_message']}")
    browser = gpum("topup", "10", key=key, expect=2)
    assert f"{stack.url}/billing/" in browser.stderr


# --- a real container and a real ssh login -------------------------------------------------------------------------

ENGINE_NODE = r"""
import json
from decimal import Decimal
from django.contrib.auth import get_user_model
from scheduler.models import Node
from scheduler.services.nodes import node_register
spec = json.loads(%r)
node, token = node_register(provider=get_user_model().objects.get(username="e2e-provider"), name=spec["name"])
# Buyers reach its containers on loopback; a 1g.10gb slice (1/7 of the GPU) gets 1 CPU and 1 GB of these.
Node.objects.filter(pk=node.pk).update(public_address="127.0.0.1", port_range_start=spec["ports"][0],
                                       port_range_end=spec["ports"][1], cpus_per_gpu=Decimal("7"),
                                       ram_gb_per_gpu=Decimal("7"))
print("NODE" + json.dumps({"id": str(node.pk), "name": spec["name"], "token": token, "simulate": spec["simulate"]}))
"""


def test_gpum_ssh_logs_into_a_real_container_with_the_accounts_key(gpum, stack, engine_url, engine, sshd_image,
                                                                     tmp_path):
    key = key_of(stack, "cli-buyer")
    node = stack.shell(ENGINE_NODE % json.dumps({"name": "cli-podman", "simulate": "h100-80gb:1",
                                                 "ports": free_port_block(10)}), "NODE")
    stack.start_agent(node, command=(sys.executable, "-m", "nodeagent", "--runtime", "docker", "--engine-url",
                                     engine_url, "--gpu-devices", "none", "--bind-address", "127.0.0.1"))
    try:
        wait_until(lambda: stack.api("GET", f"/api/v1/nodes/{node['id']}/")[1].get("status") == "online",
                   timeout=60, what="the Podman node online")
        private, _ = ssh_keypair(tmp_path, "laptop")
        added = gpum("ssh-key", "add", private + ".pub", key=key).stdout
        assert added.startswith("Added SSH key") and "laptop@e2e" in added
        assert "laptop@e2e" in gpum("ssh-key", "list", key=key).stdout

        ordered = gpum("order", "on-demand", "--model", "h100-80gb", "--memory", "10", "--image", sshd_image,
                       "--port", "22", "--duration", "15m", "--wait", "--timeout", "2m", key=key)
        lease_id = re.search(r"^lease ([0-9a-f]{8}) running", ordered.stdout, re.M)[1]
        assert re.search(r"^ssh\s+ssh -p \d+ root@127\.0\.0\.1", ordered.stdout, re.M)

        def login():
            out = subprocess.run([str(gpum.exe), "ssh", lease_id, "-i", private, "--", "-o", "BatchMode=yes",
                                  "-o", "ConnectTimeout=10", "echo", "from-$(hostname)"], env=gpum.env(key),
                                 capture_output=True, text=True, timeout=60)
            return out if out.returncode == 0 else None
        out = wait_until(login, timeout=40, interval=1, what="an ssh login through gpum ssh")
        assert out.stdout.startswith("from-")
        full_id = gpum.json("lease", "show", lease_id, key=key)["id"]
        # Its host key was trusted on first use, under the lease's own alias (hashed, as Debian's ssh_config asks).
        known = gpum.home / ".config" / "gpumarket" / "known_hosts"
        found = subprocess.run(["ssh-keygen", "-F", f"gpum-{full_id}", "-f", str(known)], capture_output=True,
                               text=True)
        assert found.returncode == 0 and "ssh-ed25519" in found.stdout
        gpum("lease", "end", lease_id, "--yes", key=key)
        wait_until(lambda: not _containers(engine, "cli-podman.e2e"), timeout=60, what="its container removed")
    finally:
        for listed in _containers(engine, "cli-podman.e2e"):
            remove_quietly(engine, listed["id"])


def _containers(engine, host: str) -> list[dict]:
    return [c for c in listed_containers(engine, {"label": LABEL_LEASE}) if c["labels"].get(LABEL_NODE) == host]

