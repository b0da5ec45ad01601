"""Replay a workload trace through the scheduler core (no database):

    python manage.py simulate --trace FILE --format philly --cluster 64x8:V100 --policy fifo --json

A thin wrapper over ``scheduler.sim.cli`` (also ``python -m scheduler.sim``).
"""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandError

from scheduler.sim.cli import add_arguments, run
from scheduler.sim.trace import TraceError


class Command(BaseCommand):
    help = "Replay a GPU workload trace through the scheduler core with a simulated clock."

    def add_arguments(self, parser):
        add_arguments(parser)

    def handle(self, *args, **opts):
        try:
            run(argparse.Namespace(**opts), out=self.stdout)
        except TraceError as e:
            raise CommandError(str(e)) from e
