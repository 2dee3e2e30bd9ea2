"""A local webhook receiver: `hook_url` serves `Hook` on a loopback port for one test (the SSRF guard told to allow
loopback) and `Hook.received` keeps (content type, JSON body) of each POST. Registered by tests/conftest.py."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


class Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook_url(settings):
    settings.WEBHOOKS_ALLOW_LOOPBACK = True  # a loopback webhook is allowed only in the demo (SSRF guard otherwise)
    server = HTTPServer(("127.0.0.1", 0), Hook)
    Hook.received = []
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()
