"""`gpucloud usage` shows what volumes cost as a storage row of its own (issue 28, deliverable 5)."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services
from tests.billing.helpers import make_volume, set_storage_price
from tests.cli.test_cli import cli  # noqa: F401 (a fixture)


@pytest.mark.django_db(transaction=True)
def test_usage_prints_a_storage_row(cli, alice, catalog):  # noqa: F811
    now = timezone.now().replace(microsecond=0)
    set_storage_price("0.0100", since=now - timedelta(days=1))
    make_volume(alice, sizes=[(now - timedelta(hours=2), 50)], name="datasets")
    services.metering_run(now=now)
    assert cli("login", "--url", cli.url, "--api-key", alice.key).returncode == 0
    done = cli("usage")
    assert done.returncode == 0, done.both
    [row] = [line for line in done.stdout.splitlines() if line.startswith("storage")]
    assert "GiB-h" in row and Decimal(row.split()[-1]) >= Decimal("0.98")  # ~100 GiB-hours at 0.01 (metered)
