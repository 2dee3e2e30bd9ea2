"""`manage.py demo`: migrate, seed, then run web + worker + beat + simulated agents until Ctrl-C."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from marketplace.management import localstripe
from marketplace.management.supervisor import Child, Supervisor, command_line
from marketplace.products.accounts.mail import where_unsent_mail_goes
from marketplace.products.demo import DEMO_USERS, demo_seed


# An agent that exits with these codes cannot be helped by starting it again (nodeagent/client.py).
AGENT_FINAL = {3: "the server refused its node token (rotated, or its node deleted)",
               4: "another agent connected with this node's token and replaced it"}


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def _wait_for_port(host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not _port_free(host, port):
            return True
        time.sleep(0.2)
    return False


def _loopback(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


DEMO_PAYOUTS = {"PAYOUT_TRANSFERS": "simulated", "PAYOUT_HOLD_DAYS": "0", "PAYOUT_MINIMUM": "1.00"}


def mail_said() -> str:
    """Where the demo's e-mails (sign-up links, password resets) go, so a visitor can follow the link."""
    where = where_unsent_mail_goes()
    if where is None:
        return f"e-mail is sent through {settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
    return f"e-mail is not sent: {where} (open it for the confirmation link; set EMAIL_HOST to send mail)"


class Command(BaseCommand):
    help = "Run the whole product locally: web, Celery worker and beat, and simulated GPU servers."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="start no simulated agents")
        parser.add_argument("--engine-url", default=os.environ.get("GPUMARKET_ENGINE_URL", ""),
                            help="a container engine's API (Docker, or `podman system service`), e.g. "
                                 "unix:///run/podman/podman.sock: the simulated servers then run buyers' containers "
                                 "there for real (default $GPUMARKET_ENGINE_URL; none: a simulated runtime)")
        parser.add_argument("--stripe-port", type=int, default=8420,
                            help="loopback port of the local fake Stripe (localstripe) when STRIPE_SECRET_KEY is unset")

    def handle(self, *args, host, port, no_agents, stripe_port, engine_url, **opts):
        if not _port_free(host, port):
            raise CommandError(f"port {port} on {host} is in use: stop what runs there or pass --port")
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        nodes = demo_seed(public_address=_loopback(host))
        py = sys.executable
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(exist_ok=True)
        supervisor = Supervisor(self._say, base_env=env)

        def start(name: str, argv: list[str], extra_env: dict | None = None, **how) -> None:
            supervisor.start(Child(name, argv, logs / f"{name}.log", env=extra_env or {}, **how))

        # `kill` or a closed terminal must stop the children too, not only Ctrl-C.
        def _terminate(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGHUP, _terminate)
        # Everything started is stopped however this ends: Ctrl-C while the web server is still starting,
        # a child that fails to start, or Ctrl-C later (the children run in their own sessions, so the
        # terminal's SIGINT does not reach them). Meanwhile a child that exits is started again.
        try:
            fake_stripe = not settings.STRIPE_SECRET_KEY
            if fake_stripe:
                # No Stripe account configured: payments go to localstripe on loopback, with demo keys and a
                # webhook secret made up for this run, handed to web/worker/beat through their environment.
                if not localstripe.available():
                    raise CommandError("localstripe is not installed: pip install -r requirements-dev.txt")
                if not _port_free("127.0.0.1", stripe_port):
                    raise CommandError(f"port {stripe_port} is in use: stop what runs there or pass --stripe-port")
                stripe_base = f"http://127.0.0.1:{stripe_port}"
                supervisor.base_env.update({"STRIPE_SECRET_KEY": "sk_test_local", "STRIPE_PUBLISHABLE_KEY": "pk_test_local",
                                            "STRIPE_API_BASE": stripe_base,
                                            "STRIPE_WEBHOOK_SECRET": "whsec_demo_" + secrets.token_hex(16)})
                # localstripe has no Connect: an approved payout is paid by a simulated transfer, and the demo's
                # small earnings are payable at once (docs/payments.md, Payouts); the environment may say otherwise.
                for name, value in DEMO_PAYOUTS.items():
                    supervisor.base_env.setdefault(name, value)

                def register_webhook() -> str:
                    # localstripe keeps its webhooks in memory: registered at start and again after each restart.
                    if not localstripe.wait_until_listening(port=stripe_port):
                        raise CommandError(f"localstripe did not start; see {logs / 'localstripe.log'}")
                    localstripe.register_webhook(api_base=stripe_base,
                                                 url=f"http://{_loopback(host)}:{port}/stripe/webhook/",
                                                 secret=supervisor.base_env["STRIPE_WEBHOOK_SECRET"])
                    return "localstripe: the payment webhook is registered again"

                start("localstripe", localstripe.argv(port=stripe_port, python=py), after_restart=register_webhook)
                register_webhook()
            # /metrics for a Prometheus on this machine: a token made up for this run unless one is set.
            supervisor.base_env.setdefault("METRICS_TOKEN", settings.METRICS_TOKEN or "demo-" + secrets.token_hex(12))
            start("web", [py, "-m", "uvicorn", "config.asgi:application", "--host", host, "--port", str(port),
                          "--ws", "config.wsprotocol:WebSocketProtocol", "--log-level", "warning"])
            start("worker", [py, "-m", "celery", "-A", "config", "worker", "--pool", "solo", "--without-mingle",
                             "--without-gossip", "--loglevel", "INFO"])
            start("beat", [py, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO"])
            if not _wait_for_port(host, port, time.monotonic() + 30):
                raise CommandError(f"the web server did not start; see {logs / 'web.log'}")
            # Buyers' containers: on the engine given (its published ports on loopback), else simulated.
            runtime = (["--runtime", "docker", "--engine-url", engine_url, "--gpu-devices", "none",
                        "--bind-address", _loopback(host)] if engine_url else ["--runtime", "simulated"])
            if not no_agents:
                for spec, node, token in nodes:
                    argv = [py, "-m", "nodeagent", "--server", f"ws://{host}:{port}/ws/agent/", "--simulate",
                            spec.simulate, "--hostname", f"{spec.name}.local", "--busy-on-create", "0.8",
                            # Its MIG instances and containers outlive the agent, as a real server's do.
                            "--state-file", str(settings.VAR_DIR / "agents" / spec.name / "state.json"), *runtime]
                    start(f"agent-{spec.name}", argv, {"NODEAGENT_TOKEN": token}, final=AGENT_FINAL,
                          by_hand=command_line(argv, {"NODEAGENT_TOKEN": "<the node's new token>"}))
            url = f"http://{host}:{port}/"
            self.stdout.write(self.style.SUCCESS(f"\nGPU Market is running at {url}"))
            for username, password, staff in DEMO_USERS:
                self.stdout.write(f"  log in as {username:<9} password {password}{'   (operator: ' + url + 'admin/)' if staff else ''}")
            self.stdout.write("  simulated servers and the runtime of each agent's containers:")
            for spec, _, _ in nodes:
                runtime_said = (f"docker (real containers on {engine_url})" if engine_url else
                                "simulated (pass --engine-url, or set GPUMARKET_ENGINE_URL, for real containers)")
                self.stdout.write(f"    {spec.name} ({spec.simulate}): "
                                  f"{'no agent started' if no_agents else runtime_said}")
            if fake_stripe:
                self.stdout.write(f"  payments: local fake Stripe at {supervisor.base_env['STRIPE_API_BASE']} (card 4242424242424242"
                                  " pays, 4000000000000341 is declined)")
                if supervisor.base_env["PAYOUT_TRANSFERS"] == "simulated":
                    self.stdout.write("  payouts: approved in the admin, paid by a simulated transfer (no Stripe Connect"
                                      " in the demo)")
            self.stdout.write(f"  sign up at {url}signup/: {mail_said()}")
            self.stdout.write(f"  Prometheus: {url}metrics with 'Authorization: Bearer {supervisor.base_env['METRICS_TOKEN']}'"
                              " (docs/operations.md has a scrape config and a Grafana dashboard)")
            self.stdout.write(f"  API docs: {url}api/docs/   logs: {logs}/\nPress Ctrl-C to stop everything.\n")
            try:
                while True:
                    supervisor.check()
                    time.sleep(1)
            except KeyboardInterrupt:
                self.stdout.write("\nstopping…")
        finally:
            supervisor.stop_all()
        self.stdout.write("stopped.")

    def _say(self, line: str) -> None:
        self.stdout.write(f"[{time.strftime('%H:%M:%S')}] {line}")
