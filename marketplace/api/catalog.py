"""GET /api/v1/offers/: the catalog's units with availability, PU, prices per mode and interruption history."""
from __future__ import annotations

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

    def get(self, request):
        f = OfferFilterSerializer(data=request.query_params)
        f.is_valid(raise_exception=True)
        d = dict(f.validated_data)
        d["available_only"] = d.pop("available")
        offers = offer_list(filters=Filters(**d))
        return Response({"count": len(offers), "results": [offer_data(o, d["mode"]) for o in offers]})
