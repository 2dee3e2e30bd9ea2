"""API keys: random, shown once, stored as a SHA-256 hash, each with the scopes it may use.

A key may be made in the console (a session: any scopes) or through the API by another key, which can give it only
scopes it holds itself; a key revokes only keys within its own scopes (or itself). Revoking a key revokes the keys
it made, and theirs: a leaked key cannot leave keys of its own behind."""
import hashlib
import secrets
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from marketplace.models import ApiKey
from scheduler.errors import DomainError, PermissionDenied

KEY_PREFIX = "gpm_key_"
SCOPES = ("read", "trade", "provide")
# What each scope lets a key do, as the console's form, the API's schema and docs/api.md say it.
SCOPE_SAID = {"read": "see your orders, leases, money, nodes and keys, and watch them live",
              "trade": "order, end leases, bid, resell, top up, projects and SSH keys",
              "provide": "register and manage nodes, GPUs and slices, payouts"}
# Checked by default on the console's form: what a buyer's script needs; a provider's gets `provide` too.
BUYER_SCOPES = ("read", "trade")


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _beyond(scopes, key: ApiKey) -> str | None:
    """The first of `scopes` that `key` lacks, or None."""
    return next((s for s in SCOPES if s in scopes and s not in key.scopes), None)


def default_scopes(*, user) -> tuple[str, ...]:
    """The scopes the console offers checked: a provider's scripts manage nodes, a buyer's do not."""
    is_provider = user.is_staff or hasattr(user, "provider_profile") or user.nodes.exists()
    return SCOPES if is_provider else BUYER_SCOPES


def api_key_create(*, user, name: str, scopes=SCOPES, by_key: ApiKey | None = None) -> tuple[ApiKey, str]:
    """Create a key for `user` with `scopes` (a subset of SCOPES, at least one); returns it and the secret
    (shown once). `by_key`: the key that asks (through the API); the new key's scopes must be among its own."""
    name = (name or "").strip()
    if not name or len(name) > 80:
        raise DomainError("an API key needs a name of 1 to 80 characters", field="name")
    if isinstance(scopes, str) or not scopes or any(s not in SCOPES for s in scopes):
        raise DomainError(f"an API key needs one or more scopes of {', '.join(SCOPES)}", field="scopes")
    if by_key is not None and (lacking := _beyond(scopes, by_key)):
        raise PermissionDenied(f"a key can only make keys within its own scopes, and this one lacks {lacking!r}",
                               code="missing_scope", details={"scope": lacking})
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(user=user, name=name, prefix=secret[:16], key_hash=_hash(secret),
                                scopes=[s for s in SCOPES if s in scopes], parent=by_key)
    return key, secret


def api_key_revoke(*, user, key_id, by_key: ApiKey | None = None) -> ApiKey:
    """Revoke one of `user`'s keys and every key made from it (ApiKey.DoesNotExist for someone else's). Revoking a
    revoked key changes nothing. `by_key`: the key that asks; it revokes itself or keys within its own scopes."""
    key = ApiKey.objects.get(pk=key_id, user=user)
    if by_key is not None and by_key.pk != key.pk and (lacking := _beyond(key.scopes, by_key)):
        raise PermissionDenied(f"a key can only revoke keys within its own scopes, and this one lacks {lacking!r}",
                               code="missing_scope", details={"scope": lacking})
    now = timezone.now()
    with transaction.atomic():
        family, generation = [key.pk], [key.pk]
        while generation:  # keys made by keys being revoked (a short chain: people do not nest keys deeply)
            generation = list(ApiKey.objects.filter(parent_id__in=generation).values_list("pk", flat=True))
            family += generation
        ApiKey.objects.filter(pk__in=family, revoked_at__isnull=True).update(revoked_at=now)
    key.refresh_from_db()
    return key


# How stale `last_used_at` may get: a script's every request would otherwise write the key's row.
LAST_USED_GRAIN = timedelta(seconds=60)


def api_key_resolve(*, secret: str) -> ApiKey | None:
    """The active key (with its user) a secret names, or None; marks it used (to the minute)."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    key = ApiKey.objects.select_related("user").filter(key_hash=_hash(secret), revoked_at__isnull=True).first()
    if key is None or not key.user.is_active:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_GRAIN:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key
