"""The console offers job arrays (issue 28): a form that submits N tasks through the API's
serializer and the arrays service; CSRF, the launch permission, bad input changing nothing."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.models import JobArray, Workload

pytestmark = pytest.mark.django_db

ARRAY = {"name": "frames", "count": "3", "instance_type": "h100.1x", "region": "us-east-1", "template": "custom",
         "image": "busybox", "command": "echo $GPUCLOUD_ARRAY_INDEX", "env": "SCENE=7", "queue": "render",
         "max_retries": "1"}


def signed_in(actor, **kw) -> Client:
    client = Client(**kw)
    client.force_login(actor.user)
    return client


def test_an_array_is_submitted_from_the_console_as_the_api_would(alice, catalog):
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1, gpus=8)
    web = signed_in(alice)
    jobs = web.get(reverse("console:jobs")).content.decode()
    assert reverse("console:job_array_create") in jobs  # offered beside "Submit a job"
    form = web.get(reverse("console:job_array_create"))
    assert form.status_code == 200 and 'name="count"' in form.content.decode()
    assert 'name="ports"' not in form.content.decode()  # what only instances have is left out
    done = web.post(reverse("console:job_array_create"), ARRAY)
    [array] = JobArray.objects.filter(tenant=alice.tenant)
    assert done.status_code == 302 and done["Location"] == f"{reverse('console:jobs')}?array={array.pk}"
    tasks = list(Workload.objects.filter(array=array).order_by("array_index"))
    assert (array.name, array.count, len(tasks)) == ("frames", 3, 3)
    assert [t.array_index for t in tasks] == [0, 1, 2]
    assert all(t.kind == "job" and t.queue == "render" and t.max_retries == 1 and t.env["SCENE"] == "7"
               for t in tasks)
    listed = web.get(done["Location"]).content.decode()
    assert "frames" in listed


@pytest.mark.parametrize(("change", "field", "said"), [
    ({"count": "0"}, "count", "greater than or equal to 1"),
    ({"count": "10001"}, "count", "less than or equal to 10000"),
    ({"instance_type": "nope.1x"}, "instance_type", "valid choice"),
    ({"env": "NOEQUALS"}, "env", "KEY=value"),
])
def test_bad_input_says_why_and_submits_nothing(alice, catalog, change, field, said):
    r = signed_in(alice).post(reverse("console:job_array_create"), {**ARRAY, **change})
    assert r.status_code == 400 and said in r.content.decode()
    assert not Workload.objects.exists() and not JobArray.objects.exists()


def test_a_viewer_may_not_submit_and_a_post_needs_its_csrf_token(alice, victor, catalog):
    assert signed_in(victor).post(reverse("console:job_array_create"), ARRAY).status_code == 403
    assert signed_in(alice, enforce_csrf_checks=True).post(reverse("console:job_array_create"),
                                                           ARRAY).status_code == 403
    assert not JobArray.objects.exists()
