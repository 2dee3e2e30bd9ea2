"""A small stand-in for agents in market tests: nodes that said hello with a simulated backend, and a
`play` that answers their open commands with that backend, the way a real agent would."""
from __future__ import annotations

from decimal import Decimal

from marketplace.lifecycle import leases
from marketplace.money import ledger
from marketplace.products import reservations
from nodeagent import protocol
from nodeagent.errors import BackendError
from scheduler.models import AgentCommand, Node
from scheduler.services import commands as command_services
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import UserFactory, node_with_token


class Fleet:
    def __init__(self):
        self.backends: dict = {}  # node id -> simulated backend

    def node(self, spec: str = "a100-80gb:1", *, region: str = "eu-west", price: str = "2.00", provider=None,
             cuda: str | None = None) -> Node:
        provider = provider or UserFactory()
        node, _ = node_with_token(provider=provider, region=region)
        Node.objects.filter(pk=node.pk).update(price_per_gpu_hour=Decimal(price))
        backend = sim_backend(spec, hostname=f"h-{str(node.pk)[:6]}")
        frame = hello_from(backend)
        if cuda:
            frame["cuda_version"] = cuda
        node_services.node_hello(node_id=node.pk, frame=frame)
        self.backends[node.pk] = backend
        node.refresh_from_db()
        return node

    def play(self, *, fail_creates: bool = False) -> int:
        """Answer every open command of every node (as its agent would); returns how many."""
        done = 0
        while True:
            open_cmds = list(AgentCommand.objects.filter(state__in=AgentCommand.OPEN_STATES).order_by("created_at"))
            if not open_cmds:
                return done
            for cmd in open_cmds:
                command_services.command_complete(node_id=cmd.node_id, frame=self._run(cmd, fail_creates))
                done += 1

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
                result = {"acknowledged": True}
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
