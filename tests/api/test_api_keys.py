"""API keys through the API (made with scopes, the secret shown once, listed, revoked with the keys they made) and
scopes enforced on every endpoint: safe methods need `read`, market and money writes `trade`, fleet writes
`provide`; a session may do all its user may."""
from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from marketplace.models import ApiKey
from marketplace.products.apikeys import api_key_create, api_key_resolve
from tests.factories import ProviderFactory, UserFactory

pytestmark = pytest.mark.django_db


def with_key(secret: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return c


def key(user, *scopes) -> str:
    return api_key_create(user=user, name="k", scopes=scopes)[1]


def operations() -> list[tuple[str, str, dict]]:
    """(method, path with placeholders filled, operation) of every operation in the schema."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    out = []
    for path, ops in schema["paths"].items():
        filled = re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)
        out += [(method.upper(), filled, op) for method, op in ops.items()]
    return out


PUBLIC = ("/api/v1/offers/", "/api/v1/spot-prices/", "/api/v1/resale-listings/")


def scope_of_writes(path: str) -> str:
    """What the brief says each write needs: the fleet and payouts `provide`, the market and money `trade`."""
    fleet = ("/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/slices/", "/api/v1/payouts/")
    return "provide" if path.startswith(fleet) else "trade"


def test_a_key_made_through_the_api_shows_its_secret_once_and_works_within_its_scopes():
    user = UserFactory()
    session = APIClient()
    session.force_login(user)
    r = session.post("/api/v1/api-keys/", {"name": "ci", "scopes": ["trade", "read"]}, format="json")
    assert r.status_code == 201, r.content
    made = r.json()
    assert made["scopes"] == ["read", "trade"] and made["active"] and made["parent"] is None
    assert made["secret"].startswith("gpm_key_") and made["prefix"] == made["secret"][:16]
    listed = session.get("/api/v1/api-keys/").json()["results"]
    assert [k["id"] for k in listed] == [made["id"]] and "secret" not in listed[0]
    assert "secret" not in session.get(f"/api/v1/api-keys/{made['id']}/").json()
    assert with_key(made["secret"]).get("/api/v1/orders/").status_code == 200
    r = with_key(made["secret"]).post("/api/v1/nodes/", {"name": "n"}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "missing_scope"
    assert r.json()["error"]["details"] == {"scope": "provide"} and "'provide'" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, field", [
    ({"name": "ci"}, "scopes"), ({"name": "ci", "scopes": []}, "scopes"), ({"name": "ci", "scopes": ["admin"]}, "scopes"),
    ({"name": "ci", "scopes": "read"}, "scopes"), ({"scopes": ["read"]}, "name"), ({"name": "", "scopes": ["read"]}, "name"),
])
def test_a_key_needs_a_name_and_scopes_over_the_api_and_a_bad_request_makes_none(body, field):
    session = APIClient()
    session.force_login(UserFactory())
    r = session.post("/api/v1/api-keys/", body, format="json")
    assert r.status_code == 400 and field in r.json()["error"]["fields"], r.content
    assert not ApiKey.objects.exists()


def test_a_key_makes_keys_only_within_its_own_scopes_and_they_name_it():
    user = UserFactory()
    trader = key(user, "read", "trade")
    r = with_key(trader).post("/api/v1/api-keys/", {"name": "sub", "scopes": ["read"]}, format="json")
    assert r.status_code == 201 and r.json()["parent"] == str(api_key_resolve(secret=trader).pk)
    r = with_key(trader).post("/api/v1/api-keys/", {"name": "wider", "scopes": ["read", "provide"]}, format="json")
    assert r.status_code == 403 and r.json()["error"]["code"] == "missing_scope"
    assert r.json()["error"]["details"] == {"scope": "provide"}
    assert ApiKey.objects.filter(user=user).count() == 2


def test_revoking_a_key_revokes_the_keys_it_made_and_a_narrower_key_cannot_revoke_a_wider_one():
    user = UserFactory()
    root = key(user, "read", "trade", "provide")
    child = with_key(root).post("/api/v1/api-keys/", {"name": "c", "scopes": ["read", "trade"]}, format="json").json()
    grandchild = with_key(child["secret"]).post("/api/v1/api-keys/", {"name": "g", "scopes": ["read"]},
                                                format="json").json()
    narrow = key(user, "read")
    r = with_key(narrow).delete(f"/api/v1/api-keys/{child['id']}/")
    assert r.status_code == 403 and r.json()["error"]["details"] == {"scope": "trade"}
    assert with_key(child["secret"]).get("/api/v1/orders/").status_code == 200
    assert with_key(root).delete(f"/api/v1/api-keys/{child['id']}/").status_code == 204
    for revoked in (child["secret"], grandchild["secret"]):
        r = with_key(revoked).get("/api/v1/orders/")
        assert r.status_code == 401 and r.json()["error"]["code"] == "authentication_failed"
    assert with_key(root).get("/api/v1/orders/").status_code == 200
    listed = {k["id"]: k for k in with_key(root).get("/api/v1/api-keys/").json()["results"]}
    assert listed[child["id"]]["revoked_at"] and not listed[child["id"]]["active"]
    assert with_key(root).delete(f"/api/v1/api-keys/{child['id']}/").status_code == 204  # again: no change
    assert with_key(narrow).delete(f"/api/v1/api-keys/{api_key_resolve(secret=narrow).pk}/").status_code == 204
    assert with_key(narrow).get("/api/v1/orders/").status_code == 401  # it revoked itself


def test_someone_elses_key_is_a_404():
    theirs = api_key_create(user=UserFactory(), name="theirs", scopes=["read"])[0]
    mine = key(UserFactory(), "read", "trade", "provide")
    assert with_key(mine).get(f"/api/v1/api-keys/{theirs.pk}/").status_code == 404
    assert with_key(mine).delete(f"/api/v1/api-keys/{theirs.pk}/").status_code == 404
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None


@pytest.mark.parametrize("method, path, op", [o for o in operations() if o[0] != "GET"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_write_refuses_a_read_only_key_naming_the_scope_it_needs(method, path, op):
    read_only = with_key(key(UserFactory(), "read"))
    r = read_only.generic(method, path, "{}", content_type="application/json")
    if path.startswith("/api/v1/api-keys/"):
        # Checked against the key itself: a read key may make read keys and revoke itself.
        assert r.status_code in (201, 400, 404), r.content
        return
    if path == "/api/v1/tco/":
        # The TCO calculator is a POST for its body but changes nothing: `read` suffices (docs/api.md).
        assert r.status_code == 200, r.content
        return
    assert r.status_code == 403, (method, path, r.content)
    assert r.json()["error"]["code"] == "missing_scope" and r.json()["error"]["details"] == {
        "scope": scope_of_writes(path)}


@pytest.mark.parametrize("method, path, op", [o for o in operations() if o[0] == "GET"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_read_needs_the_read_scope_unless_it_is_public(method, path, op):
    no_read = with_key(key(UserFactory(), "trade", "provide"))
    r = no_read.get(path)
    if path.startswith(PUBLIC):
        assert r.status_code in (200, 404), r.content
        return
    assert r.status_code == 403 and r.json()["error"]["details"] == {"scope": "read"}, (path, r.content)


def test_a_session_is_not_limited_by_scopes():
    session = APIClient()
    session.force_login(ProviderFactory())
    assert session.post("/api/v1/nodes/", {"name": "n"}, format="json").status_code == 201
    assert session.post("/api/v1/projects/", {"name": "p"}, format="json").status_code == 201


def test_listing_keys_is_a_fixed_number_of_queries():
    user = UserFactory()
    secret = key(user, "read")
    for i in range(5):
        api_key_create(user=user, name=f"k{i}", scopes=["read"])
    with_key(secret).get("/api/v1/api-keys/")  # marks the key used (once a minute)
    with CaptureQueriesContext(connection) as q:
        r = with_key(secret).get("/api/v1/api-keys/")
    assert r.status_code == 200 and r.json()["count"] == 6
    assert len(q) <= 3, [x["sql"] for x in q]  # the key, the count, the page


def test_a_key_used_many_times_a_minute_writes_its_row_once():
    user = UserFactory()
    secret = key(user, "read")
    client = with_key(secret)
    client.get("/api/v1/orders/")
    first = ApiKey.objects.get(user=user).last_used_at
    with CaptureQueriesContext(connection) as q:
        for _ in range(3):
            client.get("/api/v1/orders/")
    assert not [x for x in q if x["sql"].startswith("UPDATE")] and ApiKey.objects.get(user=user).last_used_at == first


@pytest.mark.parametrize("provider", [False, True])
def test_the_consoles_key_form_checks_read_and_trade_and_provide_for_a_provider(client, provider):
    user = UserFactory()
    if provider:
        from tests.factories import node_with_token

        node_with_token(provider=user)
    client.force_login(user)
    html = client.get("/account/").content.decode()
    checked = set(re.findall(r'<input type="checkbox" name="scopes" value="(\w+)"[^>]*checked', html))
    assert checked == ({"read", "trade", "provide"} if provider else {"read", "trade"})


def test_the_consoles_key_list_shows_each_keys_scopes(client):
    user = UserFactory()
    api_key_create(user=user, name="reader", scopes=["read"])
    client.force_login(user)
    r = client.post("/account/keys/", {"name": "ops", "scopes": ["read", "provide"]})
    assert "It may: read, provide." in r.content.decode()
    rows = re.findall(r"<tr>\s*<td>(\w+)</td>.*?</tr>", r.content.decode(), re.S)
    assert rows == ["ops", "reader"]
    row = re.search(r"<td>reader</td>(.*?)</tr>", r.content.decode(), re.S).group(1)
    assert '<span class="pill">read</span>' in row and "trade" not in row
    assert ApiKey.objects.get(name="ops").scopes == ["read", "provide"]
