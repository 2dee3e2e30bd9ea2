"""The web process's websocket protocol class answers a handshake it cannot parse and closes (uvicorn's own
leaves the client hanging), and every command line that runs the web process uses it."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from config.wsprotocol import WebSocketProtocol

ROOT = Path(__file__).resolve().parents[2]


class Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.written, self.closed = b"", False

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


async def never_called(scope, receive, send):  # the request never reaches the application
    raise AssertionError("the application was called")


UPGRADE = ("GET /ws/agent/ {version}\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n")


@pytest.mark.parametrize("request_text, status", [
    (UPGRADE.format(version="HTTP/1.1", extra="Authorization: Bearer " + "x" * 20_000 + "\r\n"), b"431"),
    (UPGRADE.format(version="HTTP/1.1", extra="".join(f"X-{i}: v\r\n" for i in range(130))), b"431"),
    ("GET /ws/agent/ HTTP/1.1\r\nHost: 127.0.0.1\r\nA header line without a colon\r\n\r\n", b"400"),
    ("NONSENSE\r\n\r\n", b"400"),  # websockets only ends the stream: the class answers it itself
])
async def test_a_handshake_the_parser_refuses_is_answered_and_closed(request_text, status):
    config = Config(app=never_called, ws=WebSocketProtocol, log_level="warning")
    config.load()
    written = {}
    for cls in (WebSocketsSansIOProtocol, WebSocketProtocol):
        conn = cls(config=config, server_state=ServerState(), app_state={})
        transport = Transport()
        conn.connection_made(transport)
        conn.data_received(request_text.encode("latin-1"))
        written[cls] = transport.written, transport.closed
    assert written[WebSocketsSansIOProtocol] == (b"", False)  # uvicorn's own: no answer, left open
    answer, closed = written[WebSocketProtocol]
    assert answer.startswith(b"HTTP/1.1 " + status) and closed, answer[:200]


def test_every_command_line_running_the_web_process_uses_this_protocol_class():
    places = [p for pattern in ("**/*.py", "**/*.md", "Makefile", ".ci/*", "deploy/*") for p in ROOT.glob(pattern)
              if ".venv" not in p.parts and p.is_file()]
    offenders = []
    for path in places:
        text = path.read_text(errors="replace")
        for match in re.finditer(r"config\.asgi:application", text):
            command = text[match.start():match.start() + 400].split("\n\n")[0]
            ws = re.search(r"--ws[\"',\s]+([\w.:-]+)", command)
            if ws and ws.group(1) != "config.wsprotocol:WebSocketProtocol":
                offenders.append(f"{path.relative_to(ROOT)}: --ws {ws.group(1)}")
    assert not offenders, offenders
