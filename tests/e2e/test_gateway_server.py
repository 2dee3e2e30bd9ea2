"""The agent gateway on a real uvicorn process, run as the demo runs it: an upgrade request over the header
limits is answered and closed (it used to hang forever), and a socket the gateway closed sends nothing more
(the server logged "Unexpected ASGI message 'websocket.send', after sending 'websocket.close'" for frames
already read when it closed)."""
from __future__ import annotations

import json
import socket

import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.sync.client import connect
from websockets.uri import parse_uri

from nodeagent import protocol
from tests.agentframes import hello_from, sim_backend
from tests.e2e.livestack import LiveStack

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = LiveStack(tmp_path_factory.mktemp("gateway"), nodes=[("gw-l4", "l4:1")], celery=False, start_agents=False)
    with s.running():
        yield s


def upgrade_answer(port: int, path: str, extra_headers: str) -> bytes:
    """Send a websocket upgrade request on a raw socket; everything the server answers until it closes (a
    server that never answers fails the read with a timeout: the hang this guards against)."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                   f"{extra_headers}\r\n").encode("latin-1"))
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("path", ["/ws/agent/", "/ws/console/"])
@pytest.mark.parametrize("headers", [
    "Authorization: Bearer " + "x" * 20_000 + "\r\n",  # the fuzzer's 20 KB token
    "".join(f"X-Filler-{i}: v\r\n" for i in range(130)),  # more header lines than the parser takes
], ids=["20KB-authorization", "130-headers"])
def test_an_upgrade_request_over_the_header_limits_is_answered_431_and_closed(stack, path, headers):
    answer = upgrade_answer(stack.port, path, headers)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]


def test_an_ordinary_upgrade_with_a_bad_token_still_reaches_the_gateway(stack):
    with connect(f"ws://127.0.0.1:{stack.port}/ws/agent/", open_timeout=10,
                 additional_headers={"Authorization": "Bearer gpm_node_not-a-token"}) as ws:
        assert json.loads(ws.recv(timeout=10))["code"] == protocol.E_UNAUTHORISED
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 4401


class RawAgent:
    """An agent socket driven by hand (websockets' sans-I/O client over a plain socket), so that it can hold
    back its answer to the server's close and keep the server's consumer alive after the close."""

    def __init__(self, port: int, token: str):
        self.proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws/agent/"))
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        request = self.proto.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        self.proto.send_request(request)
        self._flush()
        assert isinstance(self.read_event(), Response)

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.proto.data_to_send()))

    def send(self, *texts: str) -> None:
        """Frames written at once: the server reads them in one go and queues them all for the consumer."""
        for text in texts:
            self.proto.send_text(text.encode())
        self._flush()

    def read_event(self):
        while True:
            events = self.proto.events_received()
            if events:
                self.pending = events[1:]
                return events[0]
            if getattr(self, "pending", None):
                event, self.pending = self.pending[0], self.pending[1:]
                return event
            data = self.sock.recv(65536)
            self.proto.receive_data(data) if data else self.proto.receive_eof()
            if not data:
                raise EOFError("the server closed the connection")

    def answer_close_and_wait_for_the_end(self) -> None:
        self._flush()  # the close reply the protocol queued
        while self.sock.recv(65536):
            pass
        self.sock.close()


def test_frames_queued_behind_the_close_get_no_answer_on_the_wire_or_in_the_servers_log(stack):
    node = stack.seed["nodes"][0]
    agent = RawAgent(stack.port, node["token"])
    agent.send(protocol.encode(hello_from(sim_backend("l4:1", hostname="raw"))))
    welcome = agent.read_event()
    assert isinstance(welcome, Frame) and json.loads(welcome.data)["type"] == "welcome"
    # Ten malformed frames close the socket (4400); the two behind them were already read and queued.
    agent.send(*["{"] * 12)
    frames = [agent.read_event()]
    while frames[-1].opcode != Opcode.CLOSE:
        frames.append(agent.read_event())
    assert [json.loads(f.data)["code"] for f in frames[:-1]] == [protocol.E_BAD_FRAME] * 10
    agent.answer_close_and_wait_for_the_end()
    log = (stack.tmp / "web.log").read_text(errors="replace")
    assert "Unexpected ASGI message" not in log and "Exception in ASGI application" not in log, log[-3000:]
