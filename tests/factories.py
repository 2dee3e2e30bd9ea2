"""factory_boy factories for the fleet."""
from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from scheduler.services import nodes as node_services


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests")


def node_with_token(*, provider=None, name: str | None = None, region: str = "eu-west"):
    """A registered node and its agent token."""
    provider = provider or UserFactory()
    return node_services.node_register(provider=provider, name=name or f"node-{factory.Faker._get_faker().uuid4()[:8]}",
                                       region=region)
