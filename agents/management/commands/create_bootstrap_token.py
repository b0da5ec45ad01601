"""Mint a one-time bootstrap token for a new host of a region; the LAST line is the token.

For install scripts (`TOKEN=$(python manage.py create_bootstrap_token --region us-east-1 |
tail -n1)`); operators with a browser use the admin's action, which calls the same service.
The secret is printed once and stored only as its SHA-256.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import Region


class Command(BaseCommand):
    help = (
        "Create a one-time bootstrap token that admits one new host to REGION; "
        "the token is the last line printed."
    )

    def add_arguments(self, parser):
        parser.add_argument("--region", required=True, help="the region's code, e.g. us-east-1")
        parser.add_argument("--note", default="", help="e.g. the rack or machine it is for")
        parser.add_argument(
            "--expires-in-hours", type=float, default=None,
            help="the token admits nothing after this many hours (default: never expires)",
        )

    def handle(self, *args, region: str, note: str, expires_in_hours: float | None, **options):
        found = Region.objects.filter(code=region).first()
        if found is None:
            codes = ", ".join(Region.objects.order_by("code").values_list("code", flat=True))
            raise CommandError(f"No region {region!r}; known: {codes or 'none (seed_catalog?)'}")
        if len(note) > 200:
            raise CommandError("--note is at most 200 characters")
        expires_at = None
        if expires_in_hours is not None:
            if not 0 < expires_in_hours <= 24 * 366:
                raise CommandError("--expires-in-hours must be > 0 and at most a year")
            expires_at = timezone.now() + timedelta(hours=expires_in_hours)
        token, secret = bootstrap_token_create(region=found, note=note, expires_at=expires_at)
        until = f"until {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else "with no expiry"
        self.stdout.write(
            f"bootstrap token {token.prefix}… for {found.code}, one host, {until}; shown once:"
        )
        self.stdout.write(secret)
