"""Alerts (docs/operations.md "Alerts"): the rules a user keeps (per account, project or lease) and the alerts they
raise. An alert is firing until its condition clears (resolved); one alert per user and subject is firing at a
time (the database refuses a second), which is the de-duplication: the beat re-checking a condition every minute
finds the firing alert instead of raising another."""
from django.conf import settings
from django.db import models
from django.db.models import Q


class AlertKind(models.TextChoices):
    UNDERUSED = "underused", "underused slice"
    OOM_RISK = "oom_risk", "memory nearly full (OOM risk)"
    GPU_HEALTH = "gpu_health", "GPU health"
    SPEND = "spend", "project spend against its budget"
    WALLET_RUNWAY = "wallet_runway", "wallet running out"
    OTHER = "other", "other"  # raised by another part of the market (budgets, idle reclaim) through alert_fire


class AlertRule(models.Model):
    """A user's setting for one kind of alert: on the whole account, or narrowed to one project or one lease (the
    narrowest enabled rule wins). `params` hold the kind's thresholds (products/alerts.py RULE_DEFAULTS)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="alert_rules", on_delete=models.CASCADE)
    kind = models.CharField(max_length=20, choices=[c for c in AlertKind.choices if c[0] != AlertKind.OTHER])
    project = models.ForeignKey("marketplace.Project", null=True, blank=True, related_name="alert_rules",
                                on_delete=models.CASCADE)
    lease = models.ForeignKey("marketplace.Lease", null=True, blank=True, related_name="alert_rules",
                              on_delete=models.CASCADE)
    params = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True, help_text="off: this kind raises no alert within the rule's reach")
    email = models.BooleanField(default=True, help_text="e-mail the account when an alert of this rule fires")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], condition=Q(project__isnull=True, lease__isnull=True),
                                    name="alertrule_one_per_account_kind"),
            models.UniqueConstraint(fields=["user", "kind", "project"], condition=Q(project__isnull=False),
                                    name="alertrule_one_per_project_kind"),
            models.UniqueConstraint(fields=["user", "kind", "lease"], condition=Q(lease__isnull=False),
                                    name="alertrule_one_per_lease_kind"),
            models.CheckConstraint(condition=Q(project__isnull=True) | Q(lease__isnull=True),
                                   name="alertrule_project_or_lease"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} rule of {self.user_id}"


class Alert(models.Model):
    class State(models.TextChoices):
        FIRING = "firing", "firing"
        RESOLVED = "resolved", "resolved"

    class Severity(models.TextChoices):
        INFO = "info", "info"
        WARNING = "warning", "warning"
        CRITICAL = "critical", "critical"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="alerts", on_delete=models.CASCADE)
    kind = models.CharField(max_length=20, choices=AlertKind.choices)
    # What the alert is about, e.g. "underused:lease:<id>" or "spend:project:7:2026-12:80": one firing alert each.
    subject_key = models.CharField(max_length=200)
    state = models.CharField(max_length=10, choices=State.choices, default=State.FIRING)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    title = models.CharField(max_length=200)
    detail = models.TextField(blank=True)
    # What to do about it, when there is something concrete (a smaller or larger profile and its price).
    suggestion = models.JSONField(null=True, blank=True)
    lease = models.ForeignKey("marketplace.Lease", null=True, blank=True, related_name="alerts",
                              on_delete=models.SET_NULL)
    project = models.ForeignKey("marketplace.Project", null=True, blank=True, related_name="alerts",
                                on_delete=models.SET_NULL)
    fired_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fired_at", "-id"]
        indexes = [models.Index(fields=["user", "state", "fired_at"], name="alert_user_state_time")]
        constraints = [
            models.UniqueConstraint(fields=["user", "subject_key"], condition=Q(state="firing"),
                                    name="alert_one_firing_per_subject"),
            models.CheckConstraint(condition=Q(state="firing", resolved_at__isnull=True)
                                   | Q(state="resolved", resolved_at__isnull=False),
                                   name="alert_resolved_has_time"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.state}: {self.title}"
