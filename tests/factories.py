"""factory_boy factories for the fleet and accounts."""
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


def make_provider(user):
    """`user` takes the provider step (only providers register nodes); returns it."""
    from marketplace.products.accounts.providers import PROVIDER_TERMS_VERSION, provider_onboard

    provider_onboard(user=user, display_name=f"{user.get_username()} hosting", payout_country="DE",
                     terms_accepted=True, terms_version=PROVIDER_TERMS_VERSION)
    return user


class ProviderFactory(UserFactory):
    """An account that became a provider."""

    class Meta:
        skip_postgeneration_save = True

    @factory.post_generation
    def provider_profile(obj, create, extracted, **kwargs):
        if create:
            make_provider(obj)


def node_with_token(*, provider=None, name: str | None = None, region: str = "eu-west"):
    """A registered node and its agent token; its provider takes the provider step first when it has not."""
    provider = provider or UserFactory()
    from marketplace.models import ProviderProfile

    if not ProviderProfile.role_of(provider):
        make_provider(provider)
    return node_services.node_register(provider=provider, name=name or f"node-{factory.Faker._get_faker().uuid4()[:8]}",
                                       region=region)


def client_for(user):
    """A DRF test client signed in as `user` (no key, so every scope)."""
    from rest_framework.test import APIClient

    c = APIClient()
    c.force_authenticate(user)
    return c
