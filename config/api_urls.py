"""/api/v1/: the fleet and market resources, one router."""
from django.urls import path
from rest_framework.routers import DefaultRouter

from marketplace.api.alerts import AlertRuleViewSet, AlertViewSet
from marketplace.api.apikeys import ApiKeyViewSet
from marketplace.api.catalog import OfferList
from marketplace.api.market import (BidViewSet, LeaseViewSet, OrderViewSet, ReservationViewSet,
                                    ResaleListingViewSet, SpotPriceViewSet)

from marketplace.api.operations import (AutoscaleActionViewSet, AutoscaleRuleViewSet, ReclaimNoticeViewSet,
                                        ReclaimPolicyViewSet)
from marketplace.api.tco import TcoView
from marketplace.api.workloads import SshKeyViewSet, TemplateViewSet
from marketplace.api.money import (AutoTopUpViewSet, LedgerEntryViewSet, PaymentViewSet, ProjectViewSet, StatementViewSet, TopUpViewSet,
                                   UsageRecordViewSet, WalletViewSet)
from marketplace.api.payouts import EarningsViewSet, PayoutViewSet
from scheduler.api import GpuViewSet, NodeViewSet, SliceViewSet

router = DefaultRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("slices", SliceViewSet, basename="slice")
router.register("wallet", WalletViewSet, basename="wallet")
router.register("ledger-entries", LedgerEntryViewSet, basename="ledger-entry")
router.register("topups", TopUpViewSet, basename="topup")
router.register("payments", PaymentViewSet, basename="payment")
router.register("auto-topup", AutoTopUpViewSet, basename="auto-topup")
router.register("projects", ProjectViewSet, basename="project")
router.register("usage", UsageRecordViewSet, basename="usage")
router.register("statements", StatementViewSet, basename="statement")
router.register("earnings", EarningsViewSet, basename="earnings")
router.register("payouts", PayoutViewSet, basename="payout")

router.register("spot-prices", SpotPriceViewSet, basename="spot-price")
router.register("orders", OrderViewSet, basename="order")
router.register("leases", LeaseViewSet, basename="lease")
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("resale-listings", ResaleListingViewSet, basename="resale-listing")
router.register("bids", BidViewSet, basename="bid")
router.register("templates", TemplateViewSet, basename="template")
router.register("ssh-keys", SshKeyViewSet, basename="ssh-key")
router.register("api-keys", ApiKeyViewSet, basename="api-key")
router.register("alerts", AlertViewSet, basename="alert")
router.register("alert-rules", AlertRuleViewSet, basename="alert-rule")
router.register("reclaim-policies", ReclaimPolicyViewSet, basename="reclaim-policy")
router.register("reclaim-notices", ReclaimNoticeViewSet, basename="reclaim-notice")
router.register("autoscale-rules", AutoscaleRuleViewSet, basename="autoscale-rule")
router.register("autoscale-actions", AutoscaleActionViewSet, basename="autoscale-action")

urlpatterns = router.urls
urlpatterns += [path("offers/", OfferList.as_view(), name="offer-list"), path("tco/", TcoView.as_view(), name="tco")]
