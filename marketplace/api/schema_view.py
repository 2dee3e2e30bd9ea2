"""The view serving the schema (apart from `schema`, which DRF's settings import while this module's base class
imports them)."""
from __future__ import annotations

import threading

from drf_spectacular.views import SpectacularAPIView


class SchemaView(SpectacularAPIView):
    """GET /api/schema/, one generation at a time per process. drf-spectacular's generator is not thread-safe (its
    extensions load their target classes lazily and its warning counters are shared: upstream issues #1123 and
    #1368), and Django runs each ASGI request's sync code in a thread of its own, so clients fetching the schema at
    the same moment could get a 500 (e.g. 'NoneType' object has no attribute 'startswith' in a fresh process)."""

    _generating = threading.Lock()

    def _get_schema_response(self, request):
        with self._generating:
            return super()._get_schema_response(request)
