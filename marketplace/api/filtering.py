"""A list's query parameters, declared once per view (settings.REST_FRAMEWORK's filter backend): the serializer in
`filter_serializer` validates them (a 400 naming each bad one) and documents them in the schema; `filter_fields`
maps a parameter to its queryset lookup (default: its own name), or the view's `filtered(qs, values)` applies them
where a lookup is not enough. Only lists are filtered: a retrieve ignores them."""
from __future__ import annotations

from drf_spectacular.extensions import OpenApiFilterExtension
from drf_spectacular.plumbing import build_parameter_type
from drf_spectacular.utils import OpenApiParameter
from rest_framework.filters import BaseFilterBackend


def query_values(serializer_class, request) -> dict:
    """The validated, non-empty query parameters of `serializer_class` (a 400 naming the bad ones)."""
    f = serializer_class(data=request.query_params)
    f.is_valid(raise_exception=True)
    return {k: v for k, v in f.validated_data.items() if v not in (None, "")}


class QueryFilters(BaseFilterBackend):
    def filter_queryset(self, request, queryset, view):
        serializer_class = getattr(view, "filter_serializer", None)
        if serializer_class is None or getattr(view, "action", "list") != "list":
            return queryset
        values = query_values(serializer_class, request)
        if hasattr(view, "filtered"):
            return view.filtered(queryset, values)
        lookups = getattr(view, "filter_fields", {})
        return queryset.filter(**{lookups.get(name, name): value for name, value in values.items()})


class QueryFiltersSchema(OpenApiFilterExtension):
    target_class = QueryFilters

    def get_schema_operation_parameters(self, auto_schema, *args, **kwargs) -> list[dict]:
        serializer_class = getattr(auto_schema.view, "filter_serializer", None)
        if serializer_class is None or not auto_schema._is_list_view():
            return []
        serializer = serializer_class()
        mapped = auto_schema._map_serializer(serializer, "request")
        return [build_parameter_type(name=name, schema=schema, description=schema.pop("description", None),
                                     location=OpenApiParameter.QUERY,
                                     allow_blank=getattr(serializer.fields.get(name), "allow_blank", True),
                                     required=name in mapped.get("required", []))
                for name, schema in mapped["properties"].items()]
