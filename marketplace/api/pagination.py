"""Lists are pages: ?limit= (1 to MAX_LIMIT, default PAGE_SIZE) and ?offset=. A limit past the maximum is cut to
it (a limit past 2^63 was a database overflow, a 500); one that is not a positive whole number is a 400."""
from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500


def _whole(raw: str, name: str, *, minimum: int) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or value < minimum:
        raise ValidationError({name: [f"{name} is a whole number from {minimum}"]})
    return value


class Pages(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw in (None, ""):
            return self.default_limit
        return min(_whole(raw, self.limit_query_param, minimum=1), self.max_limit)

    def get_offset(self, request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        # Past the count a page is empty: DRF answers that without asking the database, so no offset overflows.
        return 0 if raw in (None, "") else _whole(raw, self.offset_query_param, minimum=0)

    def get_schema_operation_parameters(self, view) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
                  self.offset_query_param: {"minimum": 0}}
        for p in parameters:
            p["schema"].update(bounds.get(p["name"], {}))
        return parameters
