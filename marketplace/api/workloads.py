"""REST API of workloads: the workload an order carries (its body and how it is shown back, secrets masked),
the operator's templates, the caller's SSH keys, and a lease's kept logs as text."""
from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from marketplace.lifecycle import workloads as lifecycle
from marketplace.models import SshKey, Template, Workload, WorkloadRun
from marketplace.products import workloads as products
from marketplace.products.workloads import KINDS, NOTICES, PORT_KINDS, WORKLOAD_BOUNDS, WorkloadSpec

ENV_NAME = products.ENV_NAME.pattern


class PortSerializer(serializers.Serializer):
    port = serializers.IntegerField(min_value=1, max_value=65535, help_text="the container's port")
    protocol = serializers.ChoiceField(choices=["tcp", "udp"], default="tcp")
    kind = serializers.ChoiceField(choices=PORT_KINDS, required=False,
                                   help_text="how the lease shows it: ssh (an ssh command), http (a URL), tcp "
                                             "(host:port); default ssh for 22/tcp, else tcp")


class EnvSerializer(serializers.Serializer):
    name = serializers.RegexField(ENV_NAME, max_length=128)
    value = serializers.CharField(max_length=32768, allow_blank=True, trim_whitespace=False)
    secret = serializers.BooleanField(default=False, help_text="never shown back, logged or sent to webhooks")


class WorkloadCreateSerializer(serializers.Serializer):
    """What an order runs on each of its leases. Fields left out take the template's (or the image's own)."""

    template = serializers.SlugField(max_length=40, required=False, help_text="a key of GET /api/v1/templates/")
    image = serializers.CharField(max_length=300, required=False, allow_blank=True,
                                  help_text="an image reference, like docker.io/library/ubuntu:24.04 (or a "
                                            "template's)")
    command = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True), required=False,
                                    max_length=WORKLOAD_BOUNDS["command"], help_text="replaces the entrypoint")
    args = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True), required=False,
                                 max_length=WORKLOAD_BOUNDS["args"], help_text="replaces the image's command")
    env = EnvSerializer(many=True, required=False, max_length=WORKLOAD_BOUNDS["env"])
    ports = PortSerializer(many=True, required=False, max_length=WORKLOAD_BOUNDS["ports"],
                           help_text="container ports to publish, each on a host port of the node")
    disk_gb = serializers.IntegerField(required=False, min_value=WORKLOAD_BOUNDS["disk_gb"][0],
                                       max_value=WORKLOAD_BOUNDS["disk_gb"][1])
    kind = serializers.ChoiceField(choices=KINDS, required=False,
                                   help_text="interactive (runs for the lease, the default) or job (runs to "
                                             "completion; the lease ends at its exit, billed while it ran)")
    notice = serializers.ChoiceField(choices=NOTICES, default="sigterm",
                                     help_text="how a spot interruption's notice reaches the container: SIGTERM, "
                                               "or a file at /run/gpumarket/notice")

    def spec(self) -> WorkloadSpec:
        return spec_of(self.validated_data)


def spec_of(data: dict) -> WorkloadSpec:
    d = dict(data)
    return WorkloadSpec(template=d.get("template") or None, image=d.get("image", ""),
                        command=d.get("command", []), args=d.get("args", []),
                        env=[dict(e) for e in d.get("env", [])], ports=[dict(p) for p in d.get("ports", [])],
                        disk_gb=d.get("disk_gb"), kind=d.get("kind"), notice=d.get("notice", "sigterm"))


class WorkloadSerializer(serializers.ModelSerializer):
    """An order's workload as it is shown: secret values are null."""

    template = serializers.SlugRelatedField(slug_field="key", read_only=True)
    env = serializers.SerializerMethodField()

    class Meta:
        model = Workload
        fields = ["template", "image", "command", "args", "env", "ports", "disk_gb", "kind", "notice"]
        read_only_fields = fields

    def get_env(self, w: Workload) -> list[dict]:
        return w.public_env()


class WorkloadRunSerializer(serializers.ModelSerializer):
    """A lease's container: its state as the agent reported it, the exit, the error, how much it wrote."""

    seconds = serializers.IntegerField(read_only=True, allow_null=True, help_text="how long it ran, once it "
                                                                                  "stopped")

    class Meta:
        model = WorkloadRun
        fields = ["state", "progress", "error", "exit_code", "started_at", "finished_at", "seconds", "log_bytes"]
        read_only_fields = fields


def workload_run_data(lease) -> dict | None:
    run = lifecycle.run_of(lease)
    return WorkloadRunSerializer(run).data if run is not None else None


class TemplateSerializer(serializers.ModelSerializer):
    class Meta:
        model = Template
        fields = ["key", "name", "description", "image", "command", "args", "env", "ports", "disk_gb", "kind",
                  "jupyter"]
        read_only_fields = fields


class TemplateViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The operator's templates an order's workload may name (`"workload": {"template": "pytorch"}`)."""

    serializer_class = TemplateSerializer
    queryset = Template.objects.none()  # the schema's path types; requests use get_queryset
    lookup_field = "key"
    pagination_class = None

    def get_queryset(self):
        return products.template_list()


class SshKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = SshKey
        fields = ["id", "name", "public_key", "fingerprint", "created_at"]
        read_only_fields = ["id", "fingerprint", "created_at"]
        extra_kwargs = {"public_key": {"help_text": "one line, as in ~/.ssh/id_ed25519.pub"}}


class SshKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your SSH public keys: every container of yours lets each of them log in (as root)."""

    serializer_class = SshKeySerializer
    queryset = SshKey.objects.none()
    write_scope = "trade"
    error_statuses = {"create": (409,)}

    def get_queryset(self):
        return SshKey.objects.filter(user=self.request.user)

    def create(self, request):
        data = SshKeySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = products.ssh_key_add(user=request.user, **data.validated_data)
        return Response(SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        products.ssh_key_delete(user=request.user, key_id=self.get_object().pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


LOGS_SCHEMA = extend_schema(
    responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the kept tail of its output")})


def logs_response(lease) -> HttpResponse:
    """The kept tail of a lease's container output, as a text download."""
    run = lifecycle.run_of(lease)
    body = run.log_tail if run is not None else ""
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="lease-{str(lease.pk)[:8]}.log"'
    return response
