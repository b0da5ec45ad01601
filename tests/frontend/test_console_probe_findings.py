"""Issue 27's console findings as the probe ran them (each failed on the code before the fix).

1. A viewer's plain GET ran console actions (stop, start, terminate, delete, revoke, remove),
   and a cross-site link ran them with the owner's session (`SameSite=Lax` cookies go along on
   a top-level GET). Now every action is POST-only: 405, nothing changed.
8. A NUL character in the launch form's instance type or region was a 500.
The sweeps that hold these by class: test_console_routes.py and test_console_forms.py.
"""
from __future__ import annotations

import pytest
from django.urls import reverse

from billing.models import Budget
from gpucloud.tenancy.models import ApiKey
from scheduler.choices import State
from scheduler.models import JobArray, Workload
from tests.frontend.console_world import CROSS_SITE, _signed_in, world  # noqa: F401

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------- the reproductions


def _still_there(world, name: str) -> bool:
    row = world.pks[name]
    if isinstance(row, Workload):
        before = row.state
        row.refresh_from_db()
        return row.state == before and row.deleted_at is None
    if isinstance(row, ApiKey):
        row.refresh_from_db()
        return row.revoked_at is None
    if isinstance(row, JobArray):
        return not Workload.objects.filter(array=row, state=State.STOPPING).exists()
    model = type(row)
    return model.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize("name", [
    "instance_stop", "instance_start", "instance_terminate", "job_stop", "job_terminate", "job_array_stop",
    "group_delete", "alarm_delete", "budget_delete", "api_key_revoke", "member_remove",
])
def test_a_viewer_s_get_on_an_action_is_a_405_and_changes_nothing(world, name):  # noqa: F811
    resp = _signed_in(world.victor).get(reverse(f"console:{name}", args=[world.pks[name].pk]))
    assert resp.status_code == 405
    assert resp["Allow"] == "POST"
    assert _still_there(world, name)


def test_a_cross_site_link_to_terminate_with_the_owner_s_session_deletes_nothing(world):  # noqa: F811
    instance = world.pks["instance_terminate"]
    url = reverse("console:instance_terminate", args=[instance.pk])
    resp = _signed_in(world.alice, csrf=True).get(url, **CROSS_SITE)
    assert resp.status_code == 405
    instance.refresh_from_db()
    assert instance.deleted_at is None


def test_the_owner_s_own_post_with_the_token_still_acts(world):  # noqa: F811
    """The refusals above are not a console that refuses everything: the form's POST works."""
    client = _signed_in(world.alice, csrf=True)
    page = client.get(reverse("console:usage"))
    token = page.cookies["csrftoken"].value if "csrftoken" in page.cookies else client.cookies["csrftoken"].value
    budget = world.pks["budget_delete"]
    resp = client.post(reverse("console:budget_delete", args=[budget.pk]), {"csrfmiddlewaretoken": token})
    assert resp.status_code == 302
    assert not Budget.objects.filter(pk=budget.pk).exists()


@pytest.mark.parametrize("field", ["instance_type", "region"])
def test_a_nul_in_the_launch_form_s_type_or_region_is_a_form_error_not_a_500(world, field):  # noqa: F811
    launch = {"kind": "instance", "name": "train-1", "instance_type": "h100.1x", "region": "us-east-1",
              "template": "pytorch", "image": "pytorch/pytorch:2.4.0", "command": "sleep infinity"}
    client = _signed_in(world.alice)
    before = Workload.objects.count()
    resp = client.post("/console/launch/", {**launch, field: launch[field] + "\x00"})
    assert resp.status_code == 400
    assert "Null characters are not allowed." in resp.content.decode()
    assert Workload.objects.count() == before
