"""What went wrong, and the exit status it gives (docs/cli.md lists them)."""
from __future__ import annotations

EXIT_OK = 0
EXIT_API = 1          # the server refused or failed the request (its message is printed), or a wait gave up
EXIT_USAGE = 2        # the command line is wrong (argparse's status too), or an ID prefix names several things
EXIT_AUTH = 3         # no key, or the key was refused (401) or lacks the permission (403)
EXIT_NOT_FOUND = 4    # no such thing among yours (404, or an ID prefix that matches nothing)
EXIT_UNREACHABLE = 5  # the server could not be reached (refused, timed out, not HTTP)
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class CliError(Exception):
    """An error the user reads: `message` (the API's words where the API said it), the exit status, and what to
    try (`hint`)."""

    exit_code = EXIT_API

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(CliError):
    exit_code = EXIT_USAGE


class AuthError(CliError):
    exit_code = EXIT_AUTH


class NotFound(CliError):
    exit_code = EXIT_NOT_FOUND


class Unreachable(CliError):
    exit_code = EXIT_UNREACHABLE


class ApiError(CliError):
    """The one error shape of the API, {"error": {"code", "message", "fields"?, "details"?}}, with its status."""

    def __init__(self, status: int, code: str, message: str, *, fields: dict | None = None,
                 details: dict | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.status, self.code = status, code
        self.fields = fields or {}
        self.details = details or {}
        if status == 404:
            self.exit_code = EXIT_NOT_FOUND
        elif status in (401, 403):
            self.exit_code = EXIT_AUTH
