from django.conf import settings
from django.contrib import admin, messages
from django.template.loader import render_to_string

from scheduler.errors import DomainError

from scheduler.models import (AgentCommand, Gpu, GpuMetricLatest, GpuMetricRollup, GpuModel, GpuProfile, HealthEvent,
                              Node, Slice)
from scheduler.services import health as health_services, nodes as node_services


class GpuProfileInline(admin.TabularInline):
    model = GpuProfile
    extra = 0
    fields = ["name", "compute_slices", "memory_slices", "memory_gb", "starts", "max_count", "media_extensions", "pu"]


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ["name", "key", "memory_gb", "bf16_tensor_tflops", "memory_bandwidth_gbs", "compute_capability",
                    "mig_capable", "pu"]
    search_fields = ["name", "key"]
    list_filter = ["compute_capability"]
    inlines = [GpuProfileInline]

    @admin.display(boolean=True)
    def mig_capable(self, obj):
        return obj.mig_capable


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "name", "gpu_model", "mig_enabled", "health", "cordoned_by", "health_reason", "present"]
    readonly_fields = fields
    can_delete = False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "provider", "region", "status", "hostname", "cuda_version", "gpu_total", "last_heartbeat"]
    list_filter = ["status", "drain_requested", "region", "backend"]
    search_fields = ["name", "hostname", "provider__username", "id"]
    readonly_fields = ["id", "token_prefix", "hostname", "driver_version", "cuda_version", "agent_version", "backend",
                       "drain_requested", "last_heartbeat", "connected_at", "created_at", "reliability",
                       "reliability_breakdown"]
    exclude = ["token_hash"]
    inlines = [GpuInline]
    actions = ["drain", "undrain"]

    @admin.display(description="Reliability, taken apart")
    def reliability_breakdown(self, obj):
        """The same formula, components and events the provider sees on the node's console page."""
        return render_to_string("console/_reliability.html", {
            "node": obj, "detail": obj.reliability_detail, "window_days": settings.RELIABILITY["WINDOW_DAYS"],
            "gpus": list(obj.gpus.filter(present=True).order_by("index"))})

    @admin.display(description="GPUs")
    def gpu_total(self, obj):
        return obj.gpus.filter(present=True).count()

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("provider")

    @admin.action(description="Drain selected nodes (no new work)")
    def drain(self, request, queryset):
        for node in queryset:
            node_services.node_drain(node=node, by_operator=True)
        self.message_user(request, f"{queryset.count()} node(s) draining", messages.SUCCESS)

    @admin.action(description="Undrain selected nodes")
    def undrain(self, request, queryset):
        for node in queryset:
            node_services.node_undrain(node=node, by_operator=True)
        self.message_user(request, f"{queryset.count()} node(s) back in service", messages.SUCCESS)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "uuid", "gpu_model", "mig_enabled", "health", "cordoned_by", "health_reason", "present"]
    list_filter = ["health", "cordoned_by", "mig_enabled", "gpu_model", "present", "node__region"]
    search_fields = ["uuid", "name", "node__name"]
    list_select_related = ["node", "gpu_model"]
    readonly_fields = ["uuid", "node", "index", "name", "memory_mib", "mig_geometry"]
    actions = ["cordon", "uncordon", "release"]

    @admin.action(description="Cordon selected GPUs (no new work)")
    def cordon(self, request, queryset):
        n = sum(health_services.gpu_cordon(gpu_id=g.pk, reason="cordoned by an operator", by=request.user.username,
                                           source=Gpu.CordonedBy.OPERATOR) for g in queryset)
        self.message_user(request, f"{n} GPU(s) cordoned", messages.SUCCESS)

    @admin.action(description="Uncordon selected GPUs")
    def uncordon(self, request, queryset):
        n = sum(health_services.gpu_uncordon(gpu_id=g.pk, by=request.user.username, source=Gpu.CordonedBy.OPERATOR)
                for g in queryset)
        self.message_user(request, f"{n} GPU(s) uncordoned", messages.SUCCESS)

    @admin.action(description="Release GPU uuid from its dead (offline) node")
    def release(self, request, queryset):
        """A GPU moved to another provider's server (sold, RMA): free its uuid so that node's hello may
        claim it. Moves between one provider's servers need no operator: the hello moves the GPU."""
        released = 0
        for gpu in queryset:
            try:
                node_services.gpu_release(gpu_id=gpu.pk, by=request.user.username)
                released += 1
            except DomainError as exc:
                self.message_user(request, exc.message, messages.ERROR)
        if released:
            self.message_user(request, f"{released} GPU uuid(s) released; another node may now claim them",
                              messages.SUCCESS)


@admin.register(Slice)
class SliceAdmin(admin.ModelAdmin):
    list_display = ["id", "gpu", "profile", "start", "size", "state", "instance_uuid", "created_at"]
    list_filter = ["state", "profile"]
    search_fields = ["instance_uuid", "gpu__uuid", "gpu__node__name"]
    list_select_related = ["gpu__node"]
    readonly_fields = [f.name for f in Slice._meta.fields]


@admin.register(AgentCommand)
class AgentCommandAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "op", "state", "error_code", "created_at", "completed_at"]
    list_filter = ["state", "op"]
    search_fields = ["id", "node__name"]
    list_select_related = ["node"]
    # args as shown: a workload's secret environment values masked
    readonly_fields = [f.name if f.name != "args" else "args_shown" for f in AgentCommand._meta.fields]
    exclude = ["args"]

    @admin.display(description="args")
    def args_shown(self, obj):
        return obj.args_shown()


@admin.register(HealthEvent)
class HealthEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "node", "gpu", "kind", "message"]
    list_filter = ["kind"]
    search_fields = ["message", "node__name", "gpu__uuid"]
    list_select_related = ["node", "gpu"]
    readonly_fields = [f.name for f in HealthEvent._meta.fields]


@admin.register(GpuMetricRollup)
class GpuMetricRollupAdmin(admin.ModelAdmin):
    list_display = ["gpu", "minute", "samples", "util_avg", "temp_max", "power_avg"]
    list_filter = ["minute"]
    list_select_related = ["gpu__node"]


@admin.register(GpuMetricLatest)
class GpuMetricLatestAdmin(admin.ModelAdmin):
    list_display = ["gpu", "at", "util", "mem_used_mib", "temp_c", "power_w", "ecc_dbe"]
    list_select_related = ["gpu__node"]

