"""Shaping replay results: one summary dict per policy, a text table, JSON, and a PNG plot."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .metrics import downsample, percentile
from .simulate import RunResult


def human_seconds(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def summarise(r: RunResult) -> dict[str, Any]:
    avg = r.averages
    assert avg is not None
    return {
        "policy": r.policy,
        "allocation": round(avg.allocation, 6),
        "held": round(avg.held, 6),
        "fragmentation": round(avg.fragmentation, 6),
        "mean_queue": round(avg.mean_queue, 3),
        "window_s": avg.span,
        "wait_p50_s": r.wait_percentile(50),
        "wait_p95_s": r.wait_percentile(95),
        "wait_p99_s": r.wait_percentile(99),
        "wait_max_s": max(r.waits, default=0.0),
        "jobs": r.jobs,
        "cpu_jobs": r.cpu_jobs,
        "cpu_started": r.cpu_started,
        "cpu_wait_p99_s": percentile(r.cpu_waits, 99),
        "started": r.started,
        "completed": r.completed,
        "completed_in_window": r.completed_in_window,
        "unschedulable": sum(r.unschedulable.values()),
        "unschedulable_by_reason": dict(r.unschedulable.most_common()),
        "never_started": r.never_started,
        "decide_calls": r.decide_calls,
        "decisions_per_second": round(r.decisions_per_second, 1),
        "placed_as": dict(sorted(r.placed_as.items(), key=lambda kv: -kv[1])),
    }


COLUMNS = (
    ("policy", "policy", lambda v: v),
    ("allocation", "alloc", lambda v: f"{v:.1%}"),
    ("allocation_bound", "bound", lambda v: f"<={v:.1%}"),
    ("held", "held", lambda v: f"{v:.1%}"),
    ("fragmentation", "frag", lambda v: f"{v:.3f}"),
    ("wait_p50_s", "wait p50", human_seconds),
    ("wait_p95_s", "p95", human_seconds),
    ("wait_p99_s", "p99", human_seconds),
    ("started", "started", str),
    ("completed_in_window", "done@T", str),
    ("completed", "done", str),
    ("unschedulable", "unsched", str),
    ("decisions_per_second", "dec/s", lambda v: f"{v:,.0f}"),
)


def table(summaries: list[dict[str, Any]]) -> str:
    rows = [[head for _, head, _ in COLUMNS]]
    rows += [[fmt(s[key]) if key in s else "-" for key, _, fmt in COLUMNS] for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def reasons_text(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for s in summaries:
        if s["unschedulable_by_reason"]:
            parts = ", ".join(f"{n} {why}" for why, n in s["unschedulable_by_reason"].items())
            lines.append(f"  {s['policy']}: unschedulable {parts}")
    return "\n".join(lines)


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")


def series(r: RunResult, points: int = 400) -> dict[str, list]:
    assert r.averages is not None
    s = downsample(r.averages.samples, points)
    return {"t": [x[0] for x in s], "allocation": [x[1] for x in s], "queued": [x[2] for x in s]}


def plot(path: str | Path, results: list[RunResult], title: str) -> None:
    """Allocation and queue length over time, one line per policy (matplotlib, Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for r in results:
        s = series(r, 1500)
        t0 = r.averages.window_start if r.averages else 0.0
        hours = [(t - t0) / 3600 for t in s["t"]]
        top.step(hours, s["allocation"], where="post", label=r.policy, linewidth=1)
        bottom.step(hours, s["queued"], where="post", label=r.policy, linewidth=1)
    top.set_ylabel("allocation (share of GPUs)")
    top.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    bottom.set_ylabel("jobs queued")
    bottom.set_xlabel("hours since the metric window opened (after --load)")
    top.legend(loc="upper left", fontsize=8, ncol=3)
    top.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
