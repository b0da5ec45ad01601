"""Who a host is: its name and its GPUs (issue 27, findings 4 and 11; docs/security.md).

A GPU belongs to the host that first registered it: a registration listing another host's
GPU is refused, idle GPU or not (before, any unused bootstrap token moved an idle GPU's row
to the new host). Host names have one form (stripped, lower case, RFC 1123 labels): a
lookalike of a registered name is that name, or refused, never a second host.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

import pytest
from django.apps import apps as django_apps
from django.contrib import admin
from django.db import IntegrityError, connection, transaction

from agents.host.config import AgentConfig, ConfigError
from agents.models import BootstrapToken, Gpu, Host
from agents.protocol import RegisterRequest, host_name_normalise
from agents.selectors import hash_token
from agents.services.host_ops import host_replace_allow
from agents.services.registration import host_register
from gpucloud.catalogue.models import GpuModel
from gpucloud.lib.errors import Conflict
from gpucloud.tenancy.models import AuditEvent
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    assert_error,
    new_token,
    post,
    region,
    register_body,
    triggered,
)

REGISTER = "/agent/v1/register"


def body(token: str, hostname: str, uuids: list[str], **extra) -> dict:
    b = register_body(token, hostname, gpus=len(uuids))
    for g, uuid in zip(b["gpus"], uuids, strict=True):
        g["uuid"] = uuid
    return {**b, **extra}


def register(client, region, hostname: str, uuids: list[str], **extra):
    return post(client, REGISTER, body(new_token(region), hostname, uuids, **extra))


def gpus_of(name: str) -> list[str]:
    return sorted(Gpu.objects.filter(host__name=name).values_list("uuid", flat=True))


# --- finding 4: GPU identity is bound to its host -----------------------------------------


def test_a_rogue_host_cannot_take_another_hosts_idle_gpu(client, region, triggered, caplog):
    """The reproduction: h1 has two idle GPUs; an unused token registering "rogue" with one of
    their UUIDs got 200 and h1 was left with one GPU."""
    ok = register(client, region, "h1", ["GPU-a", "GPU-b"])
    assert ok.status_code == 200, ok.content
    h1 = Host.objects.get(name="h1")
    token = new_token(region)
    with caplog.at_level(logging.WARNING, logger="agents.services.registration"):
        resp = post(client, REGISTER, body(token, "rogue", ["GPU-x", "GPU-b"]))
    err = assert_error(resp, 409, "gpu_owned_by_another_host")
    assert list(err["fields"]) == ["gpus[1].uuid"] and "h1" not in err["message"]
    # Nothing changed: no new host, h1 keeps both GPUs, the token may still admit a host.
    assert list(Host.objects.values_list("name", flat=True)) == ["h1"]
    assert gpus_of("h1") == ["GPU-a", "GPU-b"] and not Gpu.objects.filter(uuid="GPU-x").exists()
    assert BootstrapToken.objects.get(token_hash=hash_token(token)).used_at is None
    # Audited and logged with both names: the host that tried and the GPU's owner.
    refused = AuditEvent.objects.get(action="host.register_refused")
    assert refused.object_id == str(h1.pk)
    assert (refused.data["hostname"], refused.data["owner"]) == ("rogue", "h1")
    assert refused.data["code"] == "gpu_owned_by_another_host"
    assert any("owner=h1 name=rogue" in r.getMessage() for r in caplog.records)
    # The token still admits a host with GPUs of its own.
    again = post(client, REGISTER, body(token, "rogue", ["GPU-x"]))
    assert again.status_code == 200 and gpus_of("rogue") == ["GPU-x"]


def test_a_host_re_registering_its_own_gpus_keeps_them(client, region, triggered):
    first = register(client, region, "h1", ["GPU-a", "GPU-b"])
    again = register(
        client, region, "h1", ["GPU-b", "GPU-a", "GPU-c"],
        previous_host_token=first.json()["host_token"],
    )
    assert again.status_code == 200, again.content
    assert again.json()["host_id"] == first.json()["host_id"]
    assert gpus_of("h1") == ["GPU-a", "GPU-b", "GPU-c"]


def test_gpus_follow_a_host_only_through_the_operators_replace_host(client, region, triggered):
    """Moving GPUs to a new machine is the operator's "Replace host": the machine registers
    under the host's name and takes over the host, its GPU rows with it. The permission does
    not open the GPUs to a registration under any other name."""
    first = register(client, region, "h1", ["GPU-a", "GPU-b"])
    host_replace_allow(host=Host.objects.get(name="h1"))
    other = register(client, region, "h2", ["GPU-a"])
    assert_error(other, 409, "gpu_owned_by_another_host")
    assert gpus_of("h1") == ["GPU-a", "GPU-b"] and not Host.objects.filter(name="h2").exists()
    taken = register(client, region, "h1", ["GPU-a", "GPU-b"])
    assert taken.status_code == 200, taken.content
    assert taken.json()["host_id"] == first.json()["host_id"]
    assert gpus_of("h1") == ["GPU-a", "GPU-b"]


# --- finding 11: one form of host names ---------------------------------------------------

LOOKALIKES = [
    "sec3-h1 ",  # the reproduction: a trailing space
    " sec3-h1",
    "sec3-h1\t",
    "sec3-h1\n",
    "SEC3-H1",
    "Sec3-H1.",  # a fully qualified name's final dot
    "sec3-h1\x00",
    "sec3-h1\x07",
    "sec3\x1b-h1",
    "sec3-h1\u200b",  # zero-width space
    "sec3-h1\u00a0",  # no-break space
    "\u0455\u0435\u0441\u0033-\u04bb\u0031",  # Cyrillic letters that look like Latin ones
    "sec3-h\u0031\u0301",  # a combining accent
    "\uff53\uff45\uff43\uff13-\uff48\uff11",  # full-width
    "sec3-\u212a1",  # the Kelvin sign, which lower-cases to 'k'
    "sec3_h1",
    "sec3 h1",
]


@pytest.mark.parametrize("name", LOOKALIKES)
def test_a_lookalike_of_a_registered_name_is_never_a_second_host(client, region, triggered, name):
    assert register(client, region, "sec3-h1", ["GPU-a"]).status_code == 200
    host = Host.objects.get()
    token = new_token(region)
    resp = post(client, REGISTER, body(token, name, ["GPU-l"]))
    # Either it is the registered name (and then needs that host's proof) or no name at all.
    err = assert_error(resp, 409 if _normal(name) else 400)
    assert err["code"] == ("host_exists" if _normal(name) else "validation_error")
    assert "hostname" in err["fields"]
    assert list(Host.objects.values_list("pk", "name")) == [(host.pk, "sec3-h1")]
    assert BootstrapToken.objects.get(token_hash=hash_token(token)).used_at is None


def _normal(name: str) -> bool:
    try:
        return host_name_normalise(name) == "sec3-h1"
    except ValueError:
        return False


def test_a_name_is_stored_in_its_one_form(client, region, triggered):
    resp = register(client, region, " GPU-Node-7.Example.COM. ", ["GPU-a"])
    assert resp.status_code == 200, resp.content
    assert Host.objects.get().name == "gpu-node-7.example.com"


def test_the_database_refuses_two_names_that_read_alike(db, region):
    Host.objects.create(name="sec3-h1", region=region, vcpus=8, memory_mib=1024)
    for name in ("SEC3-H1", " sec3-h1 "):
        with pytest.raises(IntegrityError), transaction.atomic():
            Host.objects.create(name=name, region=region, vcpus=8, memory_mib=1024)


def test_the_admin_and_the_agent_take_names_through_the_same_rule(db, region, rf, admin_user):
    h = Host.objects.create(name="h1", region=region, vcpus=8, memory_mib=1024)
    request = rf.get("/admin/")
    request.user = admin_user
    # The form the admin's change page really builds (its fields and readonly_fields).
    HostForm = admin.site._registry[Host].get_form(request, h)  # noqa: N806
    data = {"region": region.pk, "vcpus": 8, "memory_mib": 1024, "agent_version": "",
            "created_at_0": "2026-01-01", "created_at_1": "00:00:00"}
    form = HostForm(data={**data, "name": " Rack2-H1 "}, instance=h)
    assert form.is_valid(), form.errors
    form.save()
    assert Host.objects.get(pk=h.pk).name == "rack2-h1"
    Host.objects.create(name="rack2-h2", region=region, vcpus=8, memory_mib=1024)
    for bad in ("rack2_h1", "r\u0430ck2-h1", "rack2-h1\x00", "RACK2-H2 "):  # the last: taken
        form = HostForm(data={**data, "name": bad}, instance=h)
        assert not form.is_valid() and "name" in form.errors, bad
    assert Host.objects.get(pk=h.pk).name == "rack2-h1"
    cfg = dict(server="http://cp", bootstrap_token="t")
    assert AgentConfig(**cfg, hostname="Rack2-H1 ").validated().hostname == "rack2-h1"
    with pytest.raises(ConfigError, match="hostname"):
        AgentConfig(**cfg, hostname="rack2_h1").validated()


def test_the_migration_brings_existing_names_into_the_one_form(db, region):
    migration = importlib.import_module("agents.migrations.0008_host_names_normalised")
    kept = Host.objects.create(name="gpu-1", region=region, vcpus=8, memory_mib=1024)
    odd = {
        "GPU_2": "gpu-2",
        "Rack 3": "rack-3",
        "h\u00e9te": "h-te",
        "GPU-1.": None,  # reads like gpu-1, which keeps its name: this one yields
    }
    rows = {n: Host.objects.create(name=n, region=region, vcpus=8, memory_mib=1024) for n in odd}
    migration.forwards(django_apps, None)
    assert Host.objects.get(pk=kept.pk).name == "gpu-1"
    for name, want in odd.items():
        got = Host.objects.get(pk=rows[name].pk).name
        assert got == (want or f"gpu-1-{str(rows[name].pk)[:8]}"), name
        assert host_name_normalise(got) == got
    assert migration.repaired("\x00\x01", "abcdef0123", set()) == "host"


@pytest.mark.django_db(transaction=True)
def test_two_registrations_of_one_new_gpu_at_once_give_it_to_one_host(transactional_db, region, triggered):
    """The GPU is not yet in the table when both look: the second insert waits on the first's
    key and then fails. It was a 500 (an IntegrityError); now the refusal of a GPU of another
    host, and nothing of the second registration is kept. (Two registrations of one region
    are serialised today by the bootstrap token's row lock, which takes the region's row with
    it; this is the second line should that change. The first GPU is written here directly,
    its host committed before, so that only the GPU's key is held.)"""
    req = RegisterRequest.from_dict(body(new_token(region), "h2", ["GPU-z"]))
    outcome: list[object] = []

    def second() -> None:
        try:
            outcome.append(host_register(req=req))
        except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
            outcome.append(e)
        finally:
            connection.close()

    h1 = Host.objects.create(name="h1", region=region, vcpus=8, memory_mib=1024)
    with transaction.atomic():  # the first registration's GPU, not yet committed
        Gpu.objects.create(uuid="GPU-z", host=h1, index=0,
                           gpu_model=GpuModel.objects.get(code="H100"))
        thread = threading.Thread(target=second)
        thread.start()

        def waiting() -> bool:  # the second insert waits on the first's uncommitted key
            with connection.cursor() as cur:
                cur.execute("SELECT pg_stat_clear_snapshot()")  # else frozen for the transaction
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND datname = current_database()")
                return cur.fetchone()[0] > 0

        deadline = time.monotonic() + 30
        while not waiting():  # observed state, polled
            assert time.monotonic() < deadline, "the second registration never waited"
            time.sleep(0.05)
    thread.join(30)
    [e] = outcome
    assert isinstance(e, Conflict) and e.code == "gpu_owned_by_another_host", e
    assert gpus_of("h1") == ["GPU-z"] and not Host.objects.filter(name="h2").exists()
