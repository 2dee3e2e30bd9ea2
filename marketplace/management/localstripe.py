"""Run localstripe (a fake Stripe API server) on loopback for the demo and the tests; never in production.

localstripe's own CLI (`localstripe --port N`) listens on every interface and loads/saves its store in
/tmp/localstripe.pickle; this launcher runs the same aiohttp app bound to 127.0.0.1 with a store that
starts empty and stays in memory, so parallel runs do not share state.
"""
from __future__ import annotations

import importlib.util
import socket
import sys
import time
import urllib.parse
import urllib.request

_LAUNCH = (
    "import sys\n"
    "from aiohttp import web\n"
    "from localstripe.resources import store\n"
    "store.dump_to_disk = lambda: None\n"
    "from localstripe.server import app\n"
    "web.run_app(app, host='127.0.0.1', port=int(sys.argv[1]), print=None)\n"
)


def available() -> bool:
    """Whether the localstripe package is installed (requirements-dev.txt)."""
    return importlib.util.find_spec("localstripe") is not None


def argv(*, port: int, python: str | None = None) -> list[str]:
    """The command line that serves localstripe on 127.0.0.1:`port`."""
    return [python or sys.executable, "-c", _LAUNCH, str(port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_listening(*, port: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def register_webhook(*, api_base: str, url: str, secret: str, name: str = "gpumarket") -> None:
    """Tell localstripe to POST every event to `url`, signed with `secret` (its /_config/webhooks/ API)."""
    body = urllib.parse.urlencode({"url": url, "secret": secret}).encode()
    request = urllib.request.Request(f"{api_base.rstrip('/')}/_config/webhooks/{name}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.status != 200:
            raise RuntimeError(f"localstripe refused the webhook registration: HTTP {response.status}")
