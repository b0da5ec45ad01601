"""The agent services' pure parts as tables, and bootstrap tokens through the operators' admin."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from agents.liveness import is_lost
from agents.models import BootstrapToken, Host
from agents.selectors import hash_token
from agents.services.heartbeat import seq_is_fresh
from agents.services.registration import gpu_model_code
from gpucloud.catalogue.models import Region
from gpucloud.tenancy.models import AuditEvent

CODES = ["H100", "H200", "A100", "L40S", "MI300X"]


@pytest.mark.parametrize(
    "name, code",
    [
        ("H100", "H100"),
        ("h100", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA  L40S", "L40S"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA GeForce RTX 4090", None),
        ("Tesla V100-SXM2-16GB", None),
        ("", None),
    ],
)
def test_driver_names_map_to_catalogue_codes(name, code):
    assert gpu_model_code(name, CODES) == code


def test_a_more_specific_catalogue_code_wins():
    assert gpu_model_code("NVIDIA A100 80GB PCIe", [*CODES, "A100-PCIE"]) == "A100-PCIE"


T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "last_seen, seconds_later, lost",
    [
        (T0, 0, False),
        (T0, 30, False),  # exactly at the limit: still alive
        (T0, 30.5, True),
        (T0, -60, False),  # a heartbeat "from the future" (clock step) is not a death
        (None, 0, True),  # never heard from
    ],
)
def test_is_lost(last_seen, seconds_later, lost):
    assert (
        is_lost(last_seen, T0 + timedelta(seconds=seconds_later), interval=5, tolerance=6) is lost
    )


@pytest.mark.parametrize(
    "seq, last, fresh",
    [
        (1, 0, True),
        (6, 5, True),
        (5, 5, False),  # a repeat
        (4, 5, False),  # late
        (1, 5, True),  # the agent restarted
        (2, 100, True),  # restarted, and its first heartbeat was lost
        (90, 100, False),  # late, within the window
    ],
)
def test_seq_freshness(seq, last, fresh):
    assert seq_is_fresh(seq, last) is fresh


@pytest.mark.django_db
def test_operators_mint_a_token_in_the_admin_and_see_it_once(admin_client, client):
    region = Region.objects.create(code="us-east-1", name="US East", country="US")
    add = reverse("admin:agents_bootstraptoken_add")
    resp = admin_client.post(
        add,
        {"region": region.pk, "note": "rack 7", "expires_at_0": "", "expires_at_1": ""},
        follow=True,
    )
    assert resp.status_code == 200
    shown = [str(m) for m in resp.context["messages"]]
    secret = re.search(r"(gpb_[A-Za-z0-9_\-]+)", shown[0]).group(1)
    token = BootstrapToken.objects.get()
    assert token.token_hash == hash_token(secret) and secret not in token.token_hash
    assert token.prefix == secret[:12] and token.created_by.is_superuser
    assert AuditEvent.objects.filter(action="bootstrap_token.create").count() == 1
    # The change page never shows the secret again.
    change = admin_client.get(reverse("admin:agents_bootstraptoken_change", args=[token.pk]))
    assert secret.encode() not in change.content
    listing = admin_client.get(reverse("admin:agents_bootstraptoken_changelist"))
    assert token.prefix.encode() in listing.content
    # It admits one host.
    body = {
        "protocol_version": 1,
        "bootstrap_token": secret,
        "hostname": "rack7-1",
        "agent_version": "t",
        "gpu_backend": "sim",
        "runtime": "sim",
        "cpu_count": 8,
        "memory_mib": 65536,
        "gpus": [],
    }
    assert (
        client.post("/agent/v1/register", body, content_type="application/json").status_code == 200
    )
    token.refresh_from_db()
    assert token.used_at is not None and token.host == Host.objects.get(name="rack7-1")


@pytest.mark.django_db
def test_the_expire_action_retires_unused_tokens(admin_client):
    from agents.services.registration import bootstrap_token_create

    region = Region.objects.create(code="us-east-1", name="US East", country="US")
    token, _ = bootstrap_token_create(region=region)
    resp = admin_client.post(
        reverse("admin:agents_bootstraptoken_changelist"),
        {"action": "expire_now", "_selected_action": [token.pk]},
        follow=True,
    )
    assert resp.status_code == 200
    token.refresh_from_db()
    assert token.expires_at is not None
