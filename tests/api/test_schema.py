"""The OpenAPI schema as a contract, without a server: it generates without a warning and validates, every
operation declares the errors it can give in the one Error shape, every default it states is valid, and every
request body example in docs/api.md is valid against it (so the docs cannot drift)."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import jsonschema
import pytest
from drf_spectacular.generators import SchemaGenerator

from tests.conftest import ROOT

DOCS = ROOT / "docs" / "api.md"


@pytest.fixture(scope="module")
def schema() -> dict:
    # The JSON the server sends (UUIDs, decimals and lazy strings as text).
    return json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True), default=str))


def operations(schema: dict):
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield method.upper(), path, op


def test_the_schema_generates_without_a_warning_and_validates(tmp_path):
    out = subprocess.run([sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file",
                          str(tmp_path / "schema.yaml")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]


def test_every_operation_declares_its_errors_in_the_one_shape(schema):
    assert set(schema["components"]["schemas"]["Error"]["properties"]) == {"error"}
    count = 0
    for method, path, op in operations(schema):
        count += 1
        responses = op["responses"]
        must = {"401", "429", "503"} | ({"400", "415"} if method != "GET" else set())
        if "{" in path:
            must.add("404")
        if {} not in op.get("security", []):
            must.add("403")
        assert must <= set(responses), (method, path, sorted(responses))
        for status, response in responses.items():
            if status >= "400":
                assert response["content"] == {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Error"}}}, (method, path, status)
        successes = [s for s in responses if s < "300"]
        assert len(successes) >= 1, (method, path)
        assert op["security"][0] in ({"apiKey": []}, {"cookieAuth": []}), (method, path)
    assert count >= 60


def test_what_each_operation_answers_on_success_is_declared(schema):
    ops = {op["operationId"]: op for _, _, op in operations(schema)}
    assert set(ops["orders_create"]["responses"]) >= {"201", "202", "402", "409"}
    assert "202" in ops["slices_destroy"]["responses"] and "204" not in ops["slices_destroy"]["responses"]
    assert set(ops["nodes_destroy"]["responses"]) >= {"204", "409"}
    assert set(ops["topups_create"]["responses"]) >= {"201", "409", "502"}
    assert ops["nodes_rotate_token_create"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Token"}
    assert set(ops["statements_retrieve"]["responses"]["200"]["content"]) == {"application/json", "text/csv"}
    assert set(ops["leases_logs_retrieve"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "secret" in schema["components"]["schemas"]["ApiKeyWithSecret"]["properties"]
    assert "secret" not in schema["components"]["schemas"]["ApiKey"]["properties"]
    # Writable fields only in request bodies: a generated client cannot send what the server would ignore.
    assert "id" not in schema["components"]["schemas"]["ProjectRequest"]["properties"]


def test_every_write_that_reads_a_body_declares_it(schema):
    no_body = {"orders_cancel_create", "bids_cancel_create", "leases_end_create", "nodes_drain_create", "nodes_undrain_create",
               "nodes_rotate_token_create", "gpus_uncordon_create", "resale_listings_buy_create",
               "resale_listings_withdraw_create", "nodes_destroy", "slices_destroy", "ssh_keys_destroy",
               "projects_destroy", "api_keys_destroy", "payouts_cancel_create",
               "reservations_cancel_create", "auto_topup_card_setup"}
    for method, path, op in operations(schema):
        if method in ("POST", "PUT", "PATCH") and op["operationId"] not in no_body:
            assert list(op.get("requestBody", {}).get("content", {})) == ["application/json"], (method, path)


def _json_schema(node, *, strict: bool):
    """OpenAPI 3.0 → JSON Schema: `nullable` as a null type; with `strict`, objects refuse unknown properties (a
    misspelt field in an example fails)."""
    if isinstance(node, list):
        return [_json_schema(n, strict=strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v, strict=strict) for k, v in node.items() if k not in ("nullable", "readOnly",
                                                                                   "writeOnly", "example")}
    if node.get("nullable"):
        out = {"type": [out["type"], "null"], **{k: v for k, v in out.items() if k != "type"}} if "type" in out \
            else {"anyOf": [out, {"type": "null"}]}
    if strict and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _validator(schema: dict, ref: str, *, strict: bool = True):
    root = {"$ref": ref, "components": _json_schema(schema["components"], strict=strict)}
    return jsonschema.Draft7Validator(root, format_checker=jsonschema.FormatChecker())


def test_every_default_the_schema_states_is_valid_under_its_own_schema(schema):
    bad = []

    def walk(node, where):
        if isinstance(node, dict):
            if "default" in node and "type" in node:
                check = copy.deepcopy(_json_schema(node, strict=False))
                check.pop("default")
                if not jsonschema.Draft7Validator(check, format_checker=jsonschema.FormatChecker()).is_valid(
                        node["default"]):
                    bad.append((where, node["default"]))
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(schema, "")
    assert bad == []  # a generated client sends defaults: each must be something the server takes


def doc_examples() -> list[tuple[str, dict]]:
    """(operation id, body) of each example in docs/api.md marked `<!-- body: operation_id -->`."""
    text = DOCS.read_text()
    found = []
    for match in re.finditer(r"((?:<!-- body: \w+ -->\n)+)```json\n(.*?)\n```", text, re.S):
        for operation_id in re.findall(r"<!-- body: (\w+) -->", match.group(1)):
            found.append((operation_id, json.loads(match.group(2))))
    return found


def test_the_docs_give_one_valid_example_of_each_request_body(schema):
    bodies = {op["operationId"]: op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
              for _, _, op in operations(schema) if "requestBody" in op}
    examples = dict(doc_examples())
    assert sorted(examples) == sorted(bodies), "docs/api.md: one example per request body"
    for operation_id, body in examples.items():
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in _validator(schema, bodies[operation_id]).iter_errors(body)]
        assert errors == [], (operation_id, errors)


def test_the_docs_check_would_catch_a_misspelt_or_mistyped_field(schema):
    ref = "#/components/schemas/OrderCreateRequest"
    assert not _validator(schema, ref).is_valid({"mode": "on_demand", "memory_gigs": 20})
    assert not _validator(schema, ref).is_valid({"mode": "sometimes"})
    assert not _validator(schema, ref).is_valid({"mode": "on_demand", "workload": {"ports": [{"port": "ssh"}]}})
    assert _validator(schema, ref).is_valid({"mode": "on_demand", "window_start": None})


def test_the_schema_is_generated_one_request_at_a_time(monkeypatch):
    """drf-spectacular's generator is not thread-safe and ASGI runs each request in a thread of its own: clients
    fetching the schema at the same moment got a 500. The view lets one generation run at a time."""
    import threading
    import time

    from django.test import RequestFactory

    from marketplace.api.schema_view import SchemaView

    running, most = [0], [0]
    guard = threading.Lock()
    generate = SchemaGenerator.get_schema

    def slow_get_schema(self, *args, **kwargs):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)  # long enough for the other threads to arrive
        try:
            return generate(self, *args, **kwargs)
        finally:
            with guard:
                running[0] -= 1

    monkeypatch.setattr(SchemaGenerator, "get_schema", slow_get_schema)
    statuses = []
    view = SchemaView.as_view()

    def fetch():
        response = view(RequestFactory().get("/api/schema/", {"format": "json"}))
        statuses.append(response.render().status_code)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert statuses == [200] * 4
    assert most[0] == 1
