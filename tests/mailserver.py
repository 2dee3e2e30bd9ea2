"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives: tests send through Django's SMTP backend
(or a live stack's) and read the messages as a mail client would."""
from __future__ import annotations

import contextlib
import email
import logging
import email.policy
import re
import threading
import time

from aiosmtpd.controller import Controller

from tests.e2e.livestack import free_port


class Mailbox:
    def __init__(self):
        self.messages: list[email.message.EmailMessage] = []
        self._lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's handler hook
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        with self._lock:
            self.messages.append(message)
        return "250 Message accepted for delivery"

    def to(self, address: str) -> list:
        with self._lock:
            return [m for m in self.messages if address.lower() in m["X-Envelope-To"].lower()]

    def wait_for(self, address: str, *, subject: str = "", timeout: float = 30.0, count: int = 1):
        """The `count`-th message to `address` whose subject contains `subject`, waiting for it (a deadline)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for m in self.to(address) if subject in m["Subject"]]
            if len(found) >= count:
                return found[count - 1]
            time.sleep(0.05)
        raise AssertionError(f"no message {count} to {address} with {subject!r} within {timeout} s; "
                             f"got {[m['Subject'] for m in self.messages]}")


def body(message) -> str:
    return message.get_body(preferencelist=("plain",)).get_content()


def link_in(message, path_part: str) -> str:
    """The first URL in the message's text that contains `path_part`."""
    for url in re.findall(r"https?://\S+", body(message)):
        if path_part in url:
            return url
    raise AssertionError(f"no link with {path_part!r} in:\n{body(message)}")


@contextlib.contextmanager
def smtp_server():
    """(mailbox, port) of an SMTP server listening on 127.0.0.1 for the duration."""
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every SMTP command at INFO
    box, port = Mailbox(), free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        controller.stop()
