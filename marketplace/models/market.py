"""The market: orders, the leases they become, reserved windows, spot bids and prices, resale, interruptions.

Money is not here: charges go through marketplace.money (the ledger), whose transactions point back at a
lease or order by plain UUID. Capacity invariants live in the database too: a lease holds one slice at
most once (one-to-one), windows end after they start, prices are never negative, and on PostgreSQL an
exclusion constraint (migration 0004) forbids two live reservations on overlapping memory slices of one
GPU in overlapping windows.
"""
import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class Mode(models.TextChoices):
    ON_DEMAND = "on_demand", "on demand"
    RESERVED = "reserved", "reserved"
    SPOT = "spot", "spot"
    RESALE = "resale", "resale purchase"


class Order(models.Model):
    """A buyer's request: constraints, mode, duration or window, cap or bid, priority."""

    class State(models.TextChoices):
        QUEUED = "queued", "waiting for capacity"
        PLACED = "placed", "placed"
        FAILED = "failed", "failed"
        CANCELLED = "cancelled", "cancelled"

    class IfUnavailable(models.TextChoices):
        QUEUE = "queue", "wait in the queue"
        FAIL = "fail", "refuse at once"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="orders", on_delete=models.PROTECT)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED, db_index=True)
    if_unavailable = models.CharField(max_length=5, choices=IfUnavailable.choices, default=IfUnavailable.FAIL)
    # Constraints, as scheduler.core.model.Request takes them.
    gpu_models = models.JSONField(default=list, blank=True, help_text="allowed catalog keys; empty = any")
    memory_gb = models.FloatField(default=0)
    compute_slices = models.PositiveSmallIntegerField(default=1)
    whole_gpu = models.BooleanField(default=False)
    gpu_count = models.PositiveSmallIntegerField(
        default=1, help_text="k whole GPUs on one node (on demand, spot); one lease per GPU")
    min_cuda = models.CharField(max_length=10, blank=True)
    min_compute_capability = models.CharField(max_length=8, blank=True)
    regions = models.JSONField(default=list, blank=True)
    buyer_region = models.CharField(max_length=40, blank=True)
    duration_seconds = models.PositiveIntegerField(null=True, blank=True, help_text="on demand / spot: ends then")
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    max_price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                             help_text="price cap; for spot, the bid")
    priority = models.SmallIntegerField(default=0)
    webhook_url = models.URLField(max_length=300, blank=True, help_text="interruption notices are POSTed here")
    project = models.ForeignKey("marketplace.Project", null=True, blank=True, related_name="orders",
                                on_delete=models.PROTECT, help_text="its charges and usage are grouped under it")
    listing = models.ForeignKey("ResaleListing", null=True, blank=True, related_name="orders",
                                on_delete=models.PROTECT)
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    total_price = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    reasons = models.JSONField(default=dict, blank=True, help_text="why it is waiting: GPUs refused per reason")
    explain = models.CharField(max_length=500, blank=True)
    preempt_until = models.DateTimeField(null=True, blank=True, help_text="waiting for spot leases to leave")
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    placed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "priority", "created_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(window_end__isnull=True) | Q(window_end__gt=F("window_start")),
                                   name="order_window_ends_after_start"),
            models.CheckConstraint(condition=Q(max_price_per_hour__isnull=True) | Q(max_price_per_hour__gte=0),
                                   name="order_price_cap_nonnegative"),
            models.CheckConstraint(condition=Q(duration_seconds__isnull=True) | Q(duration_seconds__gt=0),
                                   name="order_duration_positive"),
            models.CheckConstraint(condition=Q(gpu_count__gte=1) & Q(gpu_count__lte=8), name="order_gpu_count_1_to_8"),
        ]

    def __str__(self) -> str:
        return f"{self.get_mode_display()} order {str(self.pk)[:8]} ({self.state})"


class Reservation(models.Model):
    """A booked window on one GPU's memory slices [slot_start, slot_end) with a fixed profile and start
    (scheduler.core.slots.Slots: a GPU that is not split holds every slot, 0..64)."""

    class State(models.TextChoices):
        BOOKED = "booked", "booked"
        ACTIVE = "active", "running"
        DONE = "done", "over"
        SPLIT = "split", "split by a resale"
        REFUNDED = "refunded", "refunded (the platform could not deliver)"
        CANCELLED = "cancelled", "cancelled by its holder"

    LIVE_STATES = (State.BOOKED, State.ACTIVE)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    holder = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="reservations", on_delete=models.PROTECT)
    order = models.ForeignKey(Order, null=True, blank=True, related_name="reservations", on_delete=models.PROTECT)
    parent = models.ForeignKey("self", null=True, blank=True, related_name="pieces", on_delete=models.PROTECT)
    gpu = models.ForeignKey("scheduler.Gpu", related_name="reservations", on_delete=models.PROTECT)
    profile = models.CharField(max_length=30, blank=True, help_text="MIG profile; empty = the whole GPU")
    slot_start = models.PositiveSmallIntegerField()
    slot_end = models.PositiveSmallIntegerField()
    starts_at = models.DateTimeField(db_index=True)
    ends_at = models.DateTimeField(db_index=True)
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    price_total = models.DecimalField(max_digits=18, decimal_places=6, help_text="paid when booked (micro-dollars)")
    state = models.CharField(max_length=10, choices=State.choices, default=State.BOOKED, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="reservation_ends_after_start"),
            models.CheckConstraint(condition=Q(slot_end__gt=F("slot_start")), name="reservation_slots_nonempty"),
            models.CheckConstraint(condition=Q(price_total__gte=0), name="reservation_price_nonnegative"),
        ]

    def __str__(self) -> str:
        return f"reservation {str(self.pk)[:8]} {self.profile or 'whole'}@{self.slot_start} {self.starts_at:%Y-%m-%d %H:%M}"


class Lease(models.Model):
    """The running contract binding an order to one slice over time; metered unless prepaid (reserved)."""

    class State(models.TextChoices):
        PROVISIONING = "provisioning", "provisioning"
        RUNNING = "running", "running"
        INTERRUPTING = "interrupting", "interruption notice given"
        ENDING = "ending", "ending"
        ENDED = "ended", "ended"
        FAILED = "failed", "failed to provision"

    OPEN_STATES = (State.PROVISIONING, State.RUNNING, State.INTERRUPTING, State.ENDING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    order = models.ForeignKey(Order, null=True, blank=True, related_name="leases", on_delete=models.PROTECT)
    reservation = models.ForeignKey(Reservation, null=True, blank=True, related_name="leases",
                                    on_delete=models.PROTECT)
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="leases", on_delete=models.PROTECT)
    mode = models.CharField(max_length=10, choices=Mode.choices)
    # One slice serves one lease, ever: the database refuses a slice given twice.
    slice = models.OneToOneField("scheduler.Slice", related_name="lease", on_delete=models.PROTECT)
    state = models.CharField(max_length=12, choices=State.choices, default=State.PROVISIONING, db_index=True)
    price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, help_text="0 when prepaid")
    bid_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True, help_text="expected end (duration or window)")
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=40, blank=True)
    metered = models.BooleanField(default=True, help_text="billed per second while running")
    # Metering (metering.py): the exact cost of [start, accrued_until) is cost_accrued; the seconds after it
    # cost price_per_hour each, so nothing is written per tick. The ledger has charged cost_charged for
    # [start, billed_until), posted once a minute and at the end.
    accrued_until = models.DateTimeField(null=True, blank=True)
    billed_until = models.DateTimeField(null=True, blank=True)
    cost_accrued = models.DecimalField(max_digits=18, decimal_places=8, default=Decimal("0"))
    cost_charged = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"),
                                       help_text="what the ledger has charged (micro-dollars)")
    warned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(price_per_hour__gte=0), name="lease_price_nonnegative"),
            models.CheckConstraint(condition=Q(cost_charged__gte=0), name="lease_charged_nonnegative"),
        ]

    def __str__(self) -> str:
        return f"{self.get_mode_display()} lease {str(self.pk)[:8]} ({self.state})"


class SpotBid(models.Model):
    """A buyer's max price for interruptible capacity (the spot order's bid and how it fared)."""

    class State(models.TextChoices):
        OPEN = "open", "waiting"
        WON = "won", "running"
        OUTBID = "outbid", "interrupted"
        CLOSED = "closed", "closed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="spot_bids", on_delete=models.PROTECT)
    order = models.OneToOneField(Order, related_name="bid", on_delete=models.PROTECT)
    max_price_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    state = models.CharField(max_length=8, choices=State.choices, default=State.OPEN, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.CheckConstraint(condition=Q(max_price_per_hour__gt=0), name="spotbid_positive")]


class SpotPrice(models.Model):
    """One point of a model's spot price history: the factor on base and the pool's free share."""

    gpu_model = models.CharField(max_length=40, db_index=True)
    at = models.DateTimeField(db_index=True)
    factor = models.DecimalField(max_digits=6, decimal_places=4, help_text="share of the base price")
    free_share = models.FloatField()
    price_per_gpu_hour = models.DecimalField(max_digits=12, decimal_places=6,
                                             help_text="spot price of a whole GPU at the median base price")

    class Meta:
        ordering = ["gpu_model", "-at"]
        indexes = [models.Index(fields=["gpu_model", "-at"])]
        constraints = [models.CheckConstraint(condition=Q(factor__gte=Decimal("0.5")) & Q(factor__lte=Decimal("0.7")),
                                              name="spotprice_factor_in_band")]


class ResaleListing(models.Model):
    """A future window of a reservation offered by its holder, at an ask capped at RESALE_CAP (0.9) × base."""

    class State(models.TextChoices):
        OPEN = "open", "open"
        SOLD = "sold", "sold"
        CANCELLED = "cancelled", "withdrawn"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    reservation = models.ForeignKey(Reservation, related_name="listings", on_delete=models.PROTECT)
    seller = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="resale_listings", on_delete=models.PROTECT)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    ask_per_hour = models.DecimalField(max_digits=12, decimal_places=6)
    price_total = models.DecimalField(max_digits=18, decimal_places=6)
    # Denormalised for the public list's filters.
    gpu_model = models.CharField(max_length=40, db_index=True)
    profile = models.CharField(max_length=30, blank=True)
    region = models.CharField(max_length=40, db_index=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN, db_index=True)
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, related_name="resale_purchases",
                              on_delete=models.PROTECT)
    sold_reservation = models.OneToOneField(Reservation, null=True, blank=True, related_name="bought_from",
                                            on_delete=models.PROTECT)
    fee = models.DecimalField(max_digits=18, decimal_places=6, null=True, blank=True)
    sold_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="listing_ends_after_start"),
            models.CheckConstraint(condition=Q(ask_per_hour__gte=0), name="listing_ask_nonnegative"),
        ]


class LeaseFailureReport(models.Model):
    """A buyer saying its lease failed on the provider's side: one report per lease; it counts against the node's
    and GPU's reliability score (buyer_reports component)."""

    class Reason(models.TextChoices):
        WOULD_NOT_START = "would_not_start", "the workload would not start"
        GPU_ERROR = "gpu_error", "GPU errors (XID, ECC, CUDA errors)"
        SLOW = "slow", "far slower than the unit promises"
        UNREACHABLE = "unreachable", "the node could not be reached"
        CRASHED = "crashed", "the lease ended or crashed on its own"
        OTHER = "other", "something else"

    lease = models.OneToOneField(Lease, related_name="failure_report", on_delete=models.CASCADE)
    reason = models.CharField(max_length=20, choices=Reason.choices)
    note = models.CharField(max_length=500, blank=True)
    # Copied from the lease's slice so the score's gatherer reads reports per node and GPU without the joins.
    node_id = models.UUIDField(db_index=True)
    gpu_id = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"failure report on lease {str(self.lease_id)[:8]}: {self.get_reason_display()}"


class Interruption(models.Model):
    """A spot lease taken back: why, how much notice it got, and any credit for a short notice."""

    class Kind(models.TextChoices):
        PRICE = "price", "spot price passed the bid"
        PREEMPTED = "preempted", "a higher class needed the capacity"
        RESERVATION = "reservation", "a reservation starts on its slices"
        NODE_OFFLINE = "node_offline", "the node went offline"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    lease = models.OneToOneField(Lease, related_name="interruption", on_delete=models.PROTECT)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    announced_at = models.DateTimeField(db_index=True)
    deadline = models.DateTimeField()
    notice_seconds = models.FloatField()
    required_notice_seconds = models.FloatField()
    credited = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"))
    gpu_model = models.CharField(max_length=40, db_index=True)
    profile = models.CharField(max_length=30, blank=True)
    region = models.CharField(max_length=40)

    class Meta:
        ordering = ["-announced_at"]

    @property
    def short_notice(self) -> bool:
        return self.notice_seconds + 1e-6 < self.required_notice_seconds
