"""Executing server commands: argument checks, the backend call off the event loop, and idempotency.

The server may send a command again (it timed out waiting, or the agent reconnected before it could
answer). A command id seen before is answered with the stored result, never redone: creating a MIG
instance twice would leak a slice. Executions run as their own tasks, not inside the connection that
received them, so a disconnect mid-command does not lose the result the retry will ask for.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from . import protocol
from .backends.base import Backend
from .errors import BackendError
from .runtime.base import NoRuntime, Runtime, WorkloadSpec

log = logging.getLogger(__name__)


def _arg(args: dict, key: str, kind: type | tuple, op: str) -> Any:
    value = args.get(key)
    if isinstance(value, bool) and kind is int:
        value = None  # True is an int to Python, not a slot number
    if not isinstance(value, kind):
        raise BackendError(protocol.E_BAD_FRAME, f"{op}: argument {key!r} has the wrong type")
    return value


_background: set[asyncio.Task] = set()


def _in_background(coro) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _start(runtime: Runtime, spec: WorkloadSpec) -> None:
    try:
        await asyncio.to_thread(runtime.start, spec)
    except BackendError as exc:  # reported to the server as the workload's failure, with the reason
        log.info("workload of lease %s failed: %s", spec.lease, exc.message)
    except Exception:
        log.exception("starting the workload of lease %s crashed", spec.lease)
        runtime.report(protocol.workload(lease=spec.lease, state="failed", at=time.time(),
                                         reason="the agent failed to start the container (see its log)"))


async def execute(backend: Backend, op: str, args: dict, runtime: Runtime | None = None) -> dict:
    """Run one validated command on the backend (or the runtime); returns its result dict or raises
    BackendError."""
    runtime = runtime or NoRuntime()
    if op == "ping":
        return {"pong": True}
    if op == "notice":
        # Forwarded to the host's operators through the log (e.g. a spot interruption deadline), and to the
        # lease's container when it has one (SIGTERM, or a notice file, as its buyer chose).
        log.warning("notice %s for %s: deadline %s", args.get("kind"), args.get("instance_uuid"),
                    args.get("deadline"))
        delivered = {}
        if isinstance(args.get("lease"), str):
            mode = args.get("mode") if args.get("mode") in protocol.NOTICE_MODES else "sigterm"
            delivered = await asyncio.to_thread(runtime.notice, args["lease"], mode, str(args["deadline"]),
                                                str(args["kind"]))
        return {"acknowledged": True, **delivered}
    if op == "start_workload":
        # A pull may take minutes: the command is answered at once, the container's states follow as
        # `workload` frames (pulling, starting, running, or failed with the engine's reason).
        spec = WorkloadSpec.from_command(_arg(args, "lease", str, op), _arg(args, "spec", dict, op))
        if isinstance(runtime, NoRuntime):
            runtime.start(spec)  # refused in the result: no engine here
        _in_background(_start(runtime, spec))
        return {"accepted": True, "runtime": runtime.name}
    if op == "stop_workload":
        return await asyncio.to_thread(runtime.stop, _arg(args, "lease", str, op),
                                       float(_arg(args, "grace_seconds", (int, float), op)))
    if op == "create_instance":
        return await asyncio.to_thread(backend.create_instance, _arg(args, "gpu_uuid", str, op),
                                       _arg(args, "profile", str, op), _arg(args, "start", int, op))
    if op == "destroy_instance":
        return await asyncio.to_thread(backend.destroy_instance, _arg(args, "gpu_uuid", str, op),
                                       _arg(args, "instance_uuid", str, op))
    if op == "set_busy":
        return await asyncio.to_thread(backend.set_busy, _arg(args, "gpu_uuid", str, op),
                                       _arg(args, "instance_uuid", str, op),
                                       _arg(args, "busy", (bool, int, float), op))
    if op == "inject_fault":
        xid = args.get("xid")
        return await asyncio.to_thread(backend.inject_fault, _arg(args, "gpu_uuid", str, op),
                                       _arg(args, "fault", str, op), xid)
    raise BackendError(protocol.E_NOT_SUPPORTED, f"unknown command {op!r}")


class CommandLog:
    """Recent command ids -> their running or finished execution (an LRU of `capacity` entries)."""

    def __init__(self, backend: Backend, *, capacity: int = 1024, runtime: Runtime | None = None):
        self.backend = backend
        self.runtime = runtime or NoRuntime()
        self.capacity = capacity
        self._entries: OrderedDict[str, asyncio.Task] = OrderedDict()
        self.executions = 0  # how many commands actually ran (tests check duplicates do not)

    async def answer(self, command_id: str, op: str, args: dict) -> dict:
        """The `result` frame for this command, executing it only the first time its id is seen."""
        task = self._entries.get(command_id)
        if task is not None:
            self._entries.move_to_end(command_id)
            log.info("command %s %s repeated: answering %s", command_id, op,
                     "when the first finishes" if not task.done() else "with the stored result")
        else:
            task = asyncio.get_running_loop().create_task(self._run(command_id, op, args))
            self._entries[command_id] = task
            self._evict()
        # shield: the connection that asked may drop; the execution and its stored result carry on.
        return await asyncio.shield(task)

    def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            oldest_id, oldest = next(iter(self._entries.items()))
            if not oldest.done():
                break  # never forget a command still running: its duplicate would be redone
            del self._entries[oldest_id]

    async def _run(self, command_id: str, op: str, args: dict) -> dict:
        self.executions += 1
        try:
            result = await execute(self.backend, op, args, self.runtime)
        except BackendError as exc:
            log.info("command %s %s failed: %s %s", command_id, op, exc.code, exc.message)
            return protocol.result_error(id=command_id, code=exc.code, message=exc.message)
        except Exception as exc:  # every command gets an answer, even one the backend crashed on
            log.exception("command %s %s crashed", command_id, op)
            return protocol.result_error(id=command_id, code=protocol.E_INTERNAL,
                                         message=f"{type(exc).__name__}: {exc}")
        log.info("command %s %s ok", command_id, op)
        return protocol.result_ok(id=command_id, result=result)
