"""The provider step: the provider terms (with their version), a display name and the payout country. It makes an
account a provider, the role that registers nodes; accepting a newer version of the terms comes back here."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from marketplace.models import ProviderProfile
from marketplace.products.accounts import providers
from scheduler.errors import DomainError

from ..account_forms import ProviderForm
from .common import add_domain_error, mark_invalid


def _next(request) -> str | None:
    url = request.POST.get("next") or request.GET.get("next")
    ok = url and url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                                 require_https=request.is_secure())
    return url if ok else None


@login_required
def provider(request):
    profile = ProviderProfile.of(request.user)
    initial = {"display_name": profile.display_name, "payout_country": profile.payout_country} if profile else {
        "display_name": request.user.get_full_name() or request.user.get_username()}
    form = ProviderForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        was = profile is not None
        try:
            providers.provider_onboard(user=request.user, **form.cleaned_data)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, "Provider details saved." if was else
                             "You are a provider now: register your first node.")
            return redirect(_next(request) or ("console:provider" if was else "console:node-register"))
    mark_invalid(form)
    return render(request, "console/provider.html", {
        "form": form, "profile": profile, "terms_version": providers.PROVIDER_TERMS_VERSION,
        "terms_current": providers.provider_terms_current(profile), "next": _next(request),
        "country": providers.PAYOUT_COUNTRIES.get(profile.payout_country) if profile else None, "nav": "provider"},
        status=400 if form.errors else 200)
