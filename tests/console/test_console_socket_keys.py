"""Scripts on the console socket: `Authorization: Bearer <key>` on the handshake (no browser session, no Origin)
signs the socket in as the key's user when the key has the `read` scope; any other key is refused with 4401."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from config.asgi import application
from marketplace.products.apikeys import api_key_create, api_key_revoke
from tests.console.test_console_socket import running_lease

pytestmark = [pytest.mark.django_db(transaction=True)]


def socket(secret: str | None, header: str = "Bearer") -> WebsocketCommunicator:
    headers = [(b"authorization", f"{header} {secret}".encode())] if secret is not None else []
    return WebsocketCommunicator(application, "/ws/console/", headers=headers)


async def test_a_script_with_a_read_key_watches_its_lease_without_a_session_or_origin():
    buyer, lease, node, mine, _ = await running_lease()
    _, secret = await sync_to_async(api_key_create)(user=buyer, name="script", scopes=["read"])
    script = socket(secret)
    assert (await script.connect())[0]
    await script.send_json_to({"subscribe": {"lease": str(lease.pk)}})
    assert await script.receive_json_from(timeout=5) == {"type": "subscribed", "node": str(node.pk),
                                                         "lease": str(lease.pk)}
    await script.disconnect()


@pytest.mark.parametrize("case", ["unknown", "malformed", "revoked", "trade only"])
async def test_a_key_that_cannot_read_is_refused(case):
    buyer, *_ = await running_lease()
    key, secret = await sync_to_async(api_key_create)(user=buyer, name="script",
                                                      scopes=["trade"] if case == "trade only" else ["read"])
    if case == "revoked":
        await sync_to_async(api_key_revoke)(user=buyer, key_id=key.pk)
    script = {"unknown": socket("gpm_key_" + "x" * 43), "malformed": socket(secret, header="Token"),
              "revoked": socket(secret), "trade only": socket(secret)}[case]
    connected, code = await script.connect()
    assert not connected and code == 4401
    await script.disconnect()  # the refused consumer ends here, not in the event loop's teardown


async def test_a_browser_without_a_key_still_needs_its_origin():
    script = socket(None)
    connected, _ = await script.connect()
    assert not connected  # no Origin header: the session route's origin check refuses it
    await script.disconnect()
