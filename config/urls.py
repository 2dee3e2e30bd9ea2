from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from marketplace.api.stripe_webhook import stripe_webhook

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("config.api_urls")),
    path("stripe/webhook/", stripe_webhook, name="stripe-webhook"),
    # Pages name their icon (templates/base.html); browsers and tools that ask the root for it get it too.
    path("favicon.ico", lambda request: HttpResponsePermanentRedirect(static("favicon.svg"))),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # A script that asks for a path the API does not have gets the API's error shape, not an HTML page.
    re_path(r"^api/", lambda request: JsonResponse(
        {"error": {"code": "not_found", "message": f"no API endpoint at {request.path}; see /api/docs/"}},
        status=404)),
    path("", include("marketplace.urls", namespace="console")),
]
