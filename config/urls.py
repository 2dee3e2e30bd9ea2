from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from marketplace.api.errors import api_not_found
from marketplace.api.stripe_webhook import stripe_webhook

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("config.api_urls")),
    path("stripe/webhook/", stripe_webhook, name="stripe-webhook"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
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
