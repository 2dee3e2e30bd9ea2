"""Accounts side of the market: API keys (stored hashed, shown once, with scopes), notification settings, the
provider profile (the explicit step that makes an account a provider) and each account's e-mail confirmation and
log-in lock-out (docs/accounts.md)."""
import uuid

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, related_name="api_keys", on_delete=models.CASCADE)
    name = models.CharField(max_length=80)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    # What the key may do: `read` (GET anything the user may see), `trade` (buy, end, bid, list, top up),
    # `provide` (register and manage nodes, payouts). Empty means none; see marketplace/products/apikeys.py.
    scopes = models.JSONField(default=list)
    # The key that made this one through the API (none: made in the console); revoking it revokes this one too.
    parent = models.ForeignKey("self", null=True, blank=True, related_name="children", on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name, verbose_name_plural = "API key", "API keys"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class NotificationSettings(models.Model):
    """A user's account-level notifications: one webhook URL for market events, and which kinds are sent.
    An order's own webhook URL wins over it for that order's leases."""

    KINDS = ("interruption", "lease_ended", "lease_failed", "balance_low", "alerts", "budget")

    user = models.OneToOneField(settings.AUTH_USER_MODEL, related_name="notification_settings",
                                on_delete=models.CASCADE)
    webhook_url = models.URLField(max_length=300, blank=True, help_text="market events are POSTed here as JSON")
    interruption = models.BooleanField(default=True, help_text="spot interruption notices")
    lease_ended = models.BooleanField(default=True)
    lease_failed = models.BooleanField(default=True)
    balance_low = models.BooleanField(default=True)
    alerts = models.BooleanField(default=True, help_text="alerts firing and resolving (docs/operations.md)")
    budget = models.BooleanField(default=True, help_text="a project nearing or at its hard cap; auto top-ups")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"notifications of {self.user_id}"

    def wants(self, kind: str) -> bool:
        return kind in self.KINDS and bool(getattr(self, kind))


class ProviderProfile(models.Model):
    """An account that took the explicit step of becoming a provider: it accepted the provider terms and gave
    where its payouts go. Only providers register nodes (operators keep their powers)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, related_name="provider_profile", on_delete=models.CASCADE)
    display_name = models.CharField(max_length=80, help_text="shown to operators; never to buyers")
    terms_version = models.CharField(max_length=20)
    terms_accepted_at = models.DateTimeField()
    # Where payouts go: a Stripe Connect account id (acct_...) once onboarded; empty until then.
    payout_country = models.CharField(max_length=2, help_text="ISO 3166-1 alpha-2")
    stripe_account_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"provider {self.display_name}"

    @staticmethod
    def of(user) -> "ProviderProfile | None":
        """The provider profile of `user` (a user or its id), or None."""
        return ProviderProfile.objects.filter(user_id=getattr(user, "pk", user)).first()

    @staticmethod
    def role_of(user) -> bool:
        """Whether `user` may register nodes: a provider, or an operator (staff keep their powers)."""
        if not getattr(user, "is_authenticated", False):
            return False
        return bool(user.is_staff) or ProviderProfile.objects.filter(user_id=user.pk).exists()


class AccountSecurity(models.Model):
    """An account's e-mail confirmation and its log-in lock-out. Accounts made by an operator or a seed have no row
    until their first failed log-in; a row whose `signed_up_at` is set and `email_confirmed_at` is not belongs to
    an account that signed up and has not followed its link yet (it is inactive meanwhile)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, related_name="security", on_delete=models.CASCADE)
    signed_up_at = models.DateTimeField(null=True, blank=True, help_text="empty: not made by the sign-up form")
    email_confirmed_at = models.DateTimeField(null=True, blank=True)
    # Failed log-ins (wrong password or code) counted since `failures_since`; past the limit within the window
    # the account is locked until `locked_until` (marketplace/products/accounts/policy.py).
    failures = models.PositiveIntegerField(default=0)
    failures_since = models.DateTimeField(null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    last_failure_address = models.CharField(max_length=64, blank=True)

    class Meta:
        verbose_name = "account security"
        verbose_name_plural = "account security"

    def __str__(self) -> str:
        return f"security of {self.user_id}"

    @property
    def awaits_confirmation(self) -> bool:
        return self.signed_up_at is not None and self.email_confirmed_at is None
