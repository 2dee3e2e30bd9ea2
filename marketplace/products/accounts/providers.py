"""The provider role: an explicit step (the provider terms accepted, a display name, the country payouts go to).
Only providers register nodes; operators (staff) count as providers. The Stripe Connect account payouts are sent
to is set up on the payouts side (ProviderProfile.stripe_account_id), not here."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from marketplace.models import ProviderProfile
from scheduler.errors import DomainError

# Bump with every change of templates/console/_provider_terms.html: a provider who accepted an older version is
# asked to accept again (the page says so), and keeps the role meanwhile.
PROVIDER_TERMS_VERSION = "2026-12"

# Where Stripe opens (Connect) accounts, so where payouts can go: ISO 3166-1 alpha-2 -> name.
PAYOUT_COUNTRIES = {
    "AU": "Australia", "AT": "Austria", "BE": "Belgium", "BR": "Brazil", "BG": "Bulgaria", "CA": "Canada",
    "HR": "Croatia", "CY": "Cyprus", "CZ": "Czech Republic", "DK": "Denmark", "EE": "Estonia", "FI": "Finland",
    "FR": "France", "DE": "Germany", "GI": "Gibraltar", "GR": "Greece", "HK": "Hong Kong", "HU": "Hungary",
    "IN": "India", "IE": "Ireland", "IT": "Italy", "JP": "Japan", "LV": "Latvia", "LI": "Liechtenstein",
    "LT": "Lithuania", "LU": "Luxembourg", "MY": "Malaysia", "MT": "Malta", "MX": "Mexico", "NL": "Netherlands",
    "NZ": "New Zealand", "NO": "Norway", "PL": "Poland", "PT": "Portugal", "RO": "Romania", "SG": "Singapore",
    "SK": "Slovakia", "SI": "Slovenia", "ES": "Spain", "SE": "Sweden", "CH": "Switzerland", "TH": "Thailand",
    "AE": "United Arab Emirates", "GB": "United Kingdom", "US": "United States",
}


def provider_terms_current(profile: ProviderProfile | None) -> bool:
    return profile is not None and profile.terms_version == PROVIDER_TERMS_VERSION


def provider_onboard(*, user, display_name: str, payout_country: str, terms_accepted: bool,
                     terms_version: str) -> ProviderProfile:
    """Make `user` a provider, or update its profile and accept the current terms again. Refuses unless the terms
    accepted are the current ones (the page was not stale) and the country is one payouts can go to."""
    if not terms_accepted:
        raise DomainError("accept the provider terms to become a provider", field="terms_accepted")
    if terms_version != PROVIDER_TERMS_VERSION:
        raise DomainError(f"the provider terms changed (now version {PROVIDER_TERMS_VERSION}) while you read them: "
                          f"read them again and accept", field="terms_accepted", code="terms_changed")
    display_name = " ".join((display_name or "").split())
    if not 2 <= len(display_name) <= 80:
        raise DomainError("a display name has 2 to 80 characters", field="display_name")
    payout_country = (payout_country or "").strip().upper()
    if payout_country not in PAYOUT_COUNTRIES:
        raise DomainError("choose the country your payouts go to from the list (where Stripe pays out)",
                          field="payout_country")
    with transaction.atomic():
        profile = ProviderProfile.objects.select_for_update().filter(user_id=user.pk).first()
        if profile is None:
            profile = ProviderProfile(user=user)
        elif profile.stripe_account_id and profile.payout_country != payout_country:
            raise DomainError("your payout account is set up for another country: ask an operator to move it",
                              field="payout_country")
        profile.display_name, profile.payout_country = display_name, payout_country
        profile.terms_version, profile.terms_accepted_at = PROVIDER_TERMS_VERSION, timezone.now()
        profile.save()
    return profile
