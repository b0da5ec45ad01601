"""The benchmark harness runs and reports what the management command prints."""

from __future__ import annotations

from scheduler.core import plan
from scheduler.core.bench import run_core_bench, synthetic_fleet, synthetic_queue
from scheduler.core.testing import verify


def test_bench_reports_throughput_and_memory():
    out = run_core_bench(800, 300, seed=1)
    assert out["gpus"] == 800 and out["pending"] == 300
    assert out["placements"] > 0 and out["placements_per_s"] > 0 and out["peak_rss_mib"] > 0


def test_synthetic_inputs_are_seeded_and_plans_keep_the_invariants():
    s, q = synthetic_fleet(400, seed=3), synthetic_queue(200, seed=3)
    assert s == synthetic_fleet(400, seed=3) and q == synthetic_queue(200, seed=3)
    verify(s, q, plan(s, q, "gpucloud", now=0.0))
