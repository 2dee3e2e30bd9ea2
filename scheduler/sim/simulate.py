"""The discrete-event replay: arrivals, completions, the wait queue and the metrics, for one policy.

A policy is anything with `decide(request) -> Decision` working on a pool with `allocate(decision,
request)` and `release(gpu_uuid, lease_id)` (scheduler.core.engine.Pool); `policies.py` builds them.

Events at one instant are handled together: completions first (a GPU freed at t can take a job arriving
at t), then arrivals, then one scheduling pass. A pass only retries request shapes that could have changed
fate: a shape that failed since the last release fails again (capacity only shrank), which keeps a pass
over a long queue to a handful of decide calls.

With a `HostLedger` (host CPU and memory modelled), a GPU job also needs its CPU and memory on the node
its GPUs are on: a decision that lands on a node without them is retried with that node out of the pool for
the rest of the decision, so every policy places GPUs its own way among the nodes that can host the pod.
CPU-only jobs take CPU and memory on the roomiest node (`HostLedger.roomiest`), the same for every policy.
Their waits are kept apart (`cpu_waits`): the GPU metrics stay about GPU jobs.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from scheduler.core.model import Decision, NodeState, Placement, Request

from .frag import FragMeter
from .mapping import Demand, priority_for
from .policies import NoPreemption
from .metrics import Levels, TimeAverages, percentile
from .pool import HostLedger
from .queue import JobQueue, Queued
from .trace import Pod

COMPLETION, ARRIVAL = 0, 1  # event order at one instant: free first


@dataclass
class Job:
    index: int
    pod: Pod
    demand: Demand | None  # None: a CPU-only pod (replayed only when host resources are modelled)
    arrival: float  # after --load compression
    start: float | None = None
    placements: list[Placement] = field(default_factory=list)
    host_node: str | None = None  # where its host CPU and memory are booked

    @property
    def lease_id(self) -> str:
        return f"job-{self.index}"


def request_for(job: Job) -> Request:
    d = job.demand
    assert d is not None, "a CPU-only job asks the engine for nothing"
    return Request(models=d.models, memory_gb=d.memory_gb, compute_slices=d.compute_slices,
                   whole_gpu=d.whole_gpu, gpu_count=d.gpu_count, mode="on_demand", priority=d.priority,
                   lease_id=job.lease_id)


# (nodes) -> (pool, policy): every run gets a fresh pool built from fresh nodes.
PolicyFactory = Callable[[list[NodeState]], tuple[Any, Any]]


@dataclass
class RunResult:
    policy: str
    jobs: int  # GPU jobs
    cpu_jobs: int = 0  # CPU-only jobs (host resources modelled)
    cpu_started: int = 0
    cpu_waits: list[float] = field(default_factory=list)
    started: int = 0
    completed: int = 0  # finished by the end of the drain
    completed_in_window: int = 0  # finished inside the metric window
    unschedulable: Counter = field(default_factory=Counter)  # reason -> jobs that fit no GPU even when empty
    never_started: int = 0
    waits: list[float] = field(default_factory=list)
    placed_as: Counter = field(default_factory=Counter)  # "470 milli -> a100-80gb 3g.40gb" -> jobs
    decide_calls: int = 0
    decide_seconds: float = 0.0
    averages: TimeAverages | None = None
    starts: dict[int, float] = field(default_factory=dict)  # job index -> start time (for tests)

    def wait_percentile(self, p: float) -> float:
        return percentile(self.waits, p)

    @property
    def decisions_per_second(self) -> float:
        return self.decide_calls / self.decide_seconds if self.decide_seconds > 0 else 0.0


def _top_reason(decision: Decision) -> str:
    if not decision.reasons:
        return "no GPU in the pool"
    reason, _ = max(decision.reasons.items(), key=lambda kv: (kv[1], kv[0]))
    return reason


class Replay:
    def __init__(self, name: str, factory: PolicyFactory, nodes: list[NodeState], empty_nodes: list[NodeState],
                 jobs: list[Job], *, window: tuple[float, float], head_protect_s: float | None,
                 frag: FragMeter, host: HostLedger | None = None) -> None:
        self.pool, self.policy = factory(nodes)
        # A second pool that stays empty: a shape that fails there can never run, so it is counted as
        # unschedulable at arrival instead of waiting in the queue for ever.
        self.empty_pool, self.empty_policy = factory(empty_nodes)
        # Failure reasons are only read from the empty-pool probe; policies.NoPreemption can skip them live.
        self._quiet: dict[str, bool] = {"explain": False} if isinstance(self.policy, NoPreemption) else {}
        self.eligible_nodes: dict[tuple, list[str]] = {}
        # The engine's Pool owns deep copies of the nodes: read GPU state through it, never through `nodes`.
        self.gpus = {g.uuid: self.pool.gpu(g.uuid) for n in nodes for g in n.gpus}
        self.capacity = len(self.gpus)
        self.jobs = jobs
        self.queue: JobQueue[Job] = JobQueue(head_protect_s=head_protect_s)
        self.frag = frag
        self.levels = Levels(fragmented=sum(frag.of(g) for g in self.gpus.values()))
        self.host = host
        cpu_jobs = sum(1 for j in jobs if j.demand is None)
        self.result = RunResult(policy=name, jobs=len(jobs) - cpu_jobs, cpu_jobs=cpu_jobs,
                                averages=TimeAverages(self.capacity, window_end=window[1],
                                                      window_start=window[0]))
        self.events: list[tuple[float, int, int, Job]] = []
        self.never_fits: dict[tuple, str | None] = {}  # shape -> reason it fits no empty pool, or None
        self.version = 0  # bumped on every release; a failure is only final within one version
        self.failed: set[tuple] = set()  # shapes that failed at the current version
        self.queued_shapes: Counter = Counter()
        self.cpu_queued = 0  # CPU-only jobs in the queue: not counted in the GPU queue length
        self.reserved: str | None = None  # the node a starving head waits for, during a pass

    # --- pool operations -------------------------------------------------------------------------

    def _decide_once(self, job: Job) -> Decision:
        t0 = time.perf_counter()
        decision = self.policy.decide(request_for(job), **self._quiet)
        self.result.decide_seconds += time.perf_counter() - t0
        self.result.decide_calls += 1
        return decision

    def _decide(self, job: Job) -> Decision:
        decision = self._decide_once(job)
        host = self.host
        if host is None or not decision.ok:
            return decision
        cpu, memory = job.pod.cpu_milli, job.pod.memory_mib
        barred: list[str] = []
        try:
            # A node without the pod's host CPU or memory is taken out of the pool (as if cordoned) and the
            # policy asked again, until it picks a node that can host the pod or nothing fits.
            while decision.ok and not host.fits(decision.placements[0].node_id, cpu, memory):
                node_id = decision.placements[0].node_id
                self.pool.set_node(node_id, online=False)
                barred.append(node_id)
                decision = self._decide_once(job)
        finally:
            for node_id in barred:
                self.pool.set_node(node_id, online=True)
        return decision

    def _touch(self, uuids: set[str], sign: int) -> None:
        for u in uuids:
            self.levels.fragmented += sign * self.frag.of(self.gpus[u])

    def _start_cpu_only(self, job: Job, node_id: str, now: float) -> None:
        assert self.host is not None
        self.host.take(node_id, job.pod.cpu_milli, job.pod.memory_mib)
        job.start, job.host_node = now, node_id
        self.result.cpu_started += 1
        self.result.cpu_waits.append(now - job.arrival)
        heapq.heappush(self.events, (now + job.pod.runtime, COMPLETION, job.index, job))

    def _start(self, job: Job, decision: Decision, now: float) -> None:
        if self.host is not None:
            job.host_node = decision.placements[0].node_id
            self.host.take(job.host_node, job.pod.cpu_milli, job.pod.memory_mib)
        touched = {p.gpu_uuid for p in decision.placements}
        self._touch(touched, -1)
        self.pool.allocate(decision, request_for(job))
        self._touch(touched, +1)
        job.start, job.placements = now, list(decision.placements)
        self.levels.allocated += job.demand.share
        self.levels.held += self.frag.held(self.gpus, job.placements)
        r = self.result
        r.started += 1
        r.waits.append(now - job.arrival)
        r.starts[job.index] = now
        if job.demand.gpu_count > 1:
            mix = getattr(self.pool, "mix", None)
            if mix is not None:
                # what the market tells the engine from its orders (marketplace/claims/demand.py): how long each
                # request for several GPUs waited, which the keep charge follows (fragmentation.KEEP_RISE)
                mix.gang_started(now - job.arrival)
        for p in job.placements[:1]:
            what = p.profile or "whole"
            r.placed_as[f"{job.pod.num_gpu}x{job.pod.gpu_milli} milli -> {self.gpus[p.gpu_uuid].model} {what}"] += 1
        heapq.heappush(self.events, (now + job.pod.runtime, COMPLETION, job.index, job))

    def _finish(self, job: Job, now: float) -> None:
        if self.host is not None and job.host_node is not None:
            self.host.give(job.host_node, job.pod.cpu_milli, job.pod.memory_mib)
        self.version += 1
        self.failed.clear()
        if job.demand is None:
            return  # a CPU-only job: nothing on the GPUs, and not a GPU job's completion
        touched = {p.gpu_uuid for p in job.placements}
        self._touch(touched, -1)
        self.levels.held -= self.frag.held(self.gpus, job.placements)
        for uuid in touched:
            self.pool.release(uuid, job.lease_id)
        self._touch(touched, +1)
        self.levels.allocated -= job.demand.share
        self.result.completed += 1
        if self.result.averages.in_window(now):
            self.result.completed_in_window += 1

    # --- queue -----------------------------------------------------------------------------------

    def _shape(self, job: Job) -> tuple:
        """Identity of a job's request: two queued jobs with the same shape fit or fail together."""
        if self.host is None:
            assert job.demand is not None
            return job.demand.key
        host_need = (job.pod.cpu_milli, job.pod.memory_mib)
        return ("cpu-only", host_need) if job.demand is None else (job.demand.key, host_need)

    def _admit(self, job: Job, now: float) -> None:
        shape = self._shape(job)
        if self.host is not None and not self.host.ever_fits(job.pod.cpu_milli, job.pod.memory_mib):
            self.result.unschedulable["asks more host CPU or memory than any node has"] += 1
            return
        if job.demand is None:
            self.queue.push(job, priority=priority_for(job.pod.qos), now=now)
            self.queued_shapes[shape] += 1
            self.cpu_queued += 1
            return
        if job.demand.key not in self.never_fits:
            decision = self.empty_policy.decide(request_for(job))
            self.never_fits[job.demand.key] = None if decision.ok else _top_reason(decision)
        reason = self.never_fits[job.demand.key]
        if reason is not None:
            self.result.unschedulable[reason] += 1
            return
        mix = getattr(self.pool, "mix", None)
        if mix is not None:
            # What Scheduler.place does before deciding: the engine learns the demand mix once per job
            # (not once per retry, which would weigh a long-waiting shape many times over).
            mix.observe(request_for(job))
        self.queue.push(job, priority=job.demand.priority, now=now)
        self.queued_shapes[shape] += 1

    def _try(self, entry: Queued[Job], now: float) -> bool:
        job = entry.item
        shape = self._shape(job)
        if shape in self.failed:
            return False
        if job.demand is None:
            assert self.host is not None
            # Not on the node a starving GPU head is waiting for: CPU-only pods would keep it from draining.
            node_id = self.host.roomiest(job.pod.cpu_milli, job.pod.memory_mib, skip=self.reserved)
            if node_id is None:
                self.failed.add(shape)
                return False
        else:
            decision = self._decide(job)
            if not decision.ok:
                self.failed.add(shape)
                return False
        self.queue.remove(entry)
        self.queued_shapes[shape] -= 1
        if not self.queued_shapes[shape]:
            del self.queued_shapes[shape]
        if job.demand is None:
            self.cpu_queued -= 1
            self._start_cpu_only(job, node_id, now)
        else:
            self._start(job, decision, now)
        return True

    def _reserve_for(self, job: Job) -> str | None:
        """The node a starving head waits for: among nodes that could ever hold it (its GPUs, and its host CPU
        and memory when they are modelled), the one with the most free GPUs it could use now (pool order on
        ties)."""
        req = request_for(job)
        shape = self._shape(job)
        eligible = self.eligible_nodes.get(shape)
        if eligible is None:
            empty = self.empty_pool
            eligible = [n for n in empty.nodes
                        if empty.free_gpu_count(empty.nodes[n], req) >= max(1, req.gpu_count)
                        and (self.host is None or self.host.could_hold(n, job.pod.cpu_milli, job.pod.memory_mib))]
            self.eligible_nodes[shape] = eligible
        best, best_free = None, -1
        for node_id in eligible:
            free = self.pool.free_gpu_count(self.pool.nodes[node_id], req)
            if free > best_free:
                best, best_free = node_id, free
        return best

    def _pass(self, now: float) -> None:
        reserved = None
        while self.queue.head_is_protected(now):
            head = self.queue.head()
            assert head is not None
            if not self._try(head, now):
                if head.item.demand is not None:  # a CPU-only head waits for CPU, not for a node's GPUs
                    reserved = self._reserve_for(head.item)
                break
        if reserved is not None:
            # The starving head's node is taken out of the pool for the rest of the pass (as if cordoned),
            # so backfill goes on everywhere else but cannot take what the head is waiting for; nothing
            # new lands there, so the head starts once that node's own jobs end.
            self.pool.set_node(reserved, online=False)
            self.reserved = reserved
        try:
            for entry in self.queue.in_order():
                if all(s in self.failed for s in self.queued_shapes):
                    return  # every shape still queued has failed since the last release
                self._try(entry, now)
        finally:
            if reserved is not None:
                self.pool.set_node(reserved, online=True)
                self.reserved = None

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> RunResult:
        for job in self.jobs:
            heapq.heappush(self.events, (job.arrival, ARRIVAL, job.index, job))
        avg = self.result.averages
        while self.events:
            now = self.events[0][0]
            avg.advance(now, self.levels)
            while self.events and self.events[0][0] == now:
                _, kind, _, job = heapq.heappop(self.events)
                if kind == COMPLETION:
                    self._finish(job, now)
                else:
                    self._admit(job, now)
            self._pass(now)
            self.levels.queued = len(self.queue) - self.cpu_queued
            avg.sample(now, self.levels)
        self.result.never_started = len(self.queue)
        return self.result


def replay(name: str, factory: PolicyFactory, node_factory: Callable[[], list[NodeState]], jobs: list[Job], *,
           window: tuple[float, float], head_protect_s: float | None, frag: FragMeter,
           host_factory: Callable[[], HostLedger] | None = None) -> RunResult:
    """Replay `jobs` (fresh copies of their run state) against a fresh pool with one policy; with
    `host_factory`, host CPU and memory are modelled on a fresh ledger."""
    fresh = [Job(j.index, j.pod, j.demand, j.arrival) for j in jobs]
    return Replay(name, factory, node_factory(), node_factory(), fresh, window=window,
                  head_protect_s=head_protect_s, frag=frag,
                  host=host_factory() if host_factory else None).run()
