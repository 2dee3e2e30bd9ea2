"""REST API of the fleet: nodes (register with the token shown once, rename and set terms, drain, rotate the token,
delete), GPUs (cordon/uncordon), slices. Writes need an API key's `provide` scope (marketplace/api/scopes.py)."""
from __future__ import annotations

import shlex

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from scheduler import selectors
from scheduler.errors import NotFound
from scheduler.models import Gpu, Node, Slice
from scheduler.services import health as health_services, nodes as node_services, slices as slice_services
from scheduler.services.nodes import MAX_NAME, NODE_SETTINGS_BOUNDS

FLEET_SCOPE = "provide"


class ReliabilityComponentSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="uptime, provisioning, health, interruptions or buyer_reports")
    value = serializers.FloatField(help_text="0..1; 1: nothing went wrong")
    weight = serializers.FloatField(help_text="its share of the score (the weights sum to 1)")
    contribution = serializers.FloatField(help_text="value × weight")
    events = serializers.DictField(help_text="the recorded events behind the value (counts, seconds)")


class ReliabilityDetailSerializer(serializers.Serializer):
    """The reliability score taken apart (docs/operations.md "Reliability score"); empty until first scored."""

    score = serializers.FloatField(required=False)
    formula = serializers.CharField(required=False)
    components = ReliabilityComponentSerializer(many=True, required=False)


class NodeSerializer(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)
    cordoned_count = serializers.IntegerField(read_only=True)
    image_allowlist = serializers.ListField(child=serializers.CharField(), read_only=True,
                                            help_text="image reference prefixes buyers may run here (empty: any)")
    drained_by = serializers.ChoiceField(choices=["provider", "operator"], allow_blank=True, read_only=True,
                                         help_text="who drained it; empty while it takes work")
    reliability_detail = ReliabilityDetailSerializer(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "region", "status", "hostname", "driver_version", "cuda_version", "agent_version",
                  "backend", "runtime", "price_per_gpu_hour", "reliability", "last_heartbeat", "token_prefix",
                  "gpu_count", "cordoned_count", "public_address", "port_range_start", "port_range_end",
                  "cpus_per_gpu", "ram_gb_per_gpu", "image_allowlist", "drained_by", "created_at",
                  "reliability_detail", "reliability_at"]
        read_only_fields = fields


class NodeWithTokenSerializer(NodeSerializer):
    """A node just registered: its agent token, shown this once (only its hash is kept), and the command that
    starts its agent."""

    token = serializers.CharField(read_only=True)
    agent_command = serializers.CharField(read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = NodeSerializer.Meta.fields + ["token", "agent_command"]
        read_only_fields = fields


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="the node's new agent token, shown this once")
    agent_command = serializers.CharField(help_text="the command that starts the agent with it")


class NodeSettingsSerializer(serializers.Serializer):
    """A provider's settings of a node (PATCH /nodes/{id}/): its name, and its terms for buyers' containers;
    every field optional."""

    name = serializers.CharField(max_length=MAX_NAME, required=False, help_text="a new name, unique among yours")
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
    name = serializers.CharField(max_length=MAX_NAME)
    region = serializers.CharField(max_length=40, required=False, default="eu-west")
    price_per_gpu_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=0, max_value=1000,
                                                  required=False, help_text="base price of a whole GPU-hour (USD)")


class NodeFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[s for s in Node.Status.values if s != Node.Status.DELETED],
                                     required=False)
    region = serializers.CharField(max_length=40, required=False)


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
    model = serializers.CharField(source="gpu_model.key", default=None, read_only=True, allow_null=True)
    latest = serializers.SerializerMethodField()
    cordoned_by = serializers.ChoiceField(choices=Gpu.CordonedBy.choices, allow_blank=True, read_only=True,
                                          help_text="who cordoned it; empty while it is in service")
    reliability_detail = ReliabilityDetailSerializer(read_only=True)

    class Meta:
        model = Gpu
        fields = ["uuid", "node", "index", "name", "model", "memory_mib", "mig_enabled", "mig_geometry", "health",
                  "health_reason", "cordoned_by", "latest", "reliability", "reliability_detail"]
        read_only_fields = fields

    @extend_schema_field(LatestSerializer(allow_null=True))
    def get_latest(self, gpu: Gpu) -> dict | None:
        latest = getattr(gpu, "latest", None)
        return LatestSerializer(latest).data if latest else None


class GpuFilterSerializer(serializers.Serializer):
    node = serializers.UUIDField(required=False, help_text="a node's id")
    health = serializers.ChoiceField(choices=Gpu.Health.choices, required=False)
    model = serializers.SlugField(max_length=40, required=False, help_text="a GPU model key, like h100-80gb")


class CordonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=150, required=False, allow_blank=True,
                                   help_text="why (default: cordoned by its provider)")


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


class SliceFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Slice.State.choices, required=False)


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A provider's nodes. POST registers one and returns its agent token once; PATCH renames it and sets its terms
    for buyers' containers; DELETE deletes it (409 while buyers' leases or reservations are on it)."""

    serializer_class = NodeSerializer
    queryset = Node.objects.none()  # the schema's path types; requests use get_queryset
    filter_serializer = NodeFilterSerializer
    write_scope = FLEET_SCOPE
    error_statuses = {"create": (409,), "partial_update": (409,), "destroy": (409,)}

    def get_queryset(self):
        return selectors.node_list(user=self.request.user)

    @extend_schema(request=NodeRegisterSerializer, responses={201: NodeWithTokenSerializer})
    def create(self, request):
        data = NodeRegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node, token = node_services.node_register(provider=request.user, **data.validated_data)
        node = selectors.node_get(user=request.user, node_id=node.pk)
        node.token, node.agent_command = token, agent_command_line(request, token)
        return Response(NodeWithTokenSerializer(node).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=NodeSettingsSerializer, responses={200: NodeSerializer})
    def partial_update(self, request, pk=None):
        node = self.get_object()
        data = NodeSettingsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node_services.node_settings_update(node=node, **data.validated_data)
        return Response(NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        node_services.node_delete(node=self.get_object(), by=request.user.get_username())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        node = node_services.node_drain(node=self.get_object(), by_operator=request.user.is_staff)
        return Response(NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data)

    @extend_schema(request=None, responses=NodeSerializer,
                   description="Take new work again. A node an operator drained is put back only by an operator "
                               "(403 `drained_by_operator`).")
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        node = node_services.node_undrain(node=self.get_object(), by_operator=request.user.is_staff)
        return Response(NodeSerializer(selectors.node_get(user=request.user, node_id=node.pk)).data)

    @extend_schema(request=None, responses=TokenSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None):
        token = node_services.node_rotate_token(node=self.get_object())
        return Response(TokenSerializer({"token": token, "agent_command": agent_command_line(request, token)}).data)


def agent_command_line(request, token: str) -> str:
    """The command that starts this node's agent, token in its environment (a command line is visible to every
    user of the server); wss:// when the request came over TLS (behind a proxy: DJANGO_SECURE_PROXY_SSL_HEADER)."""
    scheme = "wss" if request.is_secure() else "ws"
    return (f"NODEAGENT_TOKEN={shlex.quote(token)} python -m nodeagent "
            f"--server {scheme}://{request.get_host()}/ws/agent/")


class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    """The provider's GPUs with their MIG geometry, health and latest metrics; cordon/ and uncordon/ take one out
    of placement and back."""

    serializer_class = GpuSerializer
    queryset = Gpu.objects.none()
    lookup_field = "uuid"
    lookup_value_regex = "[^/]+"
    filter_serializer = GpuFilterSerializer
    filter_fields = {"node": "node_id", "model": "gpu_model__key"}
    write_scope = FLEET_SCOPE

    def get_queryset(self):
        return selectors.gpu_list(user=self.request.user)

    @extend_schema(request=CordonSerializer, responses=GpuSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, uuid=None):
        gpu = self.get_object()
        data = CordonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        default = "cordoned by an operator" if request.user.is_staff else "cordoned by its provider"
        reason = data.validated_data.get("reason") or default
        health_services.gpu_cordon(gpu_id=gpu.pk, reason=reason, by=request.user.get_username(),
                                   source=health_services.cordon_source_of(request.user))
        return Response(GpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)

    @extend_schema(request=None, responses=GpuSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, uuid=None):
        gpu = self.get_object()
        # A provider lifting an operator's cordon gets 403 (cordoned_by_operator) in the one error shape.
        health_services.gpu_uncordon(gpu_id=gpu.pk, by=request.user.get_username(),
                                     source=health_services.cordon_source_of(request.user))
        return Response(GpuSerializer(self.get_queryset().get(pk=gpu.pk)).data)


class SliceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    """Slices on the caller's GPUs. POST carves one by hand (diagnostics; orders carve their own); DELETE destroys a
    hand-carved one (202: the agent destroys the instance)."""

    serializer_class = SliceSerializer
    queryset = Slice.objects.none()
    filter_serializer = SliceFilterSerializer
    write_scope = FLEET_SCOPE
    error_statuses = {"create": (404, 409), "destroy": (409,)}  # create: 404 for a GPU that is not yours

    def get_queryset(self):
        return selectors.slice_list(user=self.request.user)

    @extend_schema(request=SliceCreateSerializer, responses={201: SliceSerializer})
    def create(self, request):
        data = SliceCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        gpu = selectors.gpu_list(user=request.user).filter(uuid=data.validated_data["gpu"]).first()
        if gpu is None:
            raise NotFound("no such GPU among yours", field="gpu")
        sl = slice_services.slice_create(gpu_id=gpu.pk, profile=data.validated_data.get("profile") or None,
                                         start=data.validated_data.get("start"))
        return Response(SliceSerializer(self.get_queryset().get(pk=sl.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={202: SliceSerializer})
    def destroy(self, request, pk=None):
        sl = slice_services.slice_destroy(slice_id=self.get_object().pk, by_provider=True)
        return Response(SliceSerializer(sl).data, status=status.HTTP_202_ACCEPTED)
