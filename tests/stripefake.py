"""A real localstripe process for the session, its webhooks captured on a loopback server (`fake_stripe`), and
`stripe_on`: the settings pointing at it. Registered as fixtures by tests/conftest.py."""
from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from marketplace.management import localstripe

GOOD_CARD = "4242424242424242"
DECLINED_CARD = "4000000000000341"  # localstripe declines this one when charged (4000000000000002 only on attach)
WEBHOOK_SECRET = "whsec_test_" + uuid.uuid4().hex


class _Deliveries:
    """localstripe's real webhook deliveries, captured on a loopback server so a test can replay them."""

    def __init__(self):
        self.items: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def wait_for(self, event_type: str, intent_id: str, timeout: float = 15.0) -> tuple[str, bytes]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for signature, body in self.items:
                    event = json.loads(body)
                    if event["type"] == event_type and event["data"]["object"]["id"] == intent_id:
                        return signature, body
            time.sleep(0.05)
        raise AssertionError(f"localstripe delivered no {event_type} for {intent_id}")


@pytest.fixture(scope="session")
def fake_stripe():
    """A real localstripe on a free loopback port for the session, its webhooks captured; killed at the end."""
    if not localstripe.available():
        pytest.skip("localstripe is not installed (pip install -r requirements-dev.txt)")
    deliveries = _Deliveries()

    class Capture(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with deliveries.lock:
                deliveries.items.append((self.headers["Stripe-Signature"], body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    capture = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=capture.serve_forever, daemon=True).start()
    port = localstripe.free_port()
    proc = subprocess.Popen(localstripe.argv(port=port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not localstripe.wait_until_listening(port=port):
            raise RuntimeError(f"localstripe did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
        base = f"http://127.0.0.1:{port}"
        localstripe.register_webhook(api_base=base, url=f"http://127.0.0.1:{capture.server_port}/hook",
                                     secret=WEBHOOK_SECRET)
        yield base, deliveries
    finally:
        proc.kill()
        proc.wait(timeout=10)
        capture.shutdown()


@pytest.fixture
def stripe_on(settings, fake_stripe):
    base, deliveries = fake_stripe
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_local"
    settings.STRIPE_API_BASE = base
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    return deliveries
