"""The provider role: an explicit step (terms with their version, display name, payout country); only providers
(and operators) register nodes, on the console and on POST /api/v1/nodes/; node owners from before get a profile."""
from __future__ import annotations

import pytest
from django.apps import apps
from rest_framework.test import APIClient

from marketplace.models import ProviderProfile
from marketplace.products.accounts.providers import PROVIDER_TERMS_VERSION, provider_onboard
from scheduler.errors import DomainError
from scheduler.models import Node
from tests.factories import ProviderFactory, UserFactory

pytestmark = pytest.mark.django_db


def onboard_form(**change):
    return {"display_name": "Ann's GPUs", "payout_country": "FR", "terms_accepted": "on",
            "terms_version": PROVIDER_TERMS_VERSION, **change}


def test_a_buyer_registering_a_node_by_api_gets_403_saying_how_to_become_a_provider():
    api = APIClient()
    api.force_authenticate(UserFactory())
    r = api.post("/api/v1/nodes/", {"name": "rack1"}, format="json")
    assert r.status_code == 403
    error = r.json()["error"]
    assert error["code"] == "not_a_provider" and "only providers register nodes" in error["message"]
    assert "/provider/" in error["message"] and Node.objects.count() == 0


@pytest.mark.parametrize("who", ["provider", "operator"])
def test_providers_and_operators_register_nodes_by_api(who):
    user = ProviderFactory() if who == "provider" else UserFactory(is_staff=True)
    api = APIClient()
    api.force_authenticate(user)
    assert api.post("/api/v1/nodes/", {"name": "rack1"}, format="json").status_code == 201


def test_the_console_sends_a_buyer_to_the_provider_step_and_then_back_to_register_a_node(client):
    user = UserFactory(username="ann")
    client.force_login(user)
    assert b'id="become-provider"' in client.get("/nodes/").content
    r = client.get("/nodes/register/")
    assert r.status_code == 302 and r["Location"] == "/provider/?next=/nodes/register/"
    page = client.get(r["Location"]).content.decode()
    assert f"version {PROVIDER_TERMS_VERSION}" in page and "Become a provider" in page
    # Posting a registration anyway is refused by the service, not only hidden by the page.
    client.post("/nodes/register/", {"name": "rack1", "region": "eu-west", "price_per_gpu_hour": "2"})
    assert Node.objects.count() == 0

    r = client.post("/provider/?next=/nodes/register/", onboard_form(terms_accepted="", next="/nodes/register/"))
    assert r.status_code == 400 and "accept the provider terms" in r.content.decode()
    r = client.post("/provider/", onboard_form(next="/nodes/register/"))
    assert r.status_code == 302 and r["Location"] == "/nodes/register/"
    profile = ProviderProfile.objects.get(user=user)
    assert (profile.display_name, profile.payout_country, profile.terms_version) == ("Ann's GPUs", "FR",
                                                                                     PROVIDER_TERMS_VERSION)
    assert profile.stripe_account_id == "" and profile.terms_accepted_at is not None
    r = client.post("/nodes/register/", {"name": "rack1", "region": "eu-west", "price_per_gpu_hour": "2"})
    assert r.status_code == 200 and b'id="node-token"' in r.content
    assert client.get("/provider/").content.decode().count('id="provider-role"') == 1


@pytest.mark.parametrize("change, field, said", [
    ({"terms_accepted": False}, "terms_accepted", "accept the provider terms"),
    ({"terms_version": "2020-01"}, "terms_accepted", "changed"),
    ({"display_name": " x "}, "display_name", "2 to 80"),
    ({"payout_country": "KP"}, "payout_country", "choose the country"),
])
def test_the_provider_step_refuses_what_is_missing_or_stale_and_writes_nothing(change, field, said):
    user = UserFactory()
    data = {"display_name": "Acme", "payout_country": "US", "terms_accepted": True,
            "terms_version": PROVIDER_TERMS_VERSION, **change}
    with pytest.raises(DomainError) as err:
        provider_onboard(user=user, **data)
    assert err.value.field == field and said in err.value.message
    assert not ProviderProfile.objects.filter(user=user).exists()


def test_a_provider_with_a_payout_account_cannot_move_it_to_another_country():
    user = ProviderFactory()
    ProviderProfile.objects.filter(user=user).update(stripe_account_id="acct_123", payout_country="DE")
    with pytest.raises(DomainError, match="another country"):
        provider_onboard(user=user, display_name="Acme", payout_country="US", terms_accepted=True,
                         terms_version=PROVIDER_TERMS_VERSION)
    provider_onboard(user=user, display_name="Acme 2", payout_country="DE", terms_accepted=True,
                     terms_version=PROVIDER_TERMS_VERSION)
    assert ProviderProfile.objects.get(user=user).stripe_account_id == "acct_123"


def test_node_owners_from_before_the_role_become_providers_asked_to_accept_the_terms(client):
    """The data migration's step, run on today's tables: an owner of nodes gets a profile, others none."""
    from importlib import import_module

    step = import_module("marketplace.migrations.0016_account_security").node_owners_become_providers
    owner, buyer = UserFactory(username="old-owner"), UserFactory()
    Node.objects.create(provider=owner, name="legacy", token_hash="x" * 64, token_prefix="gpm_node_xxx")
    step(apps, None)
    step(apps, None)  # twice: nothing doubles
    profile = ProviderProfile.objects.get(user=owner)
    assert profile.terms_version == "" and profile.payout_country == "" and profile.display_name == "old-owner"
    assert not ProviderProfile.objects.filter(user=buyer).exists()
    client.force_login(owner)
    page = client.get("/provider/").content.decode()
    assert 'id="terms-outdated"' in page and "say where your payouts go" in page
    assert client.get("/nodes/register/").status_code == 200  # the role stands meanwhile


def test_the_demo_provider_took_the_provider_step():
    from marketplace.products.demo import demo_seed

    demo_seed()
    profile = ProviderProfile.objects.get(user__username="provider")
    assert profile.terms_version == PROVIDER_TERMS_VERSION and profile.payout_country == "US"
    assert not ProviderProfile.objects.filter(user__username="buyer").exists()
