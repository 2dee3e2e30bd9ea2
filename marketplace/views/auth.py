"""Sign-up, e-mail confirmation, log-in (password, then the second factor's code for accounts that turned it on),
password change and reset: Django's auth views with the console's templates, and the accounts services."""
from __future__ import annotations

import time

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login as auth_login, views as auth_views
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.views.decorators.http import require_http_methods

from marketplace.products.accounts import logins, signup as signups, totp
from marketplace.products.accounts.mail import where_unsent_mail_goes
from marketplace.products.accounts.throttle import client_address
from scheduler.errors import DomainError

from ..account_forms import AdminLoginForm, CodeForm, LoginForm, ResendForm, SignUpForm
from .common import add_domain_error, mark_invalid

PENDING = "accounts:pending-login"  # the session of a log-in whose password passed and whose code is awaited


def _link_base(request) -> str:
    return request.build_absolute_uri("/").rstrip("/")


def _refused(response, refusal):
    """Refusals that pass with time answer 429 with Retry-After, like the API."""
    if refusal is not None and refusal.retry_after:
        response.status_code = 429
        response["Retry-After"] = str(refusal.retry_after)
    return response


class Login(auth_views.LoginView):
    template_name = "registration/login.html"
    form_class = LoginForm
    for_admin = False

    def get_initial(self):
        # The confirmation page sends people here with their username filled in.
        return {"username": self.request.GET.get("username", "")[:254]}

    def form_valid(self, form):
        user = form.get_user()
        if totp.totp_enabled(user):
            self.request.session[PENDING] = {
                "user": user.pk, "backend": user.backend, "next": self.get_success_url(), "admin": self.for_admin,
                "until": time.time() + settings.ACCOUNTS["SECOND_FACTOR_SECONDS"]}
            return redirect("login-code")
        return super().form_valid(form)

    def form_invalid(self, form):
        mark_invalid(form)
        return _refused(super().form_invalid(form), form.refusal)

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        form = context["form"]
        context.update(for_admin=self.for_admin,
                       unconfirmed=form.refusal is not None and form.refusal.code == "unconfirmed")
        return context


login = Login.as_view()
admin_login = Login.as_view(form_class=AdminLoginForm, for_admin=True, next_page="admin:index")


@require_http_methods(["GET", "POST"])
def login_code(request):
    """The second step of a log-in: the code of the account's authenticator app (or a recovery code)."""
    pending = request.session.get(PENDING)
    start_again = reverse("admin:login" if pending and pending.get("admin") else "login")
    user = pending and get_user_model().objects.filter(pk=pending["user"], is_active=True).first()
    if not pending or pending["until"] < time.time() or user is None:
        request.session.pop(PENDING, None)
        messages.error(request, "Log in again: the code must follow the password within "
                                f"{settings.ACCOUNTS['SECOND_FACTOR_SECONDS'] // 60} minutes.")
        return redirect(start_again)
    form = CodeForm(request.POST or None)
    form.fields["code"].widget.attrs["autofocus"] = True
    if request.method == "POST" and form.is_valid():
        address = client_address(request)
        refusal = logins.refusal_before_password(user=user, address=address)
        if refusal is None:
            try:
                right = totp.second_factor_check(user=user, code=form.cleaned_data["code"])
            except DomainError as exc:  # too many wrong codes in a row: wait
                add_domain_error(form, exc)
            else:
                if right:
                    del request.session[PENDING]
                    auth_login(request, user, backend=pending["backend"])
                    return redirect(pending["next"])
                refusal = logins.login_failed(user=user, address=address)
                if refusal is None:
                    form.add_error("code", "That code is not right: enter the code your app shows now, or an unused "
                                           "recovery code.")
        if refusal is not None:
            request.session.pop(PENDING, None)
            messages.error(request, refusal.message)
            return _refused(redirect(start_again), refusal)
    mark_invalid(form)
    return render(request, "accounts/login_code.html", {"form": form}, status=400 if form.errors else 200)


def _mail_asked_for(request, form, send) -> tuple[bool, object, logins.Refusal | None]:
    """Send an e-mail a form asked for (`send()`, a service) unless this address asked for too many: (sent, what
    `send` returned, the refusal). A refusal or the service's error lands on the form."""
    address = client_address(request)
    refusal = logins.mail_refusal(address=address)
    if refusal is not None:
        form.add_error(None, refusal.message)
        return False, None, refusal
    try:
        made = send()
    except DomainError as exc:
        add_domain_error(form, exc)
        return False, None, None
    logins.mail_counted(address=address)
    return True, made, None


@require_http_methods(["GET", "POST"])
def sign_up(request):
    if request.user.is_authenticated:
        return redirect("console:home")
    form = SignUpForm(request.POST or None)
    refusal = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        sent, user, refusal = _mail_asked_for(request, form, lambda: signups.account_sign_up(
            username=data["username"], email=data["email"], password=data["password"],
            link_base=_link_base(request)))
        if sent:
            request.session["accounts:signed-up"] = user.email
            return redirect("signup-sent")
    mark_invalid(form)
    response = render(request, "accounts/signup.html", {"form": form}, status=400 if form.errors else 200)
    return _refused(response, refusal)


@require_http_methods(["GET", "POST"])
def confirmation_resend(request):
    """Sign-up's landing page ("we sent a link") and the form that sends the link again."""
    email = request.session.get("accounts:signed-up")
    form = ResendForm(request.POST or None, initial={"email": email})
    refusal = None
    if request.method == "POST" and form.is_valid():
        sent, _, refusal = _mail_asked_for(request, form, lambda: signups.confirmation_resend(
            email=form.cleaned_data["email"], link_base=_link_base(request)))
        if sent:
            messages.success(request, "If an account awaits confirmation at that address, a new link is on its "
                                      "way: the links sent before it still work until they expire.")
            return redirect("signup-sent")
    mark_invalid(form)
    response = render(request, "accounts/signup_sent.html", {
        "form": form, "email": email, "mail_note": where_unsent_mail_goes(),
        "valid_hours": settings.ACCOUNTS["CONFIRM_LINK_SECONDS"] // 3600}, status=400 if form.errors else 200)
    return _refused(response, refusal)


@require_http_methods(["GET", "POST"])
def confirm_email(request, token):
    """The link of the confirmation e-mail: a page with one button (a mail scanner that fetches links confirms
    nothing), which confirms the address and activates the account."""
    if request.method == "POST":
        try:
            user, now = signups.email_confirm(token=token)
        except DomainError as exc:
            return render(request, "accounts/confirm_email.html", {"error": exc.message, "form": ResendForm()},
                          status=400)
        messages.success(request, f"Your e-mail address is confirmed: log in as {user.get_username()}." if now else
                                  "This address was confirmed already: log in.")
        return redirect(f"{reverse('login')}?username={user.get_username()}")
    return render(request, "accounts/confirm_email.html", {"token": token})


class PasswordResetConfirm(auth_views.PasswordResetConfirmView):
    """A reset proves the owner holds the account's mailbox: it also lifts a lock-out."""

    template_name = "accounts/password_reset_confirm.html"
    success_url = reverse_lazy("password-reset-complete")

    def form_valid(self, form):
        response = super().form_valid(form)
        logins.lock_clear(user=form.user)
        return response


class PasswordReset(auth_views.PasswordResetView):
    """Reset links are e-mails asked for: the per-address e-mail throttle counts them."""

    template_name = "accounts/password_reset.html"
    email_template_name = "accounts/email/password_reset.txt"
    subject_template_name = "accounts/email/password_reset_subject.txt"
    success_url = reverse_lazy("password-reset-sent")

    def form_valid(self, form):
        sent, response, refusal = _mail_asked_for(self.request, form, lambda: super(PasswordReset, self).form_valid(form))
        return response if sent else _refused(self.form_invalid(form), refusal)


password_reset = PasswordReset.as_view()
password_reset_sent = auth_views.PasswordResetDoneView.as_view(template_name="accounts/password_reset_sent.html")
password_reset_confirm = PasswordResetConfirm.as_view()
password_reset_complete = auth_views.PasswordResetCompleteView.as_view(
    template_name="accounts/password_reset_complete.html")
password_change = auth_views.PasswordChangeView.as_view(template_name="accounts/password_change.html",
                                                        success_url=reverse_lazy("password-change-done"))
password_change_done = auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html")
