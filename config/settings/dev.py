"""The demo (`make demo`) and local development: the production settings with what a laptop needs and nothing
else. DEBUG stays off here too (DJANGO_DEBUG=1 turns it on for a developer who wants Django's technical pages;
never in production): the demo's error pages are the product's own, not Django's 404 that lists every URL pattern.
"""
import os
import secrets
from pathlib import Path


def _demo_secret_key() -> str:
    """A random secret made once per var/ folder and kept there, so the demo's processes (web, worker, beat) share
    it and sessions survive a restart; never a key written in the repository."""
    var = Path(os.environ.get("GPUMARKET_VAR_DIR") or Path(__file__).resolve().parents[2] / "var")
    path = var / "demo-secret-key"
    if not path.exists():
        var.mkdir(parents=True, exist_ok=True)
        fresh = var / f".demo-secret-key.{os.getpid()}"
        fresh.write_text(secrets.token_urlsafe(50))
        try:
            os.link(fresh, path)  # atomic: of processes starting together, the first one's key wins
        except FileExistsError:
            pass
        finally:
            fresh.unlink()
    return path.read_text().strip()


if not os.environ.get("DJANGO_SECRET_KEY"):
    os.environ["DJANGO_SECRET_KEY"] = _demo_secret_key()

from .base import *  # noqa: E402,F401,F403

# The demo's webhooks (a script's listener on this machine) may go to loopback; production refuses them (SSRF).
WEBHOOKS_ALLOW_LOOPBACK = True
