"""The TCO calculator and the reliability score in the browser: a buyer compares the seed's plan (8 GPUs × 30 days)
and sees the bars and cost lines; an XID recorded for a GPU shows up in the node's reliability formula on its
provider's page; a buyer reports a failed lease from its page. Screenshots for docs/operations.md."""
from __future__ import annotations

import shutil

import pytest

from tests.browser.conftest import ROOT, login, screenshot, wait_until
from tests.e2e.livestack import call_api

pytestmark = pytest.mark.browser

DOCS = ROOT / "docs" / "screenshots"
SEED_PLAN = {"GPUs": "8", "Hours a day": "24", "Days": "30", "Hardware price per GPU ($)": "6000",
             "Depreciation (months)": "1", "Power per GPU (W)": "0", "Hosting per GPU-month ($)": "0",
             "On demand ($/GPU-h)": "5.555556", "Reserved ($/GPU-h)": "4.861111"}

# What the agent gateway records when a metrics sample carries an XID (tests/scheduler/test_gateway.py drives that
# path with a real frame); the score is recomputed when it commits.
RECORD_XID = r"""
from scheduler.models import Gpu, Node
from scheduler.services.health import health_event_record
node = Node.objects.get(name="market-h100")
gpu = Gpu.objects.filter(node=node).order_by("-index").first()
health_event_record(node_id=node.pk, gpu_uuid=gpu.uuid, kind="xid", message="XID %d", detail={"codes": [%d]})
print("NODE" + '"%%s"' %% node.pk)
"""


def test_a_buyer_compares_buying_renting_and_reserving_the_seeds_plan(stack, new_page, request):
    page = new_page()
    login(page, "buyer-ann")
    page.get_by_role("link", name="TCO").first.click()
    page.locator("#tco-chart").wait_for()
    assert page.locator("#tco-chart .tco-row").count() == 5  # the defaults are priced before anything is typed
    page.get_by_label("GPU model").select_option("h100-80gb")
    for label, value in SEED_PLAN.items():
        page.get_by_label(label, exact=True).fill(value)
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url("**/tco/?*")
    totals = {row.get_attribute("data-option"): row.locator(".tco-total").inner_text()
              for row in page.locator("#tco-chart .tco-row").all()}
    assert totals["buy"].startswith("$48,000.00") and totals["on_demand"].startswith("$32,000.00")
    assert totals["reserved"].startswith("$28,000.00")
    assert page.get_by_label("Hardware price per GPU ($)").input_value() == "6000"  # kept what was typed
    # Bad input is said beside its field.
    page.get_by_label("GPUs", exact=True).fill("0")
    page.get_by_role("button", name="Compare").click()
    page.locator("#id_gpus_error").wait_for()
    page.get_by_label("GPUs", exact=True).fill("8")
    page.get_by_role("button", name="Compare").click()
    page.locator("#tco-chart").wait_for()
    shot = screenshot(page, request)
    DOCS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, DOCS / "tco.png")


def test_an_xid_shows_in_the_nodes_reliability_formula_and_a_buyer_reports_a_failed_lease(
        stack, new_page, request):
    # XID 45 does not cordon the GPU (other tests keep using it) but does cost the health component.
    node_id = stack.shell(RECORD_XID % (45, 45), "NODE")
    page = new_page()
    login(page, "e2e-provider", "e2e-password")

    def scored() -> bool:
        page.goto(f"/nodes/{node_id}/")
        return "xid:45" in page.locator("#reliability").inner_text()

    wait_until(scored, timeout=60, what="the XID to reach the node's reliability score")
    health = page.locator('#reliability-components tr[data-component="health"]')
    assert float(health.locator("td").nth(1).inner_text()) < 1.0
    assert "(health)" in page.locator("#reliability-formula").inner_text()
    shot = screenshot(page, request, "-node")
    DOCS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, DOCS / "reliability.png")

    (gus,) = stack.add_buyers(["rel-gus"], credit="50")
    order = call_api(stack.url, "POST", "/api/v1/orders/", {"mode": "on_demand", "gpu_models": ["h100-80gb"],
                                                            "memory_gb": 10}, key=gus["api_key"])[1]
    lease_id = order["leases"][0]
    wait_until(lambda: call_api(stack.url, "GET", f"/api/v1/leases/{lease_id}/", key=gus["api_key"])[1]["state"]
               == "running", timeout=60, what="the lease to run")
    buyer = new_page()
    login(buyer, "rel-gus", "e2e-password")
    buyer.goto(f"/leases/{lease_id}/")
    buyer.get_by_text("Report a failure").click()
    buyer.get_by_label("What went wrong").select_option("gpu_error")
    buyer.get_by_label("Details (optional)").fill("CUDA error: an illegal memory access was encountered")
    buyer.get_by_role("button", name="Report the failure").click()
    buyer.locator("#failure-reported").wait_for()
    assert "illegal memory access" in buyer.locator("#failure-reported").inner_text()
    screenshot(buyer, request, "-report")
    call_api(stack.url, "POST", f"/api/v1/leases/{lease_id}/end/", key=gus["api_key"])
