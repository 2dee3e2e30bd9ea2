"""REST API of operations (docs/operations.md): idle reclaim policies and their log of notices (what was reclaimed
and saved), autoscaling rules, the queue length a workload reports to its rule, and the rules' action log. Writes
need the `trade` scope (they place and end leases for you), reads `read`."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from marketplace.models.operations import GROUP_MODES
from marketplace.models import AutoscaleAction, AutoscaleRule, Mode, ReclaimNotice, ReclaimPolicy
from marketplace.operations import autoscale, reclaim
from marketplace.products.orders import ORDER_BOUNDS

TRADE = "trade"
CRUD_ERRORS = {"create": (404, 409), "update": (409,), "partial_update": (409,)}


@extend_schema_field({"type": "string", "pattern": r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$",
                      "example": "22:00"})
class LocalTimeField(serializers.TimeField):
    """A wall-clock time of day in the policy's own time zone ("22:00"): no offset, so not OpenAPI's "time"."""


class ReclaimPolicySerializer(serializers.ModelSerializer):
    """"End my leases idle below `idle_below_pct`% for `idle_minutes` minutes between `hours_start` and
    `hours_end` (`timezone`), `grace_minutes` after a notice; and while the hours run, hold my queued job orders
    (`hold_jobs`; `holding_until` says until when)." `project` empty: your default for every lease whose project
    has no policy of its own."""

    project = serializers.IntegerField(source="project_id", required=False, allow_null=True,
                                       help_text="one of your projects (empty: your default policy)")
    idle_below_pct = serializers.IntegerField(min_value=1, max_value=100)
    idle_minutes = serializers.IntegerField(min_value=1, max_value=1440)
    grace_minutes = serializers.IntegerField(min_value=0, max_value=1440, default=10)
    timezone = serializers.CharField(max_length=64, default="UTC", help_text="IANA name, like Europe/Berlin")
    hours_start = LocalTimeField(help_text="local time the reclaim hours start (equal to the end: all day)")
    hours_end = LocalTimeField(help_text="local time they end (before the start: past midnight)")

    class Meta:
        model = ReclaimPolicy
        fields = ["id", "project", "enabled", "idle_below_pct", "idle_minutes", "hours_start", "hours_end",
                  "timezone", "grace_minutes", "hold_jobs", "holding_until", "created_at"]
        read_only_fields = ["id", "holding_until", "created_at"]


class ReclaimNoticeSerializer(serializers.ModelSerializer):
    """One idle lease a policy found: noticed, then reclaimed (with the money saved: the rest of the idle hours
    at the lease's price) or cancelled (`reason`)."""

    class Meta:
        model = ReclaimNotice
        fields = ["id", "policy", "lease", "state", "noticed_at", "act_at", "acted_at", "util_pct", "saved",
                  "saved_until", "reason"]
        read_only_fields = fields


class _ServiceWrites(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Create, change (PUT, PATCH) and delete through the operations services: `_save(instance or None, data)` and
    `_delete(instance)`."""

    write_scope = TRADE
    error_statuses = CRUD_ERRORS

    def _save(self, instance, data: dict):
        raise NotImplementedError

    def _delete(self, instance) -> None:
        raise NotImplementedError

    def create(self, request):
        data = self.get_serializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(self.get_serializer(self._save(None, dict(data.validated_data))).data,
                        status=status.HTTP_201_CREATED)

    def update(self, request, pk=None, partial=False):
        instance = self.get_object()
        data = self.get_serializer(instance, data=request.data, partial=partial)
        data.is_valid(raise_exception=True)
        return Response(self.get_serializer(self._save(instance, dict(data.validated_data))).data)

    def partial_update(self, request, pk=None):
        return self.update(request, pk, partial=True)

    def destroy(self, request, pk=None):
        self._delete(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ReclaimPolicyViewSet(_ServiceWrites):
    """Your idle reclaim policies: one default and at most one per project."""

    serializer_class = ReclaimPolicySerializer
    queryset = ReclaimPolicy.objects.none()

    def get_queryset(self):
        return ReclaimPolicy.objects.filter(user=self.request.user).order_by("id")

    def _save(self, policy, data: dict):
        project_id = data.pop("project_id", None)  # a policy keeps its scope once made
        if policy is not None:
            return reclaim.reclaim_policy_save(user=self.request.user, policy_id=policy.pk, **data)
        return reclaim.reclaim_policy_save(user=self.request.user, project_id=project_id, **data)

    def _delete(self, policy) -> None:
        reclaim.reclaim_policy_delete(user=self.request.user, policy_id=policy.pk)


class ReclaimNoticeViewSet(viewsets.ReadOnlyModelViewSet):
    """What your reclaim policies noticed, reclaimed and saved, newest first."""

    serializer_class = ReclaimNoticeSerializer
    queryset = ReclaimNotice.objects.none()

    def get_queryset(self):
        return ReclaimNotice.objects.filter(policy__user=self.request.user).order_by("-noticed_at", "-id")


class AutoscaleRuleSerializer(serializers.ModelSerializer):
    """A project's workload group: each lease runs `template` on a unit matching the constraints (as an order's),
    kept between `min_leases` and `max_leases`; one more when the average utilisation stays above `scale_out_pct`
    for `scale_out_minutes` (or the reported queue reaches `scale_out_queue`), one fewer (the least loaded, the
    newest among equals) when it stays below `scale_in_pct` for `scale_in_minutes`; cooldowns after any action."""

    project = serializers.IntegerField(source="project_id", help_text="one of your projects")
    name = serializers.SlugField(max_length=40)
    template = serializers.SlugField(source="template_key", max_length=40, required=False, allow_blank=True,
                                     allow_null=True, help_text="a key of GET /api/v1/templates/ (empty: the lease "
                                                                "only holds its slice)")
    mode = serializers.ChoiceField(choices=GROUP_MODES, default=Mode.ON_DEMAND)
    gpu_models = serializers.ListField(child=serializers.SlugField(max_length=40), required=False,
                                       max_length=ORDER_BOUNDS["gpu_models"][1])
    regions = serializers.ListField(child=serializers.CharField(max_length=40), required=False,
                                    max_length=ORDER_BOUNDS["regions"][1])
    memory_gb = serializers.FloatField(min_value=0, max_value=1000, default=0)
    compute_slices = serializers.IntegerField(min_value=1, max_value=8, required=False, allow_null=True)
    max_price_per_hour = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, required=False,
                                                  allow_null=True)
    min_leases = serializers.IntegerField(min_value=0, max_value=50, default=1)
    max_leases = serializers.IntegerField(min_value=1, max_value=50, default=4)
    scale_out_pct = serializers.IntegerField(min_value=1, max_value=100, default=80)
    scale_out_minutes = serializers.IntegerField(min_value=1, max_value=1440, default=5)
    scale_out_queue = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    scale_in_pct = serializers.IntegerField(min_value=0, max_value=99, default=20)
    scale_in_minutes = serializers.IntegerField(min_value=1, max_value=1440, default=15)
    scale_out_cooldown_seconds = serializers.IntegerField(min_value=0, max_value=86400, default=300)
    scale_in_cooldown_seconds = serializers.IntegerField(min_value=0, max_value=86400, default=600)
    leases = serializers.SerializerMethodField(help_text="the group's open leases")

    class Meta:
        model = AutoscaleRule
        fields = ["id", "project", "name", "enabled", "template", "mode", "gpu_models", "regions", "memory_gb",
                  "compute_slices", "whole_gpu", "max_price_per_hour", "min_leases", "max_leases", "scale_out_pct",
                  "scale_out_minutes", "scale_out_queue", "scale_in_pct", "scale_in_minutes",
                  "scale_out_cooldown_seconds", "scale_in_cooldown_seconds", "queue_length", "queue_reported_at",
                  "last_action_at", "leases", "created_at"]
        read_only_fields = ["id", "queue_length", "queue_reported_at", "last_action_at", "created_at"]

    def to_representation(self, rule):
        data = super().to_representation(rule)
        data["template"] = rule.template.key if rule.template_id else None
        return data

    def get_leases(self, rule) -> list[str]:
        known = self.context.get("leases")
        return known.get(rule.pk, []) if known is not None else [str(x) for x in autoscale.group_leases(rule)
                                                                 .values_list("id", flat=True)]


def _rule_fields(validated: dict) -> dict:
    fields = dict(validated)
    fields.pop("project_id", None)
    if "template_key" in fields:
        fields["template"] = fields.pop("template_key")
    return fields


class QueueReportSerializer(serializers.Serializer):
    length = serializers.IntegerField(min_value=0, max_value=10 ** 9, help_text="jobs waiting in your workload's "
                                                                                "own queue now")


class AutoscaleActionSerializer(serializers.ModelSerializer):
    class Meta:
        model = AutoscaleAction
        fields = ["id", "rule", "at", "kind", "order", "lease", "leases_before", "util_pct", "reason"]
        read_only_fields = fields


class AutoscaleRuleViewSet(_ServiceWrites):
    """Your autoscaling rules. POST /autoscale-rules/{id}/queue/ {length} reports the workload's queue."""

    serializer_class = AutoscaleRuleSerializer
    queryset = AutoscaleRule.objects.none()

    def get_queryset(self):
        return AutoscaleRule.objects.filter(project__user=self.request.user).select_related("template").order_by("id")

    def get_serializer_context(self):
        return super().get_serializer_context() | {"leases": autoscale.group_lease_ids(user=self.request.user)}

    def _save(self, rule, data: dict):
        project_id = data.get("project_id")
        return autoscale.autoscale_rule_save(user=self.request.user, project_id=project_id,
                                             rule_id=rule.pk if rule is not None else None, **_rule_fields(data))

    def _delete(self, rule) -> None:
        autoscale.autoscale_rule_delete(user=self.request.user, rule_id=rule.pk)

    @extend_schema(request=QueueReportSerializer, responses=AutoscaleRuleSerializer)
    @action(detail=True, methods=["post"], serializer_class=QueueReportSerializer)
    def queue(self, request, pk=None):
        rule = self.get_object()
        data = QueueReportSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = autoscale.autoscale_queue_report(user=request.user, rule_id=rule.pk,
                                                length=data.validated_data["length"])
        return Response(AutoscaleRuleSerializer(rule).data)


class AutoscaleActionViewSet(viewsets.ReadOnlyModelViewSet):
    """What your rules did and why (refused scale-outs too), newest first."""

    serializer_class = AutoscaleActionSerializer
    queryset = AutoscaleAction.objects.none()

    def get_queryset(self):
        return AutoscaleAction.objects.filter(rule__project__user=self.request.user).order_by("-at", "-id")
