"""Forms of sign-up, log-in (password, then the second factor's code), the provider step and the second factor's
set-up. They parse what people type; the services in marketplace/products/accounts check the rules."""
from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from marketplace.products.accounts.providers import PAYOUT_COUNTRIES, PROVIDER_TERMS_VERSION


class LoginForm(AuthenticationForm):
    """Username or e-mail and password; a refusal (throttled address, locked account, unconfirmed e-mail) is said
    as it is, not as a wrong password."""

    error_messages = {**AuthenticationForm.error_messages,
                      "invalid_login": "Wrong username, e-mail or password."}

    def __init__(self, request=None, *args, **kwargs):
        super().__init__(request, *args, **kwargs)
        self.fields["username"].label = "Username or e-mail"
        self.fields["username"].max_length = 254
        self.fields["username"].widget.attrs["maxlength"] = 254

    @property
    def refusal(self):
        return getattr(self.request, "login_refusal", None)

    def get_invalid_login_error(self):
        if self.refusal is not None:
            return ValidationError(self.refusal.message, code=self.refusal.code)
        return super().get_invalid_login_error()


class AdminLoginForm(LoginForm):
    """The admin's log-in: the same checks, and only operators get in."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise ValidationError("This log-in is for operators: log in with an operator account, or go to the "
                                  "console.", code="not_staff")


class CodeForm(forms.Form):
    code = forms.CharField(label="Code", max_length=20, help_text="The 6 digits your authenticator app shows, or one "
                                                                   "of your recovery codes.",
                           widget=forms.TextInput(attrs={"autocomplete": "one-time-code", "spellcheck": "false",
                                                         "autocapitalize": "off"}))


class SignUpForm(forms.Form):
    username = forms.CharField(max_length=40, help_text="2 to 40 letters, digits and . + - _; you can also log in "
                                                        "with your e-mail address.",
                               widget=forms.TextInput(attrs={"autocomplete": "username", "autofocus": True}))
    email = forms.EmailField(label="E-mail", max_length=254, help_text="We send a link to confirm it.",
                             widget=forms.EmailInput(attrs={"autocomplete": "email"}))
    password = forms.CharField(label="Password", strip=False, help_text="At least 8 characters, not a common one.",
                               widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))
    password2 = forms.CharField(label="Password again", strip=False,
                                widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))

    def clean(self):
        data = super().clean()
        if data.get("password") and data.get("password2") and data["password"] != data["password2"]:
            self.add_error("password2", "The two passwords differ.")
        return data


class ResendForm(forms.Form):
    email = forms.EmailField(label="E-mail", max_length=254, widget=forms.EmailInput(attrs={"autocomplete": "email"}))


class ProviderForm(forms.Form):
    display_name = forms.CharField(label="Display name", max_length=80,
                                   help_text="Your company or your name, as operators will see it.")
    payout_country = forms.ChoiceField(
        label="Payout country", help_text="Where the bank account your earnings go to is (countries Stripe pays to).",
        choices=[("", "Choose a country")] + sorted(PAYOUT_COUNTRIES.items(), key=lambda kv: kv[1]))
    terms_accepted = forms.BooleanField(label="I have read and accept the provider terms above", required=False)
    terms_version = forms.CharField(widget=forms.HiddenInput, initial=PROVIDER_TERMS_VERSION)
