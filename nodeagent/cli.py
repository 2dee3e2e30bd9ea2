"""Command line of `python -m nodeagent`: strict flags, backend choice, logging, signals."""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
from urllib.parse import urlparse

from . import __version__
from .backends.base import Backend
from .runtime.base import NoRuntime, Runtime

EXIT_NO_NVML = 2  # same as argparse's usage errors: the command cannot run as given here

log = logging.getLogger("nodeagent")


def _server_url(text: str) -> str:
    url = urlparse(text)
    if url.scheme not in ("ws", "wss") or not url.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ws:// or wss:// URL (e.g. ws://HOST:8000/ws/agent/)")
    try:
        url.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} has a bad port") from None
    return text


def _server_urls(text: str) -> list[str]:
    """One URL, or several separated by commas: the agent tries the next when one fails."""
    urls = [_server_url(part.strip()) for part in text.split(",") if part.strip()]
    if not urls:
        raise argparse.ArgumentTypeError(f"{text!r} names no server")
    return urls


def _seconds_between(low: float, high: float, what: str):
    """An argparse type: a number of seconds from `low` to `high`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be between {low:g} and {high:g} seconds, not {text}")
        return value
    return parse


def _simulate_spec(text: str) -> list[tuple[str, int]]:
    from .backends.simulated import SimulateSpecError, parse_simulate_spec
    try:
        return parse_simulate_spec(text)
    except SimulateSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share must be between 0 and 1, not {text}")
    return value


def _hostname(text: str) -> str:
    if not text or len(text) > 253 or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nodeagent",
        description="GPU Market node agent: reports this server's GPUs, carves MIG slices on command and "
                    "streams metrics to the marketplace.")
    parser.add_argument("--server", dest="servers", type=_server_urls, action="extend", metavar="URL[,URL...]",
                        help="agent gateway URL, e.g. ws://HOST:8000/ws/agent/ (default: $NODEAGENT_SERVER); repeat "
                             "it or separate URLs by commas to name several web processes: on a failure the agent "
                             "tries the next")
    parser.add_argument("--token", default=None,
                        help="this node's agent token (default: $NODEAGENT_TOKEN; prefer the variable, "
                             "command lines are visible to other users)")
    parser.add_argument("--simulate", type=_simulate_spec, metavar="MODEL:COUNT[,MODEL:COUNT...]",
                        help="run a simulated machine instead of NVML, e.g. h100-80gb:8,l4:2")
    parser.add_argument("--hostname", type=_hostname, help="name to report (default: this machine's)")
    parser.add_argument("--interval", type=_seconds_between(0.05, 3600, "interval"), default=1.0,
                        help="seconds between metrics frames until the server's welcome says otherwise")
    parser.add_argument("--seed", type=int, help="random seed of the simulated backend (reproducible runs)")
    parser.add_argument("--busy-on-create", type=_share, default=0.0, metavar="SHARE",
                        help="simulated backend: new instances run a workload at about this load (0..1; "
                             "default 0, idle until a set_busy command)")
    parser.add_argument("--load-file", metavar="PATH",
                        help="simulated backend: a file read again at every sample that sets the load of what runs "
                             "on the machine: a share (0.9) or JSON by GPU or MIG instance UUID ({\"*\": 0.1, "
                             "\"MIG-...\": 0.95}); write it to make a running machine busy or idle (tests, demos)")
    parser.add_argument("--state-file", metavar="PATH",
                        help="simulated backend: keep the machine's MIG instances and simulated containers in this "
                             "file, so that a restarted agent finds them as a real GPU server's would (default: none, "
                             "they end with the process; the demo passes one per node)")
    parser.add_argument("--create-seconds", type=_seconds_between(0, 600, "carving"), default=0.0, metavar="SECONDS",
                        help="simulated backend: how long carving a MIG instance takes (default 0); the instance "
                             "exists from the start, the answer comes at the end")
    parser.add_argument("--runtime", choices=["docker", "simulated", "none"],
                        help="what runs leases' containers: a Docker Engine API (Docker, or Podman's `podman system "
                             "service`), a simulated one, or none (default: simulated with --simulate, else docker)")
    parser.add_argument("--engine-url", default=None,
                        help="the engine's API (default: $DOCKER_HOST, else unix:///var/run/docker.sock)")
    parser.add_argument("--gpu-devices", choices=["cdi", "request", "none"], default=None,
                        help="how a container gets its GPU through the NVIDIA Container Toolkit: a CDI device "
                             "nvidia.com/gpu=<uuid> (default), a device request for the UUID, or none (default "
                             "with --simulate)")
    parser.add_argument("--bind-address", default="0.0.0.0",
                        help="address containers' ports are published on (default all)")
    parser.add_argument("--disk-limits", choices=["auto", "on", "off"], default="auto",
                        help="limit container disk where the storage driver supports it (auto: try, else run "
                             "without)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    return parser


def make_backend(args: argparse.Namespace) -> Backend:
    """The simulated backend when asked for, else NVML (raises NvmlUnavailable without a driver)."""
    if args.simulate:
        from .backends.simulated import SimulatedBackend
        return SimulatedBackend(args.simulate, hostname=args.hostname, seed=args.seed,
                                busy_on_create=args.busy_on_create, state=_state_file(args),
                                create_seconds=args.create_seconds, load_file=args.load_file)
    from .backends.nvml import NvmlBackend
    return NvmlBackend(hostname=args.hostname)


def _state_file(args: argparse.Namespace):
    from .sim_state import StateFile
    return StateFile(args.state_file) if args.state_file else None


def make_runtime(args: argparse.Namespace) -> Runtime:
    """The runtime asked for (or the default for the backend); raises EngineUnavailable for a silent engine."""
    kind = args.runtime or ("simulated" if args.simulate else "docker")
    if kind == "none":
        return NoRuntime()
    if kind == "simulated":
        from .runtime.simulated import SimulatedRuntime
        return SimulatedRuntime(seed=args.seed, state=_state_file(args))
    from .runtime.docker import DockerRuntime
    url = args.engine_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    devices = args.gpu_devices or ("none" if args.simulate else "cdi")
    return DockerRuntime(url, gpu_devices=devices, bind_address=args.bind_address, disk_limits=args.disk_limits)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.servers:
        try:
            args.servers = _server_urls(os.environ.get("NODEAGENT_SERVER", ""))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"no server: pass --server URL or set NODEAGENT_SERVER ({exc})")
    token = args.token if args.token is not None else os.environ.get("NODEAGENT_TOKEN", "")
    if not token.strip():
        parser.error("no token: pass --token or set NODEAGENT_TOKEN")
    if args.seed is not None and not args.simulate:
        parser.error("--seed only applies with --simulate")
    if args.busy_on_create and not args.simulate:
        parser.error("--busy-on-create only applies with --simulate")
    for flag, given in (("--state-file", args.state_file), ("--create-seconds", args.create_seconds),
                        ("--load-file", args.load_file)):
        if given and not args.simulate:
            parser.error(f"{flag} only applies with --simulate (a real GPU keeps its instances itself)")
    if args.runtime == "simulated" and not args.simulate:
        parser.error("--runtime simulated only applies with --simulate (real GPUs run real containers)")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from .backends.nvml import NvmlUnavailable
    try:
        backend = make_backend(args)
    except NvmlUnavailable as exc:
        print(f"NVML is not available on this machine ({exc}): run on a GPU server or use "
              f"--simulate MODEL:COUNT", file=sys.stderr)
        return EXIT_NO_NVML
    try:
        from .runtime.docker import EngineUnavailable
        try:
            runtime = make_runtime(args)
        except EngineUnavailable as exc:
            print(f"{exc}: start the engine (e.g. `podman system service --time=0 unix:///run/podman.sock`), "
                  f"point --engine-url at it, or run without containers: --runtime none", file=sys.stderr)
            return EXIT_NO_NVML
        log.info("containers run on %s", getattr(runtime, "engine", runtime.name))
        try:
            return asyncio.run(_serve(backend, runtime, servers=args.servers, token=token.strip(),
                                      interval=args.interval))
        finally:
            runtime.close()
    finally:
        backend.close()


async def _serve(backend: Backend, runtime: Runtime, *, servers: list[str], token: str, interval: float) -> int:
    from .client import Agent
    agent = Agent(backend, server=servers, token=token, interval=interval, runtime=runtime)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, agent.stop)
        except (NotImplementedError, RuntimeError):  # not on this platform / not the main thread
            pass
    return await agent.run()
