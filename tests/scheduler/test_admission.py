"""The one admission answer, through every blocker, on every face (issue 28, deliverable 2).

One table: for each cause a launch can meet (the e-mail address unconfirmed, the balance used
up, a named hard-stop budget spent, a quota it can never fit, a quota full now, no free GPUs of
the model now, no host that could ever run it), the admission function names it, and the
console's cost box, the API's answer (its 4xx, or the new workload's waiting reason) and the
real `gpucloud` CLI against a live server say the same words.
"""
from __future__ import annotations

import html
import json
from decimal import Decimal

import pytest

from billing.accounts import launch_blocks_refresh
from billing.models import Account, Budget
from gpucloud.catalogue.models import GpuModel, InstanceType, Quota, Region
from gpucloud.tenancy.models import EmailVerification
from scheduler.admission import launch_admission
from scheduler.core import blockers
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.services import WorkloadSpec, workload_launch
from tests.cli.test_cli import cli  # noqa: F401 (fixture: the real console script against the live server)
from tests.conftest import make_actor
from tests.scheduler.fleet import make_hosts


def _broke(actor) -> None:
    Account.objects.filter(tenant=actor.tenant).update(balance=0)
    launch_blocks_refresh(tenant_ids=[actor.tenant.pk])  # as the ledger services do after a posting


def email_unconfirmed(actor) -> None:
    # a self-service sign-up: its credit waits for the address, so the account stands at zero
    EmailVerification.objects.create(user=actor.user, email=actor.user.email, tenant=actor.tenant)
    _broke(actor)


def budget_spent(actor) -> None:
    Budget.objects.create(tenant=actor.tenant, name="lab-cap", monthly_amount=Decimal("50"), hard_stop=True)
    Budget.objects.create(tenant=actor.tenant, name="org-cap", monthly_amount=Decimal("900"), hard_stop=True)
    Account.objects.filter(tenant=actor.tenant).update(budget_blocked=True)  # as budgets_check sets it
    launch_blocks_refresh(tenant_ids=[actor.tenant.pk])


def h100_quota(actor) -> None:
    Quota.objects.create(tenant=actor.tenant, gpu_model=GpuModel.objects.get(code="H100"), max_gpus=8)


def quota_in_use(actor) -> None:
    h100_quota(actor)
    workload_launch(tenant=actor.tenant, spec=WorkloadSpec(
        kind="instance", name="busy", instance_type="h100.2x", region="us-east-1", image="ubuntu:24.04"))
    run_cycle(region_id=Region.objects.get(code="us-east-1").pk)  # it holds 2 of the 8


def host_full(actor) -> None:
    other = make_actor("olga@other.test", tenant_name="Other")
    workload_launch(tenant=other.tenant, spec=WorkloadSpec(
        kind="instance", name="all-of-it", instance_type="h100.8x", region="us-east-1", image="ubuntu:24.04"))
    run_cycle(region_id=Region.objects.get(code="us-east-1").pk)  # another tenant holds every GPU


# (cause, set-up, type, region, the words every face shows, HTTP status of the launch)
TABLE = [
    ("email_unconfirmed", email_unconfirmed, "h100.1x", "us-east-1",
     "Your e-mail address is not confirmed yet, so your sign-up credit has not been granted: open the link we "
     "sent you, then launch.", 402),
    ("insufficient_credit", _broke, "h100.1x", "us-east-1",
     "Your balance is used up: add credit to launch.", 402),
    ("budget_exceeded", budget_spent, "h100.1x", "us-east-1",
     'The hard-stop budget "lab-cap" is spent this month and stops new launches', 402),
    ("quota_exceeded", lambda a: Quota.objects.create(tenant=a.tenant, gpu_model=GpuModel.objects.get(code="H100"),
                                                      max_gpus=4), "h100.8x", "us-east-1",
     "quota: this asks for 8 H100 GPUs but the quota allows 4", 400),
    ("quota_full", quota_in_use, "h100.8x", "us-east-1",
     "quota: 2 of 8 H100 GPUs in use and this needs 8 more", 201),
    ("no_capacity", host_full, "h100.2x", "us-east-1", "no host in us-east-1 has 2 free H100 GPUs", 201),
    ("unsatisfiable", lambda a: None, "h100.2x", "ap-northeast-1",
     "No host in ap-northeast-1 can ever run h100.2x: the fleet has no H100 GPUs in ap-northeast-1.", 409),
]


@pytest.mark.parametrize("cause, setup, type_code, region, said, status", TABLE, ids=[row[0] for row in TABLE])
def test_every_face_names_the_same_blocker(cause, setup, type_code, region, said, status, alice, catalog, cli):
    make_hosts(region="us-east-1", n=1)  # 8 H100s: free unless the case takes them
    setup(alice)
    it, reg = InstanceType.objects.get(code=type_code), Region.objects.get(code=region)

    # the rule: the console counts what would start now and hands it in
    from agents.selectors import availability

    free = {a.region: a.available_now for a in availability(instance_types=[it], tenant=alice.tenant)}
    blocker = launch_admission(tenant=alice.tenant, instance_type=it, region=reg, available_now=free.get(region, 0))
    assert blocker is not None and blocker.code == cause, blocker
    assert said in blockers.words(blocker)

    # the console's cost box beside the launch form: the cause, its words, and the button
    client = _signed_in(alice)
    box = client.get("/console/launch/price", {"instance_type": type_code, "region": region}).content.decode()
    shown = html.unescape(" ".join(box.split('id="launch-availability"', 1)[1].split("</p>", 1)[0].split()))
    assert f'data-cause="{cause}"' in shown and said in shown, shown
    assert ("disabled" in box.split('id="launch-submit"', 1)[1].split(">", 1)[0]) == blocker.refused

    # the real CLI against the live server: a refusal is the API's error (exit 1), a wait its reason
    assert cli("login", "--url", cli.url, "--api-key", alice.key).returncode == 0
    launched = cli("launch", type_code, "--region", region, "--name", f"try-{cause.replace('_', '-')}")
    if status != 201:
        assert launched.returncode == 1 and said in " ".join(launched.stderr.split()), launched.both
        # the API's error, the same cause and words; nothing was created
        r = alice.client().post("/api/v1/instances", {"name": "api-try", "instance_type": type_code,
                                                      "region": region, "image": "ubuntu:24.04"}, format="json")
        error = r.json()["error"]
        assert (r.status_code, error["code"]) == (status, cause) and said in error["message"], r.content
        assert not Workload.objects.filter(tenant=alice.tenant, name__in=["api-try", f"try-{cause}"]).exists()
        return
    assert launched.returncode == 0, launched.both
    run_cycle(region_id=reg.pk)  # the scheduler's own queue reason
    shown_cli = cli("show", f"try-{cause.replace('_', '-')}", "--json")
    w = json.loads(shown_cli.stdout)
    assert w["state"] == "pending" and w["reason"].startswith(said), w
    api = alice.client().get(f"/api/v1/instances/{w['id']}").json()
    assert api["reason"] == w["reason"]
    table = cli("show", f"try-{cause.replace('_', '-')}")
    assert said in " ".join(table.stdout.split()), table.both


def test_a_quota_full_now_is_the_first_reason_of_the_new_workload(alice, catalog):
    """The launch's own answer names the quota at once, before any scheduling cycle ran."""
    make_hosts(region="us-east-1", n=1)
    quota_in_use(alice)
    r = alice.client().post("/api/v1/instances", {"name": "more", "instance_type": "h100.8x", "region": "us-east-1",
                                                  "image": "ubuntu:24.04"}, format="json")
    assert r.status_code == 201 and r.json()["reason"] == "quota: 2 of 8 H100 GPUs in use and this needs 8 more"


def test_confirming_the_address_grants_the_credit_and_lifts_the_block(alice, catalog):
    from gpucloud.tenancy.services import email_verification_token, email_verify

    email_unconfirmed(alice)
    alice.tenant.refresh_from_db()
    assert (alice.tenant.launch_blocked, alice.tenant.launch_blocked_reason) == (True, "email_unconfirmed")
    email_verify(token=email_verification_token(user=alice.user))  # the link in the e-mail
    alice.tenant.refresh_from_db()
    assert (alice.tenant.launch_blocked, alice.tenant.launch_blocked_reason) == (False, "")


def _signed_in(actor):
    from django.test import Client

    client = Client()
    client.force_login(actor.user)
    return client
