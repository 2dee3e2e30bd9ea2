"""The websocket protocol class the web process runs under uvicorn: `--ws config.wsprotocol:WebSocketProtocol`.

uvicorn's `websockets-sansio` class (0.54) hands the upgrade request to the websockets library's parser. When
the request is over the library's limits (a header line over 8 KiB, more than 128 headers, a request line
too long) or is not HTTP at all, the parser stops and queues its answer (431, 414, or just the end of the
stream), but uvicorn neither writes that answer nor closes the connection: the client waits forever. A
20 KB `Authorization` header on the agent route hung that way. This class writes the answer and closes.
"""
from __future__ import annotations

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.handshake_initiated or self.conn.handshake_exc is None or self.transport.is_closing():
            return
        answer = b"".join(self.conn.data_to_send())  # websockets' 431 or 414, where it wrote one
        if not answer.strip():  # not an HTTP request: websockets only ends the stream
            answer = self.conn.reject(400, "Failed to open a WebSocket connection: not a valid HTTP request.\n"
                                      ).serialize()
        self.transport.write(answer)
        self.transport.close()
