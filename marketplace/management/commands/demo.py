"""`manage.py demo`: migrate, seed, then run web + worker + beat + simulated agents until Ctrl-C."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from marketplace.services.demo import DEMO_USERS, demo_seed


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) != 0


def _wait_for_port(host: str, port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not _port_free(host, port):
            return True
        time.sleep(0.2)
    return False


class Command(BaseCommand):
    help = "Run the whole product locally: web, Celery worker and beat, and simulated GPU servers."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-agents", action="store_true", help="start no simulated agents")

    def handle(self, *args, host, port, no_agents, **opts):
        if not _port_free(host, port):
            raise CommandError(f"port {port} on {host} is in use: stop what runs there or pass --port")
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        nodes = demo_seed()
        py = sys.executable
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        logs = settings.VAR_DIR / "logs"
        logs.mkdir(exist_ok=True)
        procs: list[tuple[str, subprocess.Popen]] = []

        def start(name: str, argv: list[str], extra_env: dict | None = None) -> None:
            out = open(logs / f"{name}.log", "ab")
            procs.append((name, subprocess.Popen(argv, env={**env, **(extra_env or {})}, stdout=out,
                                                 stderr=subprocess.STDOUT, start_new_session=True)))

        start("web", [py, "-m", "uvicorn", "config.asgi:application", "--host", host, "--port", str(port),
                      "--ws", "websockets-sansio", "--log-level", "warning"])
        start("worker", [py, "-m", "celery", "-A", "config", "worker", "--pool", "solo", "--without-mingle",
                         "--without-gossip", "--loglevel", "INFO"])
        start("beat", [py, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO"])
        if not _wait_for_port(host, port, time.monotonic() + 30):
            self._stop(procs)
            raise CommandError(f"the web server did not start; see {logs / 'web.log'}")
        if not no_agents:
            for spec, node, token in nodes:
                start(f"agent-{spec.name}", [py, "-m", "nodeagent", "--server", f"ws://{host}:{port}/ws/agent/",
                                             "--simulate", spec.simulate, "--hostname", f"{spec.name}.local"],
                      {"NODEAGENT_TOKEN": token})
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\nGPU Market is running at {url}"))
        for username, password, staff in DEMO_USERS:
            self.stdout.write(f"  log in as {username:<9} password {password}{'   (operator: ' + url + 'admin/)' if staff else ''}")
        self.stdout.write(f"  simulated servers: " + ", ".join(f"{s.name} ({s.simulate})" for s, _, _ in nodes))
        self.stdout.write(f"  API docs: {url}api/docs/   logs: {logs}/\nPress Ctrl-C to stop everything.\n")
        try:
            while True:
                for name, proc in procs:
                    if proc.poll() is not None:
                        raise CommandError(f"{name} exited with {proc.returncode}; see {logs / (name + '.log')}")
                time.sleep(1)
        except KeyboardInterrupt:
            self.stdout.write("\nstopping…")
        finally:
            self._stop(procs)
        self.stdout.write("stopped.")

    @staticmethod
    def _stop(procs) -> None:
        for _, proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
