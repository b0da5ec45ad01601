"""`manage.py bench_e2e` works, in a tiny configuration: the real processes, its own database,
every job done, the figures in one JSON line, no process left behind (no speed assertion)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

REPO = Path(__file__).resolve().parents[1]


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                return True
    return False


def test_bench_e2e_runs_a_small_configuration_and_leaves_nothing_behind():
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings", "SECRET_KEY": "bench-test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "bench_e2e", "--hosts", "2", "--jobs", "12", "--clients", "2",
         "--idle-samples", "2", "--idle-seconds", "1", "--web-workers", "1", "--web-cpu", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("submit_jobs_per_s", "dispatch_jobs_per_s", "completion_jobs_per_s",
                "create_to_running_p50_s", "create_to_running_p99_s", "server_cpu_ms_per_job",
                "booked_not_running_share"):
        assert isinstance(out[key], (int, float)), key
    assert out["states"] == {"succeeded": 12} and out["submit_errors"] == 0
    assert out["idle_samples"] == 2
    assert set(out["idle_cpu_share_of_a_core"]) == {"web", "worker", "beat", "fleet"}
    assert set(out["cpu_ms_per_job"]) == {"web", "worker", "beat", "fleet", "postgres"}
    assert len(out["process_groups"]) == 4
    assert not [g for g in out["process_groups"] if _group_alive(g)]
    # --web-cpu: the web's requests per job by kind, the create one per job
    assert out["web_requests_per_job"]["POST /api/v1/jobs"][0] == 1.0
    assert any(k.startswith("POST /agent/v1/heartbeat") for k in out["web_requests_per_job"])


def test_bench_heartbeats_changed_reports_each_phase_with_its_transitions():
    """`bench_heartbeats --changed K`: K jobs per host placed by a cycle, then a heartbeat per
    host picking them up, reporting them running, exited, removed."""
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings", "SECRET_KEY": "bench-test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "bench_heartbeats", "--hosts", "2", "--changed", "4", "--workers", "1",
         "--threads", "2", "--concurrency", "2", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {p: out[p]["transitions_per_heartbeat"] for p in ("pickup", "running", "exited", "removed")} == {
        "pickup": 0, "running": 4, "exited": 4, "removed": 0}
    assert all(out[p]["errors"] == 0 and out[p]["server_cpu_ms_per_heartbeat"] >= 0
               for p in ("pickup", "running", "exited", "removed"))


def _bench(*args: str) -> dict:
    """Run one benchmark command as an operator would (its own database, made and dropped);
    its last line, the JSON object."""
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings", "SECRET_KEY": "bench-test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    env.pop("DEBUG", None)  # as in production: no DEBUG, so no host allowed by default
    proc = subprocess.run([sys.executable, "manage.py", *args, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_metrics_scrapes_a_small_fleet():
    """It scrapes through Django's client, whose host ("testserver") production settings do
    not allow: the command allows it, as Django's test runner does (it answered 400 before)."""
    out = _bench("bench_metrics", "--gpus", "16", "--history-s", "10", "--scrapes", "2")
    assert out["gpus"] == 16 and out["scrape_ms"]["min"] > 0


def test_bench_metering_posts_what_it_meters():
    out = _bench("bench_metering", "--workloads", "20", "--tenants", "2")
    assert out["first"]["metered"] == 20
    assert out["ledger_matches_meters"] is True and out["balances_match_ledger"] is True


def test_bench_scheduler_places_through_the_database():
    out = _bench("bench_scheduler", "--gpus", "80", "--pending", "20")
    assert out["core_placements"] > 0 and out["db_placements"] > 0
