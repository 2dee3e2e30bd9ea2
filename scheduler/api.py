"""REST API of the fleet: nodes (register, token shown once), GPUs (cordon/uncordon), slices."""
from __future__ import annotations

import shlex

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from scheduler import selectors
from scheduler.models import Gpu, Node, Slice
from scheduler.services import health as health_services, nodes as node_services, slices as slice_services
from scheduler.services.nodes import NODE_SETTINGS_BOUNDS


class NodeSerializer(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)
    cordoned_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "region", "status", "hostname", "driver_version", "cuda_version", "agent_version",
                  "backend", "runtime", "price_per_gpu_hour", "reliability", "last_heartbeat", "token_prefix",
                  "gpu_count", "cordoned_count", "public_address", "port_range_start", "port_range_end",
                  "cpus_per_gpu", "ram_gb_per_gpu", "image_allowlist", "created_at"]
        read_only_fields = fields


class NodeSettingsSerializer(serializers.Serializer):
    """A provider's terms for buyers' containers on a node (PATCH /nodes/{id}/); every field optional."""

    public_address = serializers.CharField(max_length=255, required=False, allow_blank=True,
                                           help_text="where buyers reach published ports (empty: the hostname)")
    port_range_start = serializers.IntegerField(min_value=1024, max_value=65535, required=False)
    port_range_end = serializers.IntegerField(min_value=1024, max_value=65535, required=False)
    cpus_per_gpu = serializers.DecimalField(max_digits=6, decimal_places=2, required=False,
                                            min_value=NODE_SETTINGS_BOUNDS["cpus_per_gpu"][0],
                                            max_value=NODE_SETTINGS_BOUNDS["cpus_per_gpu"][1])
    ram_gb_per_gpu = serializers.DecimalField(max_digits=8, decimal_places=2, required=False,
                                              min_value=NODE_SETTINGS_BOUNDS["ram_gb_per_gpu"][0],
                                              max_value=NODE_SETTINGS_BOUNDS["ram_gb_per_gpu"][1])
    image_allowlist = serializers.ListField(child=serializers.CharField(max_length=300), required=False,
                                            max_length=NODE_SETTINGS_BOUNDS["image_allowlist"],
                                            help_text="image reference prefixes buyers may run (empty: any)")


class NodeRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    region = serializers.CharField(max_length=40, required=False, default="eu-west")
    price_per_gpu_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0, max_value=1000,
                                                  required=False)


class LatestSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    util = serializers.FloatField()
    mem_used_mib = serializers.FloatField()
    mem_total_mib = serializers.FloatField()
    temp_c = serializers.FloatField()
    power_w = serializers.FloatField()
    sm_clock_mhz = serializers.FloatField(allow_null=True)
    ecc_sbe = serializers.IntegerField(allow_null=True)
    ecc_dbe = serializers.IntegerField(allow_null=True)


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.UUIDField(source="node_id", read_only=True)
    model = serializers.CharField(source="gpu_model.key", default=None, read_only=True)
    latest = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["uuid", "node", "index", "name", "model", "memory_mib", "mig_enabled", "mig_geometry", "health",
                  "health_reason", "cordoned_by", "latest"]
        read_only_fields = fields

    def get_latest(self, gpu: Gpu) -> dict | None:
        latest = getattr(gpu, "latest", None)
        return LatestSerializer(latest).data if latest else None


class SliceSerializer(serializers.ModelSerializer):
    gpu = serializers.CharField(source="gpu.uuid", read_only=True)
    node = serializers.UUIDField(source="gpu.node_id", read_only=True)
    cuda_visible_devices = serializers.CharField(read_only=True)

    class Meta:
        model = Slice
        fields = ["id", "gpu", "node", "profile", "start", "size", "state", "instance_uuid", "cuda_visible_devices",
                  "error", "created_at", "ready_at", "ended_at"]
        read_only_fields = fields


class SliceCreateSerializer(serializers.Serializer):
    gpu = serializers.CharField(max_length=80, help_text="GPU uuid")
    profile = serializers.CharField(max_length=30, required=False, allow_blank=True,
                                    help_text="MIG profile; omit for the whole GPU")
    start = serializers.IntegerField(min_value=0, max_value=15, required=False)


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A provider's nodes. POST registers one and returns its agent token once; PATCH sets its terms for
    buyers' containers (public address, host port range, CPUs and RAM per GPU, allowed images)."""

    serializer_class = NodeSerializer

    def get_queryset(self):
        qs = selectors.node_list(user=self.request.user)
        for field in ("status", "region"):
            if self.request.query_params.get(field):
                qs = qs.filter(**{field: self.request.query_params[field]})
        return qs

    def create(self, request):
        data = NodeRegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node, token = node_services.node_register(provider=request.user, **data.validated_data)
        body = NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data
        body["token"] = token
        body["agent_command"] = agent_command_line(request, token)
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=NodeSettingsSerializer, responses=NodeSerializer)
    def partial_update(self, request, pk=None):
        node = self.get_object()
        data = NodeSettingsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            node_services.node_settings_update(node=node, **data.validated_data)
        return Response(NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data)

    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        node = node_services.node_drain(node=self.get_object())
        return Response(NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data)

    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None):
        token = node_services.node_rotate_token(node=self.get_object())
        return Response({"token": token, "agent_command": agent_command_line(request, token)})


def agent_command_line(request, token: str) -> str:
    """The command that starts this node's agent, token in its environment (a command line is visible to every
    user of the server); wss:// when the request came over TLS (behind a proxy: DJANGO_SECURE_PROXY_SSL_HEADER)."""
    scheme = "wss" if request.is_secure() else "ws"
    return (f"NODEAGENT_TOKEN={shlex.quote(token)} python -m nodeagent "
            f"--server {scheme}://{request.get_host()}/ws/agent/")


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GpuSerializer
    lookup_field = "uuid"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        qs = selectors.gpu_list(user=self.request.user)
        for param, field in (("node", "node_id"), ("health", "health"), ("model", "gpu_model__key")):
            if self.request.query_params.get(param):
                qs = qs.filter(**{field: self.request.query_params[param]})
        return qs

    @action(detail=True, methods=["post"])
    def cordon(self, request, uuid=None):
        gpu = self.get_object()
        default = "cordoned by an operator" if request.user.is_staff else "cordoned by its provider"
        reason = str(request.data.get("reason") or default)[:150]
        health_services.gpu_cordon(gpu_id=gpu.pk, reason=reason, by=request.user.get_username(),
                                   source=health_services.cordon_source_of(request.user))
        return Response(GpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)

    @action(detail=True, methods=["post"])
    def uncordon(self, request, uuid=None):
        gpu = self.get_object()
        # A provider lifting an operator's cordon gets 403 (cordoned_by_operator) in the one error shape.
        health_services.gpu_uncordon(gpu_id=gpu.pk, by=request.user.get_username(),
                                     source=health_services.cordon_source_of(request.user))
        return Response(GpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)


class SliceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    """Slices on the caller's GPUs. POST carves one by hand (diagnostics; orders carve their own)."""

    serializer_class = SliceSerializer

    def get_queryset(self):
        qs = selectors.slice_list(user=self.request.user)
        if self.request.query_params.get("state"):
            qs = qs.filter(state=self.request.query_params["state"])
        return qs

    def create(self, request):
        data = SliceCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        gpu = selectors.gpu_list(user=request.user).filter(uuid=data.validated_data["gpu"]).first()
        if gpu is None:
            from scheduler.errors import NotFound

            raise NotFound("no such GPU among yours", field="gpu")
        sl = slice_services.slice_create(gpu_id=gpu.pk, profile=data.validated_data.get("profile") or None,
                                         start=data.validated_data.get("start"))
        return Response(SliceSerializer(self.get_queryset().get(pk=sl.pk)).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        sl = slice_services.slice_destroy(slice_id=self.get_object().pk, by_provider=True)
        return Response(SliceSerializer(sl).data, status=status.HTTP_202_ACCEPTED)
