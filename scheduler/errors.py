"""The one domain error type: a message, a machine-readable code and details.

Interfaces turn it into their own shape: the REST API into one JSON error with a status code, the agent
gateway into an error frame, forms into a message beside the field.
"""
from __future__ import annotations


class DomainError(Exception):
    status = 400

    def __init__(self, message: str, *, code: str = "invalid", field: str | None = None,
                 details: dict | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        self.details = details or {}
        if status is not None:
            self.status = status


class NotFound(DomainError):
    status = 404

    def __init__(self, message: str, **kw):
        super().__init__(message, code=kw.pop("code", "not_found"), **kw)


class PermissionDenied(DomainError):
    status = 403

    def __init__(self, message: str, **kw):
        super().__init__(message, code=kw.pop("code", "forbidden"), **kw)


class Conflict(DomainError):
    status = 409

    def __init__(self, message: str, **kw):
        super().__init__(message, code=kw.pop("code", "conflict"), **kw)
