"""Accounts' pages outside the console's namespace: log-in and out, sign-up, e-mail confirmation, passwords."""
from django.contrib.auth import views as auth_views
from django.urls import path

from marketplace.views import auth

urlpatterns = [
    path("login/", auth.login, name="login"),
    path("login/code/", auth.login_code, name="login-code"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("signup/", auth.sign_up, name="signup"),
    path("signup/sent/", auth.confirmation_resend, name="signup-sent"),
    path("signup/confirm/<str:token>/", auth.confirm_email, name="confirm-email"),
    path("password/change/", auth.password_change, name="password-change"),
    path("password/change/done/", auth.password_change_done, name="password-change-done"),
    path("password/reset/", auth.password_reset, name="password-reset"),
    path("password/reset/sent/", auth.password_reset_sent, name="password-reset-sent"),
    path("password/reset/<uidb64>/<token>/", auth.password_reset_confirm, name="password-reset-confirm"),
    path("password/reset/done/", auth.password_reset_complete, name="password-reset-complete"),
]
