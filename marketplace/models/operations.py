"""Operations a team lead sets once and the beat carries out (docs/operations.md): idle reclaim policies (end
leases idle during set hours, with a notice first, and a log of what was reclaimed and saved) and autoscaling
rules (keep a project's workload group between a minimum and a maximum of leases, placing and ending them
through ordinary orders)."""
from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from .market import Lease, Mode, Order

# The modes a workload group's leases are ordered in (reserved windows and resale are not scaled).
GROUP_MODES = [(Mode.ON_DEMAND.value, Mode.ON_DEMAND.label), (Mode.SPOT.value, Mode.SPOT.label)]
PCT = [MinValueValidator(0), MaxValueValidator(100)]
DAY_MINUTES = [MinValueValidator(1), MaxValueValidator(1440)]


class ReclaimPolicy(models.Model):
    """"End leases idle below `idle_below_pct`% for `idle_minutes` minutes, between `hours_start` and `hours_end`
    (`timezone`)": the buyer's default (no project) or one project's. A lease found idle gets a notice and is
    ended `grace_minutes` later if it is still idle then."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="reclaim_policies", on_delete=models.CASCADE)
    project = models.ForeignKey("marketplace.Project", null=True, blank=True, related_name="reclaim_policies",
                                on_delete=models.CASCADE, help_text="empty: every lease of the buyer without a "
                                                                    "project policy of its own")
    enabled = models.BooleanField(default=True)
    idle_below_pct = models.PositiveSmallIntegerField(default=5, validators=PCT)
    idle_minutes = models.PositiveIntegerField(default=30, validators=DAY_MINUTES)
    hours_start = models.TimeField(help_text="local time the reclaim hours start (equal to the end: all day)")
    hours_end = models.TimeField(help_text="local time they end (before the start: past midnight)")
    timezone = models.CharField(max_length=64, default="UTC", help_text="IANA name, like Europe/Berlin")
    grace_minutes = models.PositiveIntegerField(default=10, validators=[MaxValueValidator(1440)],
                                                help_text="between the notice and the end")
    hold_jobs = models.BooleanField(default=True, help_text="queued job orders wait for the end of the hours")
    # Set by the beat while the hours run (their end), so the queue (products.orders) holds the jobs until then
    # without reading time zones; empty outside them, and for a policy of all day (its jobs are not held).
    holding_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user", "project"]
        verbose_name_plural = "reclaim policies"
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="reclaim_policy_one_per_project"),
            models.UniqueConstraint(fields=["user"], condition=Q(project__isnull=True),
                                    name="reclaim_policy_one_default_per_user"),
            models.CheckConstraint(condition=Q(idle_below_pct__lte=100), name="reclaim_policy_pct_range"),
            models.CheckConstraint(condition=Q(idle_minutes__gte=1), name="reclaim_policy_minutes_positive"),
        ]

    def __str__(self) -> str:
        return f"reclaim below {self.idle_below_pct}% for {self.idle_minutes} min ({self.project or 'all'})"


class ReclaimNotice(models.Model):
    """One idle lease found by a policy: noticed, then reclaimed (ended, with the money its remaining idle hours
    would have cost) or cancelled (busy again, or the hours over, or it ended otherwise)."""

    class State(models.TextChoices):
        PENDING = "pending", "notice given"
        RECLAIMED = "reclaimed", "reclaimed"
        CANCELLED = "cancelled", "cancelled"

    policy = models.ForeignKey(ReclaimPolicy, related_name="notices", on_delete=models.CASCADE)
    lease = models.ForeignKey(Lease, related_name="reclaim_notices", on_delete=models.CASCADE)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    noticed_at = models.DateTimeField()
    act_at = models.DateTimeField(help_text="when it is ended if still idle")
    acted_at = models.DateTimeField(null=True, blank=True)
    util_pct = models.FloatField(help_text="the highest utilisation of the idle window")
    saved = models.DecimalField(max_digits=18, decimal_places=6, default=Decimal("0"),
                                help_text="the remaining idle hours' cost at the lease's price, avoided")
    saved_until = models.DateTimeField(null=True, blank=True, help_text="the end of those hours")
    reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-noticed_at"]
        constraints = [
            # One open notice per lease: two beats finding the same idle lease give one notice.
            models.UniqueConstraint(fields=["lease"], condition=Q(state="pending"),
                                    name="reclaim_notice_one_pending_per_lease"),
            models.CheckConstraint(condition=Q(saved__gte=0), name="reclaim_notice_saved_nonnegative"),
        ]


class AutoscaleRule(models.Model):
    """A project's named workload group: what each lease runs (a template) on which unit (model, slice or whole
    GPU, regions, mode), kept between `min_leases` and `max_leases`: one more when the group's average
    utilisation stays above `scale_out_pct` for `scale_out_minutes` (or the queue it reports reaches
    `scale_out_queue`), one fewer when it stays below `scale_in_pct` for `scale_in_minutes`; cooldowns after any
    action."""

    project = models.ForeignKey("marketplace.Project", related_name="autoscale_rules", on_delete=models.CASCADE)
    name = models.SlugField(max_length=40)
    enabled = models.BooleanField(default=True)
    template = models.ForeignKey("marketplace.Template", null=True, blank=True, on_delete=models.PROTECT,
                                 help_text="what each lease runs (empty: the lease only holds its slice)")
    mode = models.CharField(max_length=10, choices=GROUP_MODES, default=Mode.ON_DEMAND)
    gpu_models = models.JSONField(default=list, blank=True)
    regions = models.JSONField(default=list, blank=True)
    memory_gb = models.FloatField(default=0, validators=[MinValueValidator(0), MaxValueValidator(1000)])
    compute_slices = models.PositiveSmallIntegerField(null=True, blank=True,
                                                      validators=[MinValueValidator(1), MaxValueValidator(8)])
    whole_gpu = models.BooleanField(default=False)
    max_price_per_hour = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True,
                                             help_text="a spot group's bid; a cap for on demand")
    min_leases = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(50)])
    max_leases = models.PositiveSmallIntegerField(default=4, validators=[MinValueValidator(1),
                                                                         MaxValueValidator(50)])
    scale_out_pct = models.PositiveSmallIntegerField(default=80, validators=PCT)
    scale_out_minutes = models.PositiveIntegerField(default=5, validators=DAY_MINUTES)
    scale_out_queue = models.PositiveIntegerField(null=True, blank=True,
                                                  help_text="scale out when the reported queue reaches this")
    scale_in_pct = models.PositiveSmallIntegerField(default=20, validators=PCT)
    scale_in_minutes = models.PositiveIntegerField(default=15, validators=DAY_MINUTES)
    scale_out_cooldown_seconds = models.PositiveIntegerField(default=300, validators=[MaxValueValidator(86400)])
    scale_in_cooldown_seconds = models.PositiveIntegerField(default=600, validators=[MaxValueValidator(86400)])
    queue_length = models.PositiveIntegerField(null=True, blank=True, help_text="the last length the workload "
                                                                               "reported")
    queue_reported_at = models.DateTimeField(null=True, blank=True)
    last_action_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="autoscale_rule_name_unique_per_project"),
            models.CheckConstraint(condition=Q(min_leases__lte=F("max_leases")), name="autoscale_min_le_max"),
            models.CheckConstraint(condition=Q(scale_in_pct__lt=F("scale_out_pct")),
                                   name="autoscale_in_below_out"),
        ]

    def __str__(self) -> str:
        return f"{self.project} / {self.name}"


class AutoscaleAction(models.Model):
    """What a rule did and why: a scale-out (its order), a scale-in (the lease it ended), or a scale-out the market
    refused (no capacity, no money: the reason)."""

    class Kind(models.TextChoices):
        SCALE_OUT = "scale_out", "scale out"
        SCALE_IN = "scale_in", "scale in"
        REFUSED = "refused", "scale out refused"

    rule = models.ForeignKey(AutoscaleRule, related_name="actions", on_delete=models.CASCADE)
    at = models.DateTimeField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    order = models.ForeignKey(Order, null=True, blank=True, related_name="autoscale_actions",
                              on_delete=models.SET_NULL)
    lease = models.ForeignKey(Lease, null=True, blank=True, related_name="autoscale_actions",
                              on_delete=models.SET_NULL)
    leases_before = models.PositiveSmallIntegerField()
    util_pct = models.FloatField(null=True, blank=True, help_text="the group's average over the window")
    reason = models.CharField(max_length=300)

    class Meta:
        ordering = ["-at", "-id"]
