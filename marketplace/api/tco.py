"""POST /api/v1/tco/: the TCO calculator (marketplace/products/tco.py). Every input is optional: what the caller
leaves out comes from the catalog and its own last 30 days of leases, and the answer echoes the inputs it used."""
from __future__ import annotations

from decimal import Decimal

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.products import tco as tco_services
from nodeagent.hardware.gpus import GPU_MODELS


OPTION_NAMES = ["buy", "on_demand", "reserved", "spot", "mix"]  # the ways to run a plan (TcoOptionEnum in the schema)


def _money(**kw):
    return serializers.DecimalField(max_digits=14, decimal_places=6, min_value=0, max_value=10**7, **kw)


def _share(**kw):
    return serializers.DecimalField(max_digits=6, decimal_places=4, min_value=0, max_value=1, **kw)


class TcoInputSerializer(serializers.Serializer):
    """A planned workload and the figures to price it with; each optional."""

    gpu_model = serializers.ChoiceField(choices=sorted(GPU_MODELS), required=False)
    gpus = serializers.IntegerField(min_value=1, max_value=10_000, required=False)
    pu_needed = serializers.DecimalField(max_digits=10, decimal_places=1, min_value=Decimal("0.1"), max_value=10**6,
                                         required=False, allow_null=True,
                                         help_text="performance units the work needs: sets `gpus` (whole GPUs of "
                                                   "the model, rounded up)")
    hours_per_day = serializers.DecimalField(max_digits=6, decimal_places=2, min_value=Decimal("0.01"), max_value=24,
                                             required=False)
    days = serializers.IntegerField(min_value=1, max_value=3650, required=False)
    utilisation = _share(required=False, help_text="expected share of the hours used doing useful work (0.65)")
    hardware_price_per_gpu = _money(required=False)
    depreciation_months = serializers.IntegerField(min_value=1, max_value=240, required=False)
    power_watts_per_gpu = serializers.DecimalField(max_digits=8, decimal_places=1, min_value=0, max_value=10_000,
                                                   required=False)
    pue = serializers.DecimalField(max_digits=4, decimal_places=2, min_value=1, max_value=5, required=False)
    usd_per_kwh = serializers.DecimalField(max_digits=6, decimal_places=4, min_value=0, max_value=10, required=False)
    hosting_per_gpu_month = _money(required=False)
    on_demand_per_gpu_hour = _money(required=False)
    reserved_per_gpu_hour = _money(required=False)
    spot_per_gpu_hour = _money(required=False)
    spot_interruptions_per_hour = serializers.DecimalField(max_digits=8, decimal_places=4, min_value=0, max_value=100,
                                                           required=False,
                                                           help_text="default: the model's measured rate")
    rework_hours_per_interruption = serializers.DecimalField(max_digits=6, decimal_places=2, min_value=0,
                                                             max_value=100, required=False)
    mix_reserved_share = _share(required=False)
    mix_spot_share = _share(required=False)


class TcoInputsUsedSerializer(TcoInputSerializer):
    """The inputs the calculation used (the caller's, the rest defaults)."""

    from_your_leases = serializers.BooleanField(help_text="the plan's defaults came from your last 30 days of leases")

    def get_fields(self):
        fields = super().get_fields()
        for name, f in fields.items():
            f.required = name != "pu_needed"
        return fields


class TcoOptionSerializer(serializers.Serializer):
    name = serializers.ChoiceField(choices=OPTION_NAMES)
    lines = serializers.DictField(child=serializers.DecimalField(max_digits=16, decimal_places=2),
                                  help_text="cost line -> USD")
    total = serializers.DecimalField(max_digits=16, decimal_places=2)
    paid_gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=2)
    useful_gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=2)
    effective_utilisation = serializers.DecimalField(max_digits=6, decimal_places=4)
    per_useful_gpu_hour = serializers.DecimalField(max_digits=16, decimal_places=6)


class TcoResultSerializer(serializers.Serializer):
    inputs = TcoInputsUsedSerializer()
    options = TcoOptionSerializer(many=True)
    cheapest = serializers.ChoiceField(choices=OPTION_NAMES)


def tco_result(*, user, data: dict) -> dict:
    """The calculator's answer for `data` (validated input) and `user`'s defaults, as TcoResultSerializer reads it."""
    defaults = tco_services.tco_defaults(buyer=user, gpu_model=data.get("gpu_model"))
    values = {**defaults, **data}
    _plan, options = tco_services.tco_for(values)
    return {"inputs": values, "cheapest": min(options, key=lambda o: o.total).name,
            "options": [{"name": o.name, "lines": o.lines, "total": o.total, "paid_gpu_hours": o.paid_gpu_hours,
                         "useful_gpu_hours": o.useful_gpu_hours, "effective_utilisation": o.effective_utilisation,
                         "per_useful_gpu_hour": o.per_useful_gpu_hour} for o in options]}


class TcoView(APIView):
    """Compare buying, on demand, reserved, spot and a mix for a planned workload (docs/operations.md "TCO
    calculator"). A calculation: it changes nothing, so a key with the `read` scope may call it."""

    write_scope = "read"

    @extend_schema(operation_id="tco_calculate", request=TcoInputSerializer, responses=TcoResultSerializer)
    def post(self, request):
        data = TcoInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(TcoResultSerializer(tco_result(user=request.user, data=dict(data.validated_data))).data)
