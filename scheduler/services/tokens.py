"""Agent tokens: random, shown once, stored as a SHA-256 hash (they carry 256 bits, so a fast hash is fine)."""
import hashlib
import secrets

TOKEN_PREFIX = "gpm_node_"


def token_new() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
