"""The simulator's one error for input it cannot replay: a missing or malformed file, an unmapped model name.

A `DomainError` (the project's one error type) so a caller gets a message in the user's words, and a
`ValueError` so code that guarded the library's older ValueErrors keeps working. The CLI prints the message
on one line and exits with status 2, as argparse does for a bad option; nothing here is a traceback.
"""
from __future__ import annotations

from scheduler.errors import DomainError


class SimInputError(DomainError, ValueError):
    def __init__(self, message: str, **kw):
        super().__init__(message, code=kw.pop("code", "sim_input"), **kw)
