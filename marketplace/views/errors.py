"""The site's error pages (handler400/403/404/500 and the CSRF failure view): the API's paths answer in its one
JSON shape, the console's with its own pages. Never Django's technical pages, whose 404 lists every URL pattern."""
from __future__ import annotations

from django.http import HttpResponse
from django.template import loader
from django.views.decorators.csrf import requires_csrf_token

from marketplace.api.errors import is_api_path, json_error

PAGES = {  # status: (the API's code, the page's heading, what it says)
    400: ("bad_request", "Bad request", "the request could not be understood"),
    403: ("forbidden", "Not allowed", "you may not do this"),
    404: ("not_found", "Not found", "there is nothing at this address"),
    500: ("server_error", "Server error", "something went wrong on our side; it was logged"),
}


def _page(request, status: int, *, message: str | None = None, context: bool = True) -> HttpResponse:
    code, heading, said = PAGES[status]
    if is_api_path(request.path):
        return json_error(status, code, message or said)
    # The 500 page renders alone, without a request context: whatever failed (the database, a context processor)
    # must not fail it too.
    template = loader.get_template("error.html" if context else "500.html")
    body = template.render({"heading": heading, "message": message or said, "path": request.path},
                           request if context else None)
    return HttpResponse(body, status=status)


@requires_csrf_token
def bad_request(request, exception=None):
    return _page(request, 400)


@requires_csrf_token
def permission_denied(request, exception=None):
    return _page(request, 403)


@requires_csrf_token
def page_not_found(request, exception=None):
    return _page(request, 404)


@requires_csrf_token
def server_error(request):
    return _page(request, 500, context=False)


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: a form posted without its token (an expired page, cookies off)."""
    if is_api_path(request.path):
        return json_error(403, "csrf_failed", "this write came with a session cookie but without its CSRF token; "
                                              "scripts use an API key (Authorization: Bearer ...)")
    return _page(request, 403, message="this form expired or your browser refused cookies: go back, reload the "
                                       "page and send it again")
