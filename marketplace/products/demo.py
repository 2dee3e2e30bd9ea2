"""Demo data: a provider (with its provider profile), a buyer and an operator, and the provider's simulated nodes
with fresh tokens."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from marketplace.money import movements
from marketplace.products.accounts.providers import PROVIDER_TERMS_VERSION, provider_onboard
from scheduler.models import Node
from scheduler.services import nodes as node_services

DEMO_USERS = (
    # username, password, is_staff
    ("provider", "provider-demo", False),
    ("buyer", "buyer-demo", False),
    ("operator", "operator-demo", True),
)


@dataclass(frozen=True)
class DemoNode:
    name: str
    region: str
    simulate: str  # the agent's --simulate spec
    price: Decimal


DEMO_BUYER_CREDIT = Decimal("25.00")

DEMO_NODES = (
    DemoNode("demo-h100", "eu-west", "h100-80gb:8", Decimal("2.40")),
    DemoNode("demo-a100", "us-east", "a100-80gb:4,a100-40gb:2", Decimal("1.50")),
    DemoNode("demo-l4", "eu-central", "l4:2,l40s:1", Decimal("0.60")),
)


def demo_seed(*, public_address: str = "127.0.0.1") -> list[tuple[DemoNode, Node, str]]:
    """Create the demo accounts (idempotent) and give each demo node a fresh agent token; the nodes' published
    ports are reached at `public_address` (the demo's containers run on this machine)."""
    User = get_user_model()
    with transaction.atomic():
        users = {}
        for username, password, staff in DEMO_USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.set_password(password)
            user.is_staff = user.is_superuser = staff
            user.save()
            users[username] = user
        # The provider took the provider step (terms, payout country) like any provider must before registering.
        provider_onboard(user=users["provider"], display_name="Demo GPU Hosting", payout_country="US",
                         terms_accepted=True, terms_version=PROVIDER_TERMS_VERSION)
        out = []
        for spec in DEMO_NODES:
            node = (Node.objects.filter(provider=users["provider"], name=spec.name)
                    .exclude(status=Node.Status.DELETED).first())
            if node is None:
                node, token = node_services.node_register(provider=users["provider"], name=spec.name,
                                                          region=spec.region, price_per_gpu_hour=spec.price)
            else:
                token = node_services.node_rotate_token(node=node)
            Node.objects.filter(pk=node.pk).update(public_address=public_address)
            out.append((spec, node, token))
        # A welcome credit, once, so the demo buyer can order at once (topping up works too).
        movements.credit(user=users["buyer"], amount=DEMO_BUYER_CREDIT, idempotency_key="demo:buyer-credit",
                      memo="demo welcome credit")
    return out
