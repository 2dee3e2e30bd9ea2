"""The agent's one domain error: a message plus the protocol error code the server receives."""
from __future__ import annotations

from . import protocol


class BackendError(Exception):
    """A command the backend refused or failed; `code` is one of protocol.E_*."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"BackendError({self.code!r}, {self.message!r})"


def not_found(what: str) -> BackendError:
    return BackendError(protocol.E_NOT_FOUND, what)


def not_supported(what: str) -> BackendError:
    return BackendError(protocol.E_NOT_SUPPORTED, what)
