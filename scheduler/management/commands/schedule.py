"""Run scheduling cycles by hand: for operators (a stuck queue?) and for the concurrency tests."""
from __future__ import annotations

import json
import time

from django.core.management.base import BaseCommand, CommandError

from gpucloud.catalogue.models import Region
from scheduler.cycle import run_cycle


class Command(BaseCommand):
    help = "Run scheduling cycles for a region now (the Celery loop does this every few seconds)."

    def add_arguments(self, parser):
        parser.add_argument("--region", required=True, help="region code, e.g. us-east-1")
        parser.add_argument("--cycles", type=int, default=1)
        parser.add_argument("--until-idle", action="store_true",
                            help="repeat until a cycle places nothing (at most --cycles)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, region, cycles, until_idle, **options):
        region_obj = Region.objects.filter(code=region).first()
        if region_obj is None:
            raise CommandError(f"no region {region!r}")
        totals = {"cycles": 0, "skipped": 0, "placed": 0, "conflicts": 0}
        for _ in range(cycles):
            stats = run_cycle(region_id=region_obj.pk)
            totals["cycles"] += 1
            if not stats.ran:
                totals["skipped"] += 1
                time.sleep(0.05)
                continue
            totals["placed"] += stats.apply.placed
            totals["conflicts"] += stats.apply.conflicts
            if until_idle and stats.apply.placed == 0 and stats.apply.conflicts == 0:
                break
        self.stdout.write(json.dumps(totals) if options["json"] else
                          " ".join(f"{k}={v}" for k, v in totals.items()))
