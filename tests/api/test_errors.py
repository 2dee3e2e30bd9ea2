"""Every /api/ response is JSON in the one error shape: unknown paths and a forgotten trailing slash with any method
(no HTML CSRF page), limits and offsets past 2^63, bodies that are JSON but not an object, exceptions nobody
expected (a logged 500, never Django's page); the console's own error pages never list the URL patterns."""
from __future__ import annotations

import logging

import pytest
from django.test import Client
from rest_framework.test import APIClient

from marketplace.products.apikeys import api_key_create
from scheduler.models import Gpu
from scheduler.services import nodes as node_services
from tests.agentframes import hello_from, sim_backend
from tests.factories import UserFactory, node_with_token

pytestmark = pytest.mark.django_db

HUGE = str(2**63 + 7)


def script() -> Client:
    """A script: no session, and Django's CSRF checks on (as in production; the test client turns them off)."""
    return Client(enforce_csrf_checks=True)


def key_for(user, scopes=("read", "trade", "provide")) -> dict:
    _, secret = api_key_create(user=user, name="t", scopes=scopes)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def assert_error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.content
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"], body
    return body["error"]


@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
@pytest.mark.parametrize("path", ["/api/v1/nope/", "/api/v2/orders/", "/api/", "/api"])
def test_any_method_on_a_path_the_api_does_not_have_is_a_json_404_not_a_csrf_page(method, path):
    body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
    r = getattr(script(), method)(path, **body)
    assert_error(r, 404, "not_found")


@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_a_forgotten_trailing_slash_is_a_json_404_that_names_the_path_meant(method):
    body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
    r = getattr(script(), method)("/api/v1/orders", **body)
    error = assert_error(r, 404, "not_found")
    assert error["details"] == {"did_you_mean": "/api/v1/orders/"} and "/api/v1/orders/" in error["message"]
    error = assert_error(script().post("/api/v1/leases/00000000-0000-0000-0000-000000000000/end"), 404, "not_found")
    assert error["details"]["did_you_mean"] == "/api/v1/leases/00000000-0000-0000-0000-000000000000/end/"


@pytest.mark.parametrize("path", ["/api/v1/resale-listings/", "/api/v1/spot-prices/", "/api/v1/orders/",
                                  "/api/v1/leases/", "/api/v1/ledger-entries/", "/api/v1/usage/", "/api/v1/nodes/",
                                  "/api/v1/api-keys/"])
def test_a_limit_or_offset_past_2_63_is_no_500(path):
    headers = key_for(UserFactory())
    r = script().get(path, {"limit": HUGE}, **headers)
    assert r.status_code == 200, r.content
    assert r.json()["next"] is None and len(r.json()["results"]) == r.json()["count"]
    r = script().get(path, {"offset": HUGE, "limit": "5"}, **headers)
    assert r.status_code == 200 and r.json()["results"] == []


def test_a_limit_is_cut_to_the_maximum_and_a_malformed_one_named():
    user = UserFactory()
    for i in range(3):
        node_with_token(provider=user, name=f"n{i}")
    r = script().get("/api/v1/nodes/", {"limit": HUGE}, **key_for(user))
    assert r.json()["count"] == 3 and len(r.json()["results"]) == 3
    for bad in ("abc", "0", "-1", "1.5"):
        error = assert_error(script().get("/api/v1/nodes/", {"limit": bad}, **key_for(user)), 400, "invalid")
        assert "limit" in error["fields"]
    error = assert_error(script().get("/api/v1/nodes/", {"offset": "-3"}, **key_for(user)), 400, "invalid")
    assert "offset" in error["fields"]


@pytest.mark.parametrize("body", ["[]", '["reason"]', "7", '"cordon"', "null", "true"])
def test_a_json_body_that_is_not_an_object_is_a_400_on_an_action_that_reads_it(body):
    user = UserFactory()
    node, token = node_with_token(provider=user)
    node_services.node_hello(node_id=node.pk, frame=hello_from(sim_backend("l4:1")))
    gpu = Gpu.objects.get(node=node)
    r = script().post(f"/api/v1/gpus/{gpu.uuid}/cordon/", data=body, content_type="application/json", **key_for(user))
    error = assert_error(r, 400, "parse_error")
    assert "JSON object" in error["message"]
    assert Gpu.objects.get(pk=gpu.pk).health == Gpu.Health.HEALTHY


def test_an_exception_nobody_expected_is_a_logged_json_500_without_a_traceback(monkeypatch, caplog):
    from scheduler import selectors

    def broken(**kw):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr(selectors, "node_list", broken)
    client = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR):
        r = client.get("/api/v1/nodes/", **key_for(UserFactory()))
    error = assert_error(r, 500, "server_error")
    assert "secret internals" not in r.content.decode() and "logged" in error["message"]
    assert any("the secret internals" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)


def test_an_exception_outside_drf_under_api_is_a_json_500_too(monkeypatch):
    from marketplace.api import errors

    def broken(request, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(errors, "_route_with_slash", broken)
    r = Client(raise_request_exception=False).get("/api/v1/missing")
    assert_error(r, 500, "server_error")


def test_the_consoles_404_is_its_own_page_and_lists_no_url_patterns():
    r = Client().get("/no/such/page/")
    html = r.content.decode()
    assert r.status_code == 404 and r["Content-Type"].startswith("text/html")
    assert "Not found" in html and "/no/such/page/" in html
    assert "URLconf" not in html and "api/v1/" not in html and "admin/" not in html


def test_the_consoles_500_is_a_plain_page(monkeypatch):
    from marketplace.views import fleet

    def broken(request):
        raise RuntimeError("the secret internals")

    monkeypatch.setattr(fleet, "redirect", broken)
    r = Client(raise_request_exception=False).get("/")
    html = r.content.decode()
    assert r.status_code == 500 and "Server error" in html and "secret internals" not in html
    assert "Traceback" not in html


def test_a_console_form_posted_without_its_csrf_token_gets_the_consoles_page():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    r = client.post("/account/projects/", {"project-name": "x"})
    assert r.status_code == 403 and "expired" in r.content.decode()


def test_a_session_write_to_the_api_without_its_csrf_token_is_a_json_403():
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    error = assert_error(client.post("/api/v1/projects/", {"name": "x"}, format="json"), 403, "permission_denied")
    assert "CSRF" in error["message"]


def test_a_csv_request_gets_its_error_as_json():
    r = APIClient().get("/api/v1/statements/", {"format": "csv", "month": "2026-13"}, **key_for(UserFactory()))
    error = assert_error(r, 400, "invalid")
    assert error["fields"] == {"month": ["month is YYYY-MM, e.g. 2026-11"]}


def test_a_browser_asking_the_api_for_html_gets_json():
    client = APIClient()
    client.force_login(UserFactory())
    for path in ("/api/v1/orders/", "/api/v1/nope/"):
        r = client.get(path, HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
        assert r["Content-Type"].startswith("application/json"), (path, r["Content-Type"])


def test_a_request_django_finds_suspicious_is_a_400_not_a_500(monkeypatch):
    from django.core.exceptions import SuspiciousOperation

    from scheduler import selectors

    def suspicious(**kw):
        raise SuspiciousOperation("a header Django refuses")

    monkeypatch.setattr(selectors, "node_list", suspicious)
    r = Client(raise_request_exception=False).get("/api/v1/nodes/", **key_for(UserFactory()))
    assert_error(r, 400, "bad_request")
