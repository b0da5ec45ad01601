"""Benchmark a `/metrics` scrape at fleet scale.

    python manage.py bench_metrics [--gpus 10000] [--history-s 300] [--scrapes 7] [--json]

In a throwaway database (`test_<name>`, created and dropped here, as bench_scheduler does):
bench_scheduler's synthetic fleet (hosts, GPUs, running work with its allocations, a
queue of 1,000 pending workloads), every GPU's last measurement set (utilisation, memory,
temperature, power, as the heartbeat paths leave them), and raw samples every
AGENT_HEARTBEAT_INTERVAL_S for `--history-s` seconds per GPU (the scrape reads none; they
are there so the database is the size it is in production). Then `--scrapes` full
scrapes through the real view (token, every collector, the DCGM text), and the DCGM part
alone, split into its query and its formatting; the web process's CPU time per scrape, the
PostgreSQL backend's CPU time per scrape (when the server runs on this machine) and the
query's execution time inside PostgreSQL (EXPLAIN ANALYZE), which tell the cost apart
from waiting for a busy machine's cores. Printed: min / median / max milliseconds,
the response size and its series count (parsed with prometheus_client's parser).
"""
from __future__ import annotations

import json
import os
import statistics
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents.models import Gpu, GpuSample
from gpucloud import metrics
from gpucloud.lib.db import bench_database
from scheduler.management.commands.bench_scheduler import _populate


def _ms(runs: list[float]) -> dict[str, float]:
    return {"min": round(min(runs) * 1e3, 1), "median": round(statistics.median(runs) * 1e3, 1),
            "max": round(max(runs) * 1e3, 1)}


def _backend_cpu() -> float | None:
    """CPU seconds used so far by this connection's PostgreSQL backend process, when the
    server runs on this machine (/proc/<pid>/stat; clock ticks, 10 ms); None otherwise."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _explain() -> float:
    """The DCGM query's execution time inside PostgreSQL (EXPLAIN ANALYZE), in ms."""
    sql = metrics.dcgm_sql()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return round(plan[0]["Execution Time"], 1)


class Command(BaseCommand):
    help = "Milliseconds per /metrics scrape at N simulated GPUs."

    def add_arguments(self, parser):
        parser.add_argument("--gpus", type=int, default=10_000)
        parser.add_argument("--history-s", type=int, default=300, help="raw samples per GPU, in seconds")
        parser.add_argument("--scrapes", type=int, default=7)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, gpus, history_s, scrapes, **options):
        if gpus < 8 or scrapes < 1 or history_s < 0:
            raise CommandError("--gpus must be >= 8, --scrapes >= 1, --history-s >= 0")
        if connection.vendor != "postgresql":
            raise CommandError("the benchmark needs PostgreSQL (set DATABASE_URL)")
        with bench_database():
            out = self._bench(gpus, history_s, scrapes)
        if options["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key}: {value}")

    def _populate_fleet(self, gpus: int, history_s: int) -> int:
        """bench_scheduler's fleet, every GPU's last measurement set and `history_s` of raw
        samples per GPU; the number of raw samples."""
        _populate(gpus, 1000, 0)
        now = timezone.now()
        step = max(1, int(settings.AGENT_HEARTBEAT_INTERVAL_S))
        with connection.cursor() as cur:
            cur.execute(f"UPDATE {Gpu._meta.db_table} SET sampled_at = %s, memory_used_mib = 40000, "
                        "utilisation = 0.5 + random() / 2, temperature_c = 40 + random() * 40, "
                        "power_w = 100 + random() * 600", [now])
            cur.execute(
                f"INSERT INTO {GpuSample._meta.db_table} (gpu_id, time, gpu_util, mem_util, mem_used_mib, "
                "temperature_c, power_w) SELECT g.uuid, t, 50 + random() * 50, 40, 40000, 40 + random() * 40, "
                f"100 + random() * 600 FROM {Gpu._meta.db_table} g, "
                "generate_series(%s::timestamptz - make_interval(secs => %s), "
                "%s::timestamptz, make_interval(secs => %s)) AS t",
                [now, history_s, now, step])
            # what autovacuum does after a change this size; with the statistics of the empty
            # table the planner joins 10,000 GPUs by nested loops
            cur.execute(f"ANALYZE {Gpu._meta.db_table}")
            cur.execute(f"ANALYZE {GpuSample._meta.db_table}")
        return GpuSample.objects.count()

    def _bench(self, gpus: int, history_s: int, scrapes: int) -> dict:
        t0 = time.perf_counter()
        samples = self._populate_fleet(gpus, history_s)
        populate_s = time.perf_counter() - t0
        token = "bench-metrics-token"
        client = Client()
        full, cpu, db_cpu, dcgm, body, parts = [], [], [], [], b"", {}
        # the test client names its host "testserver", as Django's test runner allows it
        with override_settings(METRICS_TOKEN=token, ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"]):
            for _ in range(scrapes):
                d = _backend_cpu()
                t, c = time.perf_counter(), time.process_time()
                resp = client.get("/metrics", secure=True, HTTP_AUTHORIZATION=f"Bearer {token}")
                full.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                if d is not None:
                    db_cpu.append(_backend_cpu() - d)
                assert resp.status_code == 200, resp.status_code
                body = resp.content
                t = time.perf_counter()
                metrics.dcgm_text(timings=parts)
                dcgm.append(time.perf_counter() - t)
        families = list(text_string_to_metric_families(body.decode()))
        util = next(f for f in families if f.name == "DCGM_FI_DEV_GPU_UTIL")
        return {
            "gpus": Gpu.objects.count(), "raw_samples": samples, "populate_seconds": round(populate_s, 1),
            "scrape_ms": _ms(full), "scrape_web_cpu_ms": _ms(cpu),
            # PostgreSQL's CPU per scrape (every query), and web + database per scrape, means:
            # the cost of a scrape apart from waiting for a busy machine's cores
            "scrape_db_cpu_ms": _ms(db_cpu) | {"mean": round(statistics.mean(db_cpu) * 1e3, 1)} if db_cpu else None,
            "scrape_cpu_total_mean_ms": round((statistics.mean(cpu) + statistics.mean(db_cpu)) * 1e3, 1)
            if db_cpu else None,
            "dcgm_part_ms": _ms(dcgm),
            "dcgm_query_server_ms": _explain(),
            "dcgm_parts_mean_ms": {k: round(v / scrapes * 1e3, 1) for k, v in parts.items()},
            "response_kib": round(len(body) / 1024, 1),
            "series": sum(len(f.samples) for f in families), "gpus_in_dcgm_util": len(util.samples),
        }
