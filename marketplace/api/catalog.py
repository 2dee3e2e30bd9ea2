"""GET /api/v1/offers/: the catalog's units with availability, PU, prices per mode and interruption history."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from marketplace.products.catalog import SORTS, Filters, Offer, offer_list

from .market import VERSION

MODES = ["on_demand", "reserved", "reserved_short_notice", "spot", "resale"]


class OfferFilterSerializer(serializers.Serializer):
    gpu_model = serializers.SlugField(max_length=40, required=False)
    min_memory_gb = serializers.FloatField(min_value=0, max_value=1000, required=False)
    min_cuda = serializers.RegexField(VERSION, required=False)
    min_compute_capability = serializers.RegexField(VERSION, required=False)
    region = serializers.CharField(max_length=40, required=False)
    max_price = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, required=False)
    min_reliability = serializers.FloatField(min_value=0, max_value=1, required=False)
    mode = serializers.ChoiceField(choices=MODES, required=False, default="on_demand")
    min_pu_per_dollar = serializers.FloatField(min_value=0, required=False)
    available = serializers.BooleanField(required=False, default=False)
    ordering = serializers.ChoiceField(choices=sorted(SORTS | {f"-{s}" for s in SORTS}), required=False,
                                       default="price")

    def validate_gpu_model(self, value):
        from scheduler.models import GpuModel

        if not GpuModel.objects.filter(key=value).exists():
            raise serializers.ValidationError(f"unknown GPU model {value!r}")
        return value


class InterruptionEventSerializer(serializers.Serializer):
    kind = serializers.CharField()
    at = serializers.DateTimeField()
    notice_seconds = serializers.FloatField()


class InterruptionHistorySerializer(serializers.Serializer):
    last_30_days = serializers.IntegerField()
    recent = InterruptionEventSerializer(many=True)


class OfferPricesSerializer(serializers.Serializer):
    """USD per hour in each mode that has a price (resale: only with an open listing)."""

    on_demand = serializers.DecimalField(max_digits=18, decimal_places=6, required=False)
    reserved = serializers.DecimalField(max_digits=18, decimal_places=6, required=False)
    reserved_short_notice = serializers.DecimalField(max_digits=18, decimal_places=6, required=False)
    spot = serializers.DecimalField(max_digits=18, decimal_places=6, required=False)
    resale = serializers.DecimalField(max_digits=18, decimal_places=6, required=False)


class OfferSerializer(serializers.Serializer):
    """A unit of the catalog: GPU model × profile × region."""

    id = serializers.CharField(help_text="gpu_model:profile:region")
    gpu_model = serializers.CharField()
    profile = serializers.CharField(help_text="a MIG profile, or whole")
    region = serializers.CharField()
    memory_gb = serializers.FloatField()
    compute_capability = serializers.CharField()
    cuda_version = serializers.CharField()
    pu = serializers.FloatField(help_text="performance units (docs/performance-units.md)")
    availability = serializers.IntegerField(help_text="how many could be ordered now")
    gpus = serializers.IntegerField()
    reliability = serializers.FloatField()
    prices = OfferPricesSerializer()
    usd_per_pu_hour = serializers.DecimalField(max_digits=18, decimal_places=6, allow_null=True,
                                               help_text="in the requested mode")
    pu_per_dollar = serializers.FloatField(allow_null=True)
    interruptions = InterruptionHistorySerializer()


class OfferPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = OfferSerializer(many=True)


def offer_data(o: Offer, mode: str) -> dict:
    return {"id": o.key, "gpu_model": o.gpu_model, "profile": o.profile, "region": o.region,
            "memory_gb": o.memory_gb, "compute_capability": o.compute_capability, "cuda_version": o.cuda_version,
            "pu": o.pu, "availability": o.availability, "gpus": o.gpus, "reliability": o.reliability,
            "prices": {k: str(v) for k, v in o.prices.items()},
            "usd_per_pu_hour": str(o.usd_per_pu_hour(mode)) if o.usd_per_pu_hour(mode) is not None else None,
            "pu_per_dollar": o.pu_per_dollar(mode), "interruptions": o.interruptions}


class OfferList(APIView):
    """Offers: GPU model × profile × region. Filters: gpu_model, min_memory_gb, min_cuda,
    min_compute_capability, region, max_price (in `mode`), min_reliability, mode, min_pu_per_dollar,
    available; ordering: price, pu_per_dollar, reliability, availability, memory_gb, pu (prefix - for desc)."""

    permission_classes = [AllowAny]

    @extend_schema(operation_id="offers_list", parameters=[OfferFilterSerializer], responses=OfferPageSerializer)
    def get(self, request):
        f = OfferFilterSerializer(data=request.query_params)
        f.is_valid(raise_exception=True)
        d = dict(f.validated_data)
        d["available_only"] = d.pop("available")
        offers = offer_list(filters=Filters(**d))
        return Response(OfferPageSerializer({"count": len(offers),
                                             "results": [offer_data(o, d["mode"]) for o in offers]}).data)
