"""The Operations page in the browser: a team lead sets a night-time idle reclaim policy for a project and an
autoscaling rule for its inference group through the forms, and reads what reclaim saved and what the rules did.
The screenshot is docs/operations.md's picture (docs/screenshots/operations.png)."""
from __future__ import annotations

import shutil

import pytest

from tests.browser.conftest import PASSWORD, screenshot
from tests.e2e.livestack import ROOT

pytestmark = pytest.mark.browser

# A lead with a project, a lease reclaimed last night and a rule's log (the reclaim and the rules' own runs are the
# e2e test's: tests/e2e/test_operations_e2e.py); the lease is ended at once, leaving the pool as it was.
SEED = r"""
from datetime import timedelta
from decimal import Decimal
from django.contrib.auth import get_user_model
from django.utils import timezone
from marketplace.lifecycle.leases import lease_end
from marketplace.models import AutoscaleAction, Lease, Project, ReclaimNotice
from marketplace.money import movements
from marketplace.operations import autoscale, reclaim
from marketplace.products.orders import OrderSpec, order_place
lead = get_user_model().objects.create_user("ops-lead", password=%r)
movements.credit(user=lead, amount=Decimal("200"), idempotency_key="browser-ops-credit", memo="browser test credit")
project = Project.objects.create(user=lead, name="inference")
order = order_place(buyer=lead, spec=OrderSpec(mode="on_demand", gpu_models=["h100-80gb"], memory_gb=10))
lease = Lease.objects.get(order=order)
lease_end(lease_id=lease.pk, buyer=lead)
now = timezone.now().replace(microsecond=0)
policy = reclaim.reclaim_policy_save(user=lead, idle_below_pct=5, idle_minutes=30, hours_start=(now).time(),
                                     hours_end=(now).time(), enabled=False)
ReclaimNotice.objects.create(policy=policy, lease=lease, state="reclaimed", noticed_at=now - timedelta(minutes=40),
                             act_at=now - timedelta(minutes=30), acted_at=now - timedelta(minutes=30), util_pct=1.2,
                             saved=Decimal("5.236400"), saved_until=now + timedelta(hours=6),
                             reason="idle below 5%% (at most 1%%) for 30 min and after the notice")
rule = autoscale.autoscale_rule_save(user=lead, project_id=project.pk, name="vllm", template="vllm",
                                     gpu_models=["h100-80gb"], memory_gb=20, min_leases=0, max_leases=4,
                                     scale_out_pct=80, scale_out_minutes=5, scale_in_pct=20, scale_in_minutes=15)
for minutes, kind, before, util, why in [
        (50, "scale_out", 1, 86.0, "average utilisation 86%% above 80%% for 5 min"),
        (20, "scale_out", 2, 91.0, "the workload's queue is 14 (≥ 10)"),
        (5, "scale_in", 3, 11.0, "average utilisation 11%% below 20%% for 15 min")]:
    AutoscaleAction.objects.create(rule=rule, at=now - timedelta(minutes=minutes), kind=kind, leases_before=before,
                                   util_pct=util, reason=why)
print("OK")
"""


def test_a_lead_sets_a_night_reclaim_policy_and_an_autoscaling_rule_and_reads_their_logs(stack, new_page, request):
    stack.shell(SEED % PASSWORD)
    page = new_page(viewport=(1280, 1000))
    page.goto("/login/")
    page.get_by_label("Username").fill("ops-lead")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("navigation", name="main").get_by_role("link", name="Operations").click()
    page.wait_for_url("**/operations/")
    assert page.locator("#saved-total").inner_text() == "$5.24"

    # A night policy for the project, in Berlin time.
    form = page.locator("#policy-form")
    form.get_by_label("Applies to").select_option(label="inference")
    form.get_by_label("Idle below (%)").fill("10")
    form.get_by_label("For (minutes)").fill("20")
    form.get_by_label("Between").fill("22:00")
    form.get_by_label("And", exact=True).fill("06:30")
    form.get_by_label("Time zone").select_option("Europe/Berlin")
    form.get_by_role("button", name="Save policy").click()
    page.wait_for_url("**/operations/#reclaim")
    row = page.locator("#policy-list tr", has_text="inference")
    assert "22:00–06:30" in row.inner_text() and "Europe/Berlin" in row.inner_text()

    # A batch group's rule; a threshold pair without a gap is refused beside its field first.
    form = page.locator("#rule-form")
    form.get_by_label("Group name").fill("batch")
    form.get_by_label("GPU model").select_option("h100-80gb")
    form.get_by_label("Min leases").fill("0")
    form.get_by_label("Max leases").fill("2")
    form.get_by_label("Scale out above (%)").fill("60")
    form.get_by_label("Scale in below (%)").fill("70")
    form.get_by_role("button", name="Save rule").click()
    assert "a gap between them" in page.locator("#rule-form").inner_text()
    page.locator("#rule-form").get_by_label("Scale in below (%)").fill("15")
    page.locator("#rule-form").get_by_role("button", name="Save rule").click()
    page.wait_for_url("**/operations/#autoscaling")
    batch = page.locator("#rule-list tr", has_text="batch")
    assert "> 60% for 5 min" in batch.inner_text() and "of 0–2" in batch.inner_text()
    assert page.locator("#action-log tbody tr").count() == 3
    assert "queue is 14" in page.locator("#action-log").inner_text()
    page.locator("#autoscaling").scroll_into_view_if_needed()
    shot = screenshot(page, request)
    (ROOT / "docs" / "screenshots").mkdir(exist_ok=True)
    shutil.copy(shot, ROOT / "docs" / "screenshots" / "operations.png")
