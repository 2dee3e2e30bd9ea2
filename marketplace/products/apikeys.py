"""API keys: random, shown once, stored as a SHA-256 hash, each with the scopes it may use."""
import hashlib
import secrets

from django.utils import timezone

from marketplace.models import ApiKey
from scheduler.errors import DomainError

KEY_PREFIX = "gpm_key_"
# `read`: GET what the user may see; `trade`: buy, end, bid, list, top up; `provide`: nodes and payouts.
SCOPES = ("read", "trade", "provide")


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def api_key_create(*, user, name: str, scopes=SCOPES) -> tuple[ApiKey, str]:
    """Create a key for `user` with `scopes` (a subset of SCOPES, at least one); returns it and the secret
    (shown once)."""
    name = (name or "").strip()
    if not name or len(name) > 80:
        raise DomainError("an API key needs a name of 1 to 80 characters", field="name")
    if isinstance(scopes, str) or not scopes or any(s not in SCOPES for s in scopes):
        raise DomainError(f"an API key needs one or more scopes of {', '.join(SCOPES)}", field="scopes")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(user=user, name=name, prefix=secret[:16], key_hash=_hash(secret),
                                scopes=[s for s in SCOPES if s in scopes])
    return key, secret


def api_key_revoke(*, user, key_id) -> ApiKey:
    key = ApiKey.objects.get(pk=key_id, user=user)
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    key.refresh_from_db()
    return key


def api_key_resolve(*, secret: str) -> ApiKey | None:
    """The active key (with its user) a secret names, or None; marks it used."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    key = ApiKey.objects.select_related("user").filter(key_hash=_hash(secret), revoked_at__isnull=True).first()
    if key is None or not key.user.is_active:
        return None
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return key

