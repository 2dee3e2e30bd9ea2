"""ASGI entry point: HTTP through Django; websockets for agents (token auth) and the console (session)."""
import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from marketplace.api.auth import ApiKeyWebsocketAuth, bearer_secret  # noqa: E402
from marketplace.consumers import ConsoleConsumer  # noqa: E402
from scheduler.gateway.consumer import AgentConsumer  # noqa: E402
from scheduler.gateway.lifespan import lifespan  # noqa: E402
from scheduler.gateway.relay import RELAY  # noqa: E402

# Agents are not browsers: they send no Origin and authenticate with their node token, so their route
# skips the origin check; console sockets ride the browser session and must come from our own pages, or carry
# an API key in `Authorization: Bearer` (scripts; a browser cannot set that header).
agent_routes = URLRouter([path("ws/agent/", AgentConsumer.as_asgi())])
console_urls = [path("ws/console/", ConsoleConsumer.as_asgi())]
console_routes = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(console_urls)))
script_routes = ApiKeyWebsocketAuth(URLRouter(console_urls))


async def websocket_router(scope, receive, send):
    if scope["path"].startswith("/ws/agent/"):
        return await agent_routes(scope, receive, send)
    if bearer_secret(scope) is not None:
        return await script_routes(scope, receive, send)
    return await console_routes(scope, receive, send)


router = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket_router, "lifespan": lifespan})


async def application(scope, receive, send):
    if scope["type"] != "lifespan":
        # Every web process relays the outbox, also one that serves only HTTP: on Redis it holds what a process
        # could not send while Redis was away (scheduler/services/events.py). Started once, on its event loop.
        RELAY.ensure_running()
    return await router(scope, receive, send)

# What the process loaded to start (Django, the apps, their modules) lives as long as it does: keep it out of the
# collector's full passes, which otherwise walk it on every one (a web process holding the market's pool
# snapshot of 10,000 GPUs paused ~200 ms for a full pass; docs/performance.md).
gc.collect()
gc.freeze()
