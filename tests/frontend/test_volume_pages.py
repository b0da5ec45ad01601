"""The console's volume pages through Django's test client: create with errors next to the
fields and the input kept, grow, delete refused while attached, a viewer without controls."""
from __future__ import annotations

import pytest

from scheduler.services import WorkloadSpec, workload_launch, workload_stop
from tests.frontend.test_console_views import signed_in
from volumes.models import Volume

pytestmark = pytest.mark.django_db


def test_create_grow_and_delete_a_volume_from_the_console(alice, charlie, catalog, fleet):
    client = signed_in(alice)
    page = client.post("/console/volumes/", {"name": "bad name!", "region": "us-east-1", "size_gib": "0"})
    html = page.content.decode()
    assert page.status_code == 400 and not Volume.objects.exists()
    assert "Letters, digits" in html and "greater than or equal to 1" in html and 'value="bad name!"' in html
    made = client.post("/console/volumes/", {"name": "datasets", "region": "us-east-1", "size_gib": "100"})
    v = Volume.objects.get(name="datasets")
    assert made.status_code == 302 and made["Location"] == f"/console/volumes/{v.pk}/"
    listed = client.get("/console/volumes/").content.decode()
    assert "datasets" in listed and "100 of 1024 GiB of your quota in use" in listed
    assert client.post(f"/console/volumes/{v.pk}/", {"size_gib": "50"}).status_code == 400  # never shrinks
    assert client.post(f"/console/volumes/{v.pk}/", {"size_gib": "200"}).status_code == 302
    assert Volume.objects.get(pk=v.pk).size_gib == 200
    assert signed_in(charlie).get(f"/console/volumes/{v.pk}/").status_code == 404
    w = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="instance", name="box", instance_type="h100.1x", region="us-east-1", image="ubuntu:24.04",
        volumes=[{"volume": v.pk, "mount_path": "/workspace"}]))
    detail = client.get(f"/console/volumes/{v.pk}/").content.decode()
    assert "box</a> at <code>/workspace</code>" in detail and "Stop box first" in detail
    refused = client.post(f"/console/volumes/{v.pk}/delete", follow=True)
    assert "is attached to instance &#x27;box&#x27;" in refused.content.decode()
    assert Volume.objects.get(pk=v.pk).deleted_at is None
    workload_stop(workload=w)
    gone = client.post(f"/console/volumes/{v.pk}/delete", follow=True)
    assert "Deleted datasets" in gone.content.decode() and Volume.objects.get(pk=v.pk).deleted_at is not None


def test_a_viewer_sees_volumes_but_no_controls_and_cannot_forge_a_create(victor, catalog):
    client = signed_in(victor)
    page = client.get("/console/volumes/").content.decode()
    assert "Create a volume" not in page
    assert client.post("/console/volumes/", {"name": "x", "region": "us-east-1", "size_gib": "1"}).status_code == 403
    assert not Volume.objects.exists()


def test_the_launch_form_picks_a_volume_and_says_next_to_it_why_one_is_refused(alice, charlie, catalog, fleet):
    from scheduler.models import Workload
    from volumes.services import volume_create

    here = volume_create(tenant=alice.tenant, name="here", region="us-east-1", size_gib=10)
    far = volume_create(tenant=alice.tenant, name="far", region="eu-central-1", size_gib=10)
    theirs = volume_create(tenant=charlie.tenant, name="theirs", region="us-east-1", size_gib=10)
    client = signed_in(alice)
    form = client.get("/console/launch/", {"volume": str(here.pk), "region": "us-east-1"}).content.decode()
    assert f'<option value="{here.pk}" selected data-region="us-east-1">here — us-east-1, 10 GiB</option>' in form
    assert str(far.pk) in form and str(theirs.pk) not in form  # only the tenant's own
    assert 'name="mount_path" value="/workspace"' in form
    body = {"kind": "instance", "name": "box", "instance_type": "h100.1x", "region": "us-east-1",
            "template": "custom", "image": "ubuntu:24.04", "volume": str(far.pk), "mount_path": "/workspace"}
    refused = client.post("/console/launch/", body)
    html = refused.content.decode()
    assert refused.status_code == 400 and not Workload.objects.exists()
    beside = html[html.index('id="field-volume"'):]
    beside = beside[:beside.index("</ul>", beside.index("errorlist"))]
    assert "Volume &#x27;far&#x27; is in eu-central-1, not in us-east-1." in beside  # next to the picker
    assert 'value="/workspace"' in html  # the typed input kept
    assert client.post("/console/launch/", {**body, "volume": str(theirs.pk)}).status_code == 400  # not hers
    assert client.post("/console/launch/", {**body, "volume": str(here.pk), "mount_path": "/etc"}).status_code == 400
    assert not Workload.objects.exists()
    made = client.post("/console/launch/", {**body, "volume": str(here.pk), "mount_path": "/data"})
    w = Workload.objects.get(name="box")
    assert made.status_code == 302 and [(a.volume_id, a.mount_path) for a in w.volume_attachments.all()] == [
        (here.pk, "/data")]
