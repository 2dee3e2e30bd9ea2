from django.contrib import admin
from django.http import HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularSwaggerView

from marketplace.api.errors import api_not_found
from marketplace.api.schema_view import SchemaView
from marketplace.api.stripe_webhook import stripe_webhook
from marketplace.views.auth import admin_login
from marketplace.views.prometheus import metrics

urlpatterns = [
    # The admin logs in through the console's log-in (one backend, lock-out, throttle and second factor for both).
    path("admin/login/", admin_login),
    path("admin/", admin.site.urls),
    path("", include("marketplace.auth_urls")),
    path("api/v1/", include("config.api_urls")),
    path("stripe/webhook/", stripe_webhook, name="stripe-webhook"),
    path("metrics", metrics, name="prometheus-metrics"),
    # Pages name their icon (templates/base.html); browsers and tools that ask the root for it get it too.
    path("favicon.ico", lambda request: HttpResponsePermanentRedirect(static("favicon.svg"))),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # A script that asks for a path the API does not have (or forgot the trailing slash), with any method, gets
    # the API's error shape, not an HTML page.
    re_path(r"^api(/|$)", api_not_found),
    path("", include("marketplace.urls", namespace="console")),
]

# Errors outside the views' own handling: JSON under /api/, the console's pages elsewhere (never Django's
# technical pages; settings.CSRF_FAILURE_VIEW is the CSRF one).
handler400 = "marketplace.views.errors.bad_request"
handler403 = "marketplace.views.errors.permission_denied"
handler404 = "marketplace.views.errors.page_not_found"
handler500 = "marketplace.views.errors.server_error"
