"""Fragmentation of MIG GPUs for the demand mix, in the spirit of FGD (Weng et al., USENIX ATC'23).

FGD measures a node's fragmentation as the expected amount of free GPU capacity that a typical task,
drawn from the workload's distribution, cannot use; it places each task where that expectation grows the
least. On MIG the capacity is memory slices and "can use" means "is covered by some legal placement of
the task's profile now" (NVIDIA's start slots, count limits and compute-slice budget all apply):

    frag(GPU) = Σ_profile P(profile) × |free slices no legal placement of that profile covers| / slices

so frag is a share of one GPU (0..1). A placement's cost is Δfrag = frag(after) − frag(before); it is
negative when the placement eats slices that were useless anyway.

Requests that cannot run on a model at all (too large for any of its profiles, or a model list that leaves
it out) can stay in that model's mix as the pseudo-profile `NO_ACCESS`, for which every free slice is
unusable: FGD's case 1 ("a task that cannot run on the node sees all of its idle GPU resources as
fragments"; `GetNodePodFrag` → `NoAccess`/`Q2LackGpu` in the paper's simulator), `DemandMix(no_access=True)`.
It is off by default (issue 12 §2, round two): with it, every free slice of a small card most of the
workload cannot use (an A30 beside A100-80GBs) is "fragment anyway", so small slices were cut into the A30s
and stranded the slices the requests that *can* run there (mostly the whole card) needed; the measure the
simulator judges every policy by (scheduler/sim/frag.py) is per model over the requests that can run there,
and that is the default measure here too.

A slice placement's cost also carries best-fit's measure, `FIT_WEIGHT` × the share of the GPU left free
after it (`free_share`): Δfrag alone is myopic (a slice on an empty GPU and one beside a neighbour it leaves
no room for can cost the same now), and ties and near ties then go to the tightest fit, as best-fit's do.

The demand mix is learnt from requests (`DemandMix.observe`) on top of a prior that favours small slices
(most pods in the Alibaba openb trace ask for a fraction of a GPU). The mix the measure uses is a snapshot
refreshed every `refresh_every` observations, so cached fragmentation values stay valid between refreshes.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Sequence

from nodeagent.hardware import mig
from nodeagent.hardware.gpus import GPU_MODELS

if TYPE_CHECKING:
    from .model import Request

NO_ACCESS = "-"  # pseudo-profile: the request cannot run on this model; all free slices are unusable to it
PRIOR_STRENGTH = 20.0  # the prior counts as this many requests
SMALLEST_PRIOR_BOOST = 3.0  # the smallest profile weighs this much more than each other profile in the prior
# cost per share of the GPU left free by a slice placement (best-fit's measure; best_start): 0.4 in issue 12 §2
# round two, 0.6 since round five (chosen on scheduler/sim/generalise.py's TUNE_ON)
FIT_WEIGHT = 0.6
# The start slot (issue 12 §2 round eight): the lowest legal start unless another grows Δfrag by more than this
# much less (in shares of one GPU). 0 was the rule until round seven (the least-Δfrag start); best-fit takes the
# lowest start always, and on scheduler/sim/generalise.py's TUNE_ON that packed better (docs/simulator.md).
START_TOLERANCE = 0.25
# The keep charge follows the gangs' observed wait (issue 12 §2 round ten, chosen on scheduler/sim/generalise.py's
# TUNE_ON and SCREEN_ON): placement.gang_keep is scaled by `DemandMix.keep_factor`, which starts at 1 (the full
# charge), moves KEEP_RISE of the way to 1 each time a request for several GPUs on one node started after waiting
# longer than KEEP_WAIT_S, and KEEP_FALL of the way to KEEP_FLOOR each time one started sooner (`gang_started`, fed
# by whoever runs the queue: the simulator's replay, the market from its orders). Where gangs start at once the
# singles may take MIG GPUs whole, as best-fit's pool order does; once gangs wait, the charge is back at once.
# The factor the costs see moves in steps of KEEP_STEP (and at each refresh): each step bumps `version`, so every
# cost memoised by it is renewed.
KEEP_FLOOR = 0.0
KEEP_RISE = 0.5
KEEP_FALL = 0.05
KEEP_WAIT_S = 0.0
KEEP_STEP = 0.1


def _bits(n: int) -> int:
    return bin(n).count("1")


def profile_mask(p: mig.MigProfile, start: int) -> int:
    return ((1 << p.memory_slices) - 1) << start


class DemandMix:
    """Distribution over MIG profiles per GPU model, learnt from the requests seen."""

    def __init__(self, *, refresh_every: int = 256, no_access: bool = False) -> None:
        self.refresh_every = refresh_every
        self.no_access = no_access
        self._counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._pending = 0
        self.version = 0
        self._snapshot: dict[str, tuple[tuple[str, float], ...]] = {}
        self._multi: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))  # model -> k -> mass
        self._node_snapshot: dict[str, tuple[tuple[int, float], ...]] = {}
        self._pinned: dict[str, float] = defaultdict(float)  # model -> mass of the requests pinned to a list with it
        self._pinned_snapshot: dict[str, float] = {}
        self._fit_cache: dict[tuple[str, float, int, bool], str | None] = {}
        self._shapes = [0, 0, 0]  # requests seen: for a slice of one GPU, for k >= 2 GPUs, in all
        self._shape_snapshot = (0.0, 0.0)
        self._keep = 1.0  # the live keep factor (gang_started); `keep_factor` is what the costs see
        self.keep_factor = 1.0

    @staticmethod
    def prior(geometry: mig.MigGeometry) -> dict[str, float]:
        plain = [p for p in geometry.profiles if not p.media_extensions]
        smallest = min(plain, key=lambda p: (p.memory_slices, p.compute_slices))
        raw = {p.name: (SMALLEST_PRIOR_BOOST if p is smallest else 1.0) for p in plain}
        total = sum(raw.values())
        return {k: PRIOR_STRENGTH * v / total for k, v in raw.items()}

    def profile_for(self, *, model: str, memory_gb: float, compute_slices: int, whole: bool) -> str | None:
        key = (model, memory_gb, compute_slices, whole)
        if key not in self._fit_cache:
            g = GPU_MODELS[model].mig
            if g is None:
                self._fit_cache[key] = None
            elif whole:
                self._fit_cache[key] = g.full_profile.name
            else:
                p = mig.smallest_fitting_profile(g, memory_gb=memory_gb, compute_slices=compute_slices)
                self._fit_cache[key] = p.name if p else None
        return self._fit_cache[key]

    def observe(self, request: "Request") -> None:
        """Count the profile `request` would take on every MIG model in the catalog."""
        for key, spec in GPU_MODELS.items():
            if spec.mig is None:
                continue
            name = None
            if request.models is None or key in request.models:
                name = self.profile_for(model=key, memory_gb=request.memory_gb,
                                        compute_slices=request.compute_slices, whole=request.wants_whole)
            if name is None and self.no_access:
                name = NO_ACCESS
            if name is not None:
                self._counts[key][name] += max(1, request.gpu_count)
                if request.models is not None and name != NO_ACCESS:
                    self._pinned[key] += max(1, request.gpu_count)
                if request.gpu_count > 1 and name != NO_ACCESS:
                    self._multi[key][request.gpu_count] += request.gpu_count
        self._shapes[2] += 1
        if request.gpu_count > 1:
            self._shapes[1] += 1
        elif not request.wants_whole:
            self._shapes[0] += 1
        self._pending += 1
        if self._pending >= self.refresh_every:
            self.refresh()

    def gang_started(self, waited_s: float) -> None:
        """A request for several GPUs on one node started after `waited_s` seconds: the keep factor moves towards 1
        when it waited longer than KEEP_WAIT_S, towards KEEP_FLOOR when it did not (see KEEP_RISE)."""
        k = self._keep
        self._keep = k + KEEP_RISE * (1.0 - k) if waited_s > KEEP_WAIT_S else k - KEEP_FALL * (k - KEEP_FLOOR)
        if abs(self._keep - self.keep_factor) >= KEEP_STEP:
            self.keep_factor = self._keep
            self.version += 1  # the costs that carry the keep charge are memoised by version

    def refresh(self) -> None:
        """Take a new snapshot of the learnt mix (invalidates fragmentation caches keyed by version)."""
        self._pending = 0
        self.version += 1
        self._snapshot.clear()
        self._node_snapshot.clear()
        self._pinned_snapshot.clear()
        slices, multi, total = self._shapes
        self._shape_snapshot = (slices / total, multi / total) if total else (0.0, 0.0)
        self.keep_factor = self._keep

    def shape_shares(self) -> tuple[float, float]:
        """(share of requests for a slice of one GPU, share for several GPUs on one node) seen up to the
        snapshot: the mix's exposure to fragmentation, which weights.weights_for can move the weights by."""
        return self._shape_snapshot

    def multi_gpu(self, model: str) -> tuple[tuple[int, float], ...]:
        """(k, probability) of requests for k ≥ 2 whole GPUs on one node, on the same scale as
        `distribution` (each such request weighs k there, as k full profiles, and here)."""
        snap = self._node_snapshot.get(model)
        if snap is None:
            total = self._total(model)
            multi = self._multi.get(model, {})
            snap = tuple(sorted((k, n / total) for k, n in multi.items())) if total else ()
            self._node_snapshot[model] = snap
        return snap

    def _total(self, model: str) -> float:
        """The mass of the model's mix: its prior plus every request counted on it (0 for a model without MIG)."""
        g = GPU_MODELS[model].mig
        if g is None:
            return 0.0
        return sum(self.prior(g).values()) + sum(self._counts.get(model, {}).values())

    def pinned_share(self, model: str) -> float:
        """Share of the MIG model's mix (prior included) asked by requests pinned to a list of models that holds
        it, up to the snapshot: what an unpinned request taking one of its GPUs takes from requests that can go
        nowhere else (placement.pin_keep)."""
        share = self._pinned_snapshot.get(model)
        if share is None:
            total = self._total(model)
            share = self._pinned_snapshot[model] = self._pinned.get(model, 0.0) / total if total else 0.0
        return share

    def no_access_share(self, model: str) -> float:
        """Share of the mix (at the snapshot) that cannot run on `model` at all."""
        for name, p in self.distribution(model):
            if name == NO_ACCESS:
                return p
        return 0.0

    def distribution(self, model: str) -> tuple[tuple[str, float], ...]:
        """(profile, probability) pairs for a MIG model, prior plus what was observed up to the snapshot."""
        snap = self._snapshot.get(model)
        if snap is None:
            g = GPU_MODELS[model].mig
            if g is None:
                return ()
            counts = self.prior(g)
            for name, n in self._counts.get(model, {}).items():
                counts[name] = counts.get(name, 0.0) + n
            total = sum(counts.values())
            snap = tuple(sorted((k, v / total) for k, v in counts.items()))
            self._snapshot[model] = snap
        return snap


def usable_mask(geometry: mig.MigGeometry, instances: Sequence[mig.Instance], profile: str) -> int:
    """Memory slices that some legal placement of `profile` would cover now (none for NO_ACCESS)."""
    if profile == NO_ACCESS:
        return 0
    p = geometry.profile(profile)
    mask = 0
    for s in mig.legal_starts(geometry, instances, profile):
        mask |= profile_mask(p, s)
    return mask


def free_share(geometry: mig.MigGeometry, layout: Sequence[tuple[str, int]]) -> float:
    """Share of the GPU still free with `layout`: the smaller of free memory and free compute slices."""
    mem = cs = 0
    for name, _ in layout:
        p = geometry.profile(name)
        mem += p.memory_slices
        cs += p.compute_slices
    return min(1.0 - mem / geometry.memory_slices, 1.0 - cs / geometry.compute_slices)


def frag(geometry: mig.MigGeometry, instances: Sequence[mig.Instance],
         distribution: Sequence[tuple[str, float]]) -> float:
    """Expected share of the GPU that is free but unusable by a request drawn from `distribution`."""
    full = (1 << geometry.memory_slices) - 1
    free = full & ~mig.used_mask(geometry, instances)
    if not free:
        return 0.0
    expected = 0.0
    for name, prob in distribution:
        expected += prob * _bits(free & ~usable_mask(geometry, instances, name))
    return expected / geometry.memory_slices


class FragCache:
    """Memoises frag and placement deltas per (model, layout); layouts repeat a lot across a pool."""

    def __init__(self, mix: DemandMix) -> None:
        self.mix = mix
        self._version = -1
        self._frag: dict[tuple, float] = {}
        self._best: dict[tuple, tuple[int, float] | None] = {}

    def _check(self) -> None:
        if self._version != self.mix.version:
            self._frag.clear()
            self._best.clear()
            self._version = self.mix.version

    def frag(self, model: str, geometry: mig.MigGeometry, layout: tuple[tuple[str, int], ...]) -> float:
        self._check()
        key = (model, layout)
        v = self._frag.get(key)
        if v is None:
            v = frag(geometry, [mig.Instance(p, s) for p, s in layout], self.mix.distribution(model))
            self._frag[key] = v
        return v

    def best_start(self, model: str, geometry: mig.MigGeometry, layout: tuple[tuple[str, int], ...],
                   profile: str) -> tuple[int, float] | None:
        """(start, cost) of the start a slice takes: the lowest legal start whose Δfrag is within START_TOLERANCE
        of the least (`START_TOLERANCE`); cost = its Δfrag + FIT_WEIGHT × the share of the GPU left free after
        the placement (the same for every start). None where the profile has no legal start."""
        self._check()
        key = (model, layout, profile)
        if key in self._best:
            return self._best[key]
        insts = [mig.Instance(p, s) for p, s in layout]
        before = self.frag(model, geometry, layout)
        fit = FIT_WEIGHT * max(0.0, free_share(geometry, layout + ((profile, 0),))) if FIT_WEIGHT else 0.0
        deltas = [(s, self.frag(model, geometry, tuple(sorted(layout + ((profile, s),)))) - before + fit)
                  for s in mig.legal_starts(geometry, insts, profile)]  # ascending starts
        best = None
        if deltas:
            least = min(d for _, d in deltas)
            best = next((s, d) for s, d in deltas if d <= least + START_TOLERANCE + 1e-12)
        self._best[key] = best
        return best

    def whole_delta(self, model: str, geometry: mig.MigGeometry) -> float:
        """Δfrag of taking an empty MIG GPU whole: the (small) fragmentation of an empty GPU disappears."""
        return -self.frag(model, geometry, ())


def node_delta(multi: Sequence[tuple[int, float]], free_before: int, taken: int) -> float:
    """Change of the node-level term when `taken` of a node's `free_before` free whole GPUs are used.

    FGD counts a request for k GPUs on one node as unable to run on a node with fewer than k free GPUs, and
    then all of that node's free GPU capacity is fragment to it. The partly used GPUs' free slices are
    already in the per-GPU term (as the full profile), so this term counts the free whole GPUs:
    F_k(node) = free whole GPUs if fewer than k, else 0, and the term is Σ_k P(k) × F_k, in GPUs. Breaking
    into the last node that could host an 8-GPU job costs 7 × P(8); taking a GPU of a node that already
    could not host one gains P(8)."""
    if not multi or taken <= 0:
        return 0.0
    after = free_before - taken
    delta = 0.0
    for k, p in multi:
        before_f = free_before if free_before < k else 0
        after_f = after if after < k else 0
        delta += p * (after_f - before_f)
    return delta
