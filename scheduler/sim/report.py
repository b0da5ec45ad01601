"""Metrics, the per-run CSV and the plot for a finished replay."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from .engine import JobState, Result


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    i = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[i]


def jain(xs: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one has all."""
    if not xs:
        return 1.0
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if sq > 0 else 1.0


def summarize(res: Result, *, policy: str, placement: str) -> dict[str, Any]:
    """``jain_fairness`` is over tenants' normalised shares: GPU-time received
    while the tenant had work queued or running, divided by its weighted fair
    share of the whole capacity over those same times."""
    done = [js for js in res.jobs.values() if js.end is not None]
    jct = sorted(js.end - js.job.submit for js in done)  # type: ignore[operator]
    queue = [max(0.0, js.end - js.job.submit - js.job.duration) for js in done]  # type: ignore[operator]
    placed = sum(1 for js in res.jobs.values() if js.first_start is not None)
    ends = [js.end for js in done]
    first = min((js.job.submit for js in res.jobs.values()), default=0.0)
    norm = {t: res.tenant_alloc.get(t, 0.0) / f for t, f in res.tenant_fair.items() if f > 0}
    # against each tenant's max-min fair share given the demands (1 = got it all)
    maxmin = {
        t: res.tenant_alloc.get(t, 0.0) / f for t, f in res.tenant_maxmin.items() if f > 0
    }
    per: dict[str, dict[str, Any]] = {}
    for js in res.jobs.values():
        d = per.setdefault(
            js.job.tenant, {"jobs": 0, "finished": 0, "rejected": 0, "_jct": 0.0, "_q": 0.0}
        )
        d["jobs"] += 1
        if js.end is not None:
            d["finished"] += 1
            d["_jct"] += js.end - js.job.submit
            d["_q"] += max(0.0, js.end - js.job.submit - js.job.duration)
        elif js.rejected:
            d["rejected"] += 1
    for t, d in per.items():
        n = d["finished"]
        d["avg_jct_s"] = round(d.pop("_jct") / n, 1) if n else None
        d["avg_queue_s"] = round(d.pop("_q") / n, 1) if n else None
        d["gpu_hours"] = round(res.tenant_alloc.get(t, 0.0) / 1000 / 3600, 1)
        d["norm_share"] = round(norm[t], 4) if t in norm else None
        d["maxmin_share"] = round(maxmin[t], 4) if t in maxmin else None
    cap = res.capacity_milli
    out = {
        "policy": policy,
        "placement": placement,
        "jobs": len(done),
        "submitted": len(res.jobs),
        "placed": placed,
        "rejected": sum(1 for js in res.jobs.values() if js.rejected and js.end is None),
        "avg_jct_s": round(sum(jct) / len(jct), 1) if jct else None,
        "p50_jct_s": round(_pct(jct, 0.5), 1) if jct else None,
        "p99_jct_s": round(_pct(jct, 0.99), 1) if jct else None,
        "avg_queue_s": round(sum(queue) / len(queue), 1) if queue else None,
        "makespan_s": round(max(ends) - first, 1) if ends else None,
        "gpu_allocation_ratio": round(res.alloc_area / (cap * res.active_time), 4)
        if cap and res.active_time
        else None,
        "allocation_at_demand": {k: round(v, 4) for k, v in res.demand_marks.items()},
        "jain_fairness": round(jain(list(norm.values())), 4),
        "jain_maxmin": round(jain(list(maxmin.values())), 4),
        "preemptions": res.preemptions,
        "preempted_gpu_s": round(res.preempted_gpu_s, 1),
        "lost_gpu_s": round(res.lost_gpu_s, 1),
        "per_tenant": dict(sorted(per.items())),
        "capacity_gpus": cap / 1000,
        "plan_calls": res.plan_calls,
        "wall_s": round(res.wall_s, 2),
    }
    if res.learned:
        out["estimator"] = estimator_accuracy(done)
    return out


#: history lengths (finished runs behind the estimate's key) reported apart
_HISTORY_BUCKETS = ((0, 2, "0-2"), (3, 9, "3-9"), (10, 31, "10-31"),
                    (32, 63, "32-63"), (64, 1 << 62, "64 (full window)"))


def estimator_accuracy(done: list[JobState]) -> dict[str, Any]:
    """The learned durations' own error, |predicted - actual| / actual, median and
    p90, over finished jobs by the history their first estimate rested on."""
    out: dict[str, Any] = {}
    for lo, hi, label in _HISTORY_BUCKETS:
        errs = sorted(
            abs(js.first_est - js.job.duration) / js.job.duration
            for js in done
            if lo <= js.first_history <= hi and js.first_est is not None and js.job.duration > 0
        )
        jobs = sum(1 for js in done if lo <= js.first_history <= hi)
        out[label] = {
            "jobs": jobs,
            "estimated": len(errs),
            "median_rel_err": round(_pct(errs, 0.5), 3) if errs else None,
            "p90_rel_err": round(_pct(errs, 0.9), 3) if errs else None,
        }
    return out


def write_jobs_csv(res: Result, path: str | Path) -> None:
    """One row per run: ``job_id, tenant, submit, start, end, hosts, gpus, preempted``
    (``hosts`` joined by ``;``, ``gpus`` per host, 0 for a fractional share whose
    milli-GPUs are in ``milli``). Runs still going at the end have an empty end."""
    rows = sorted(res.runs, key=lambda r: (r.start, r.job_id))
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["job_id", "tenant", "submit", "start", "end", "hosts", "gpus", "milli", "preempted"]
        )
        for r in rows:
            w.writerow(
                [
                    r.job_id,
                    r.tenant,
                    f"{r.submit:g}",
                    f"{r.start:g}",
                    f"{r.end:g}",
                    ";".join(r.hosts),
                    r.gpus,
                    r.milli,
                    int(r.preempted),
                ]
            )


def plot(res: Result, path: str | Path, *, title: str = "") -> None:
    """Queue length, allocation and per-tenant share over time (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res.series
    if not s:
        return
    t0 = s[0][0]
    hours = [(t - t0) / 3600 for t, *_ in s]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    axes[0].plot(hours, [q for _t, q, _a, _s in s], lw=0.8)
    axes[0].set_ylabel("queued jobs")
    axes[1].plot(hours, [a * 100 for _t, _q, a, _s in s], lw=0.8)
    axes[1].set_ylabel("GPUs allocated %")
    axes[1].set_ylim(0, 105)
    tenants = sorted({tn for *_x, sh in s for tn in sh})
    axes[2].stackplot(
        hours, *[[sh.get(tn, 0.0) * 100 for *_x, sh in s] for tn in tenants], labels=tenants
    )
    axes[2].set_ylabel("share of GPUs %")
    axes[2].set_xlabel("hours")
    if len(tenants) <= 16:
        axes[2].legend(loc="upper right", fontsize=6, ncol=4)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
