"""A small stand-in for agents in market tests: nodes that said hello with a simulated backend and the
simulated container runtime, and a `play` that answers their open commands with them and hands the server what
the runtime reported (workload states, output), the way a real agent would. `report` is what an agent would
say of a container by itself (it exited, it failed)."""
from __future__ import annotations

import threading
import time
from decimal import Decimal

from marketplace.lifecycle import leases
from marketplace.models import Lease
from marketplace.money import ledger
from marketplace.products import reservations
from nodeagent import protocol
from nodeagent.errors import BackendError
from nodeagent.runtime.base import WorkloadSpec
from nodeagent.runtime.simulated import SimulatedRuntime
from scheduler.models import AgentCommand, Node
from scheduler.ports import market
from scheduler.services import commands as command_services, nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import UserFactory, node_with_token


class Fleet:
    def __init__(self, *, clock=time.time):
        self.clock = clock  # epoch seconds the runtimes stamp their reports with: a test may run its own clock
        self.backends: dict = {}  # node id -> simulated backend
        self.runtimes: dict = {}  # node id -> simulated runtime
        self.frames: list = []  # (node id, frame) the runtimes reported, not yet handed to the server
        self._lock = threading.Lock()

    def node(self, spec: str = "a100-80gb:1", *, region: str = "eu-west", price: str = "2.00", provider=None,
             cuda: str | None = None, runtime: str | None = "simulated") -> Node:
        """A node whose agent said hello; `runtime`: "simulated" (runs containers), "none", or None (an agent
        from before workloads)."""
        provider = provider or UserFactory()
        node, _ = node_with_token(provider=provider, region=region)
        Node.objects.filter(pk=node.pk).update(price_per_gpu_hour=Decimal(price))
        backend = sim_backend(spec, hostname=f"h-{str(node.pk)[:6]}")
        frame = hello_from(backend)
        if cuda:
            frame["cuda_version"] = cuda
        if runtime:
            frame["runtime"] = runtime
        node_services.node_hello(node_id=node.pk, frame=frame)
        self.backends[node.pk] = backend
        if runtime == "simulated":
            # No pull delay, and output only when a test asks for it (`output`): the test decides what happens.
            self.runtimes[node.pk] = SimulatedRuntime(report=lambda f, n=node.pk: self._reported(n, f),
                                                      node=str(node.pk), pull_seconds=0, log_every=3600,
                                                      clock=self.clock)
        node.refresh_from_db()
        return node

    def _reported(self, node_id, frame: dict) -> None:
        with self._lock:
            self.frames.append((node_id, frame))

    def play(self, *, fail_creates: bool = False) -> int:
        """Answer every open command of every node and hand over what their runtimes reported (as their agents
        would), until nothing is left; returns how many commands."""
        done = 0
        while True:
            self.deliver()
            open_cmds = list(AgentCommand.objects.filter(state__in=AgentCommand.OPEN_STATES).order_by("created_at"))
            if not open_cmds:
                if not self.frames:
                    return done
                continue
            for cmd in open_cmds:
                command_services.command_complete(node_id=cmd.node_id, frame=self._run(cmd, fail_creates))
                done += 1

    def deliver(self) -> int:
        """Hand the server the frames the runtimes reported, as the gateway does."""
        with self._lock:
            frames, self.frames = self.frames, []
        for node_id, frame in frames:
            if frame["type"] == "workload":
                market().workload_state(node_id=node_id, frame=protocol.validate_workload(frame))
            elif frame["type"] == "logs":
                market().workload_output(node_id=node_id, frame=protocol.validate_logs(frame))
        return len(frames)

    def report(self, lease: Lease, state: str, *, at: float | None = None, **kw) -> None:
        """What the lease's agent says of its container by itself (it exited, it failed, ...), handed over now."""
        node_id = lease.slice.gpu.node_id
        self._reported(node_id, protocol.workload(lease=str(lease.pk), state=state, at=at or self.clock(), **kw))
        self.deliver()

    def output(self, lease: Lease, data: str) -> None:
        self._reported(lease.slice.gpu.node_id, protocol.logs(lease=str(lease.pk), data=data))
        self.deliver()

    def restart(self, node: Node) -> list[dict]:
        """The node's agent restarts: it says hello again with the containers its runtime finds."""
        backend = self.backends[node.pk]
        frame = hello_from(backend)
        frame["runtime"] = "simulated"
        found = self.runtimes[node.pk].found()
        frame["workloads"] = found
        node_services.node_hello(node_id=node.pk, frame=frame)
        market().workloads_found(node_id=node.pk, found=found)
        return found

    def _run(self, cmd: AgentCommand, fail_creates: bool) -> dict:
        backend = self.backends[cmd.node_id]
        a = cmd.args
        try:
            if cmd.op == "create_instance":
                if fail_creates:
                    raise BackendError("insufficient_resources", "In use by another client")
                result = backend.create_instance(a["gpu_uuid"], a["profile"], a["start"])
            elif cmd.op == "destroy_instance":
                result = backend.destroy_instance(a["gpu_uuid"], a["instance_uuid"])
            elif cmd.op == "notice":
                runtime = self.runtimes.get(cmd.node_id)
                result = {"acknowledged": True}
                if runtime is not None and a.get("lease"):
                    result.update(runtime.notice(a["lease"], a.get("mode", "sigterm"), a["deadline"], a["kind"]))
            elif cmd.op == "start_workload":
                runtime = self.runtimes.get(cmd.node_id)
                if runtime is None:
                    raise BackendError(protocol.E_NOT_SUPPORTED, "this node runs no container engine")
                result = runtime.start(WorkloadSpec.from_command(a["lease"], a["spec"]))
            elif cmd.op == "stop_workload":
                runtime = self.runtimes.get(cmd.node_id)
                result = runtime.stop(a["lease"], a["grace_seconds"]) if runtime else {"removed": False}
            else:
                result = {"pong": True}
        except BackendError as exc:
            return protocol.result_error(id=str(cmd.id), code=exc.code, message=exc.message)
        return protocol.result_ok(id=str(cmd.id), result=result)


def top_up(user, amount) -> None:
    ledger.post(kind="topup", memo="test top-up", lines=[(ledger.platform_account("stripe_clearing"), -Decimal(amount)),
                                                         (ledger.account_for(user=user, kind="wallet"), Decimal(amount))])


def wallet(user) -> Decimal:
    return ledger.wallet_balance(user=user)


def earnings(user) -> Decimal:
    acc = ledger.account_for(user=user, kind="earnings")
    return ledger.balance(account=acc)


def beat(*, now) -> None:
    """The lease and reservation beats of one moment, in the order beat runs them."""
    leases.leases_tick(now=now)
    reservations.reservations_tick(now=now)
