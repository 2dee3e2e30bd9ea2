"""REST API of alerts: the user's alerts (filter by state and kind) and their alert rules (docs/operations.md
"Alerts"). Reads need the `read` scope, rule changes `trade`."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from marketplace.models import Alert, AlertKind, AlertRule
from marketplace.products import alerts

PARAMS_HELP = ("the kind's thresholds; missing ones take the defaults: "
               + "; ".join(f"{kind}: {params or 'none (the fleet health thresholds)'}"
                           for kind, params in alerts.RULE_DEFAULTS.items()))


class AlertSerializer(serializers.ModelSerializer):
    lease = serializers.UUIDField(source="lease_id", allow_null=True, read_only=True)
    project = serializers.IntegerField(source="project_id", allow_null=True, read_only=True)
    suggestion = serializers.JSONField(allow_null=True, read_only=True,
                                       help_text="what to do: a smaller or larger profile, its price per hour, text")

    class Meta:
        model = Alert
        fields = ["id", "kind", "subject_key", "state", "severity", "title", "detail", "suggestion", "lease",
                  "project", "fired_at", "resolved_at"]
        read_only_fields = fields


class AlertFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Alert.State.choices, required=False, help_text="firing or resolved")
    kind = serializers.ChoiceField(choices=AlertKind.choices, required=False)


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Your alerts, newest first; ?state=firing for the open ones (the console's bell)."""

    serializer_class = AlertSerializer
    queryset = Alert.objects.none()
    filter_serializer = AlertFilterSerializer

    def get_queryset(self):
        return Alert.objects.filter(user=self.request.user).order_by("-fired_at", "-id")


class AlertRuleSerializer(serializers.ModelSerializer):
    kind = serializers.ChoiceField(choices=alerts.RULE_KINDS)
    project = serializers.IntegerField(source="project_id", allow_null=True, required=False, min_value=1,
                                       help_text="one of your projects (null: the account or a lease)")
    lease = serializers.UUIDField(source="lease_id", allow_null=True, required=False,
                                  help_text="one of your leases (null: the account or a project)")
    params = serializers.DictField(required=False, help_text=PARAMS_HELP)

    class Meta:
        model = AlertRule
        fields = ["id", "kind", "project", "lease", "params", "enabled", "email", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]


class AlertRuleUpdateSerializer(serializers.Serializer):
    params = serializers.DictField(required=False, help_text=PARAMS_HELP)
    enabled = serializers.BooleanField(required=False)
    email = serializers.BooleanField(required=False)


class AlertRuleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your alert rules. One per kind for the account, each project and each lease: the narrowest applies; with
    none, the defaults. PATCH changes its parameters or switches it (or its e-mail) on or off."""

    serializer_class = AlertRuleSerializer
    queryset = AlertRule.objects.none()
    write_scope = "trade"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]  # PATCH changes a rule; no PUT
    error_statuses = {"create": (404, 409), "partial_update": (400,)}

    def get_queryset(self):
        return AlertRule.objects.filter(user=self.request.user).order_by("kind", "id")

    def create(self, request):
        data = AlertRuleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        rule = alerts.rule_create(user=request.user, kind=v["kind"], params=v.get("params"),
                                  project_id=v.get("project_id"), lease_id=v.get("lease_id"),
                                  enabled=v.get("enabled", True), email=v.get("email", True))
        return Response(AlertRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=AlertRuleUpdateSerializer, responses=AlertRuleSerializer)
    def partial_update(self, request, pk=None):
        rule = self.get_object()
        data = AlertRuleUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = alerts.rule_update(rule=rule, **data.validated_data)
        return Response(AlertRuleSerializer(rule).data)

    def destroy(self, request, pk=None):
        alerts.rule_delete(rule=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
