"""The console through Django's test client: permissions, isolation, bad input, audit.

Fast (no browser): the refusals and 404s the browser journey cannot cover exhaustively.
"""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from gpucloud.tenancy.models import ApiKey, AuditEvent
from scheduler.models import Workload
from scheduler.services import WorkloadSpec, workload_launch

LAUNCH = {
    "kind": "instance", "name": "train-1", "instance_type": "h100.1x", "region": "us-east-1",
    "template": "pytorch", "image": "pytorch/pytorch:2.4.0", "command": "sleep infinity",
    "env": "EPOCHS=3", "ssh_keys": "", "ports": "8888",
}


def signed_in(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


@pytest.fixture
def instance(alice, fleet):
    return workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="instance", name="alice-box", instance_type="h100.1x", region="us-east-1", image="ubuntu:24.04"))


def test_anonymous_visitor_is_sent_to_sign_in(db):
    response = Client().get("/console/instances/")
    assert response.status_code == 302
    assert response["Location"].startswith("/console/signin/?next=")


def test_signed_in_user_is_redirected_from_home_to_console(alice):
    response = signed_in(alice).get("/")
    assert response.status_code == 302 and response["Location"] == "/console/"


def test_every_page_renders_for_owner_and_viewer(alice, victor, instance):
    pages = ["/console/", "/console/catalogue/", "/console/instances/", "/console/instances/?show=all",
             f"/console/instances/{instance.pk}/", f"/console/instances/{instance.pk}/live",
             f"/console/instances/{instance.pk}/logs", "/console/jobs/", "/console/usage/",
             "/console/settings/api-keys/", "/console/settings/ssh-keys/", "/console/settings/members/",
             "/console/settings/quotas/"]
    for actor in (alice, victor):
        client = signed_in(actor)
        for url in pages:
            assert client.get(url).status_code == 200, (actor.user.email, url)
    assert signed_in(alice).get("/console/launch/").status_code == 200


def test_viewer_sees_no_launch_or_stop_controls(victor, instance):
    client = signed_in(victor)
    detail = client.get(f"/console/instances/{instance.pk}/").content.decode()
    assert reverse("console:instance_stop", args=[instance.pk]) not in detail
    assert reverse("console:instance_terminate", args=[instance.pk]) not in detail
    for url in ("/console/", "/console/catalogue/", "/console/instances/"):
        assert 'href="/console/launch/' not in client.get(url).content.decode(), url


def test_owner_sees_launch_and_stop_controls(alice, instance):
    detail = signed_in(alice).get(f"/console/instances/{instance.pk}/").content.decode()
    assert reverse("console:instance_stop", args=[instance.pk]) in detail
    assert 'href="/console/launch/' in signed_in(alice).get("/console/").content.decode()


def test_forged_launch_by_viewer_is_refused_and_creates_nothing(victor, catalog):
    client = Client(enforce_csrf_checks=False)
    client.force_login(victor.user)
    response = client.post("/console/launch/", LAUNCH)
    assert response.status_code == 403
    assert "Your role (viewer) does not allow workloads.launch." in response.content.decode()
    assert not Workload.objects.exists()


def test_forged_stop_and_terminate_by_viewer_are_refused(victor, instance):
    client = signed_in(victor)
    for action in ("stop", "terminate"):
        response = client.post(f"/console/instances/{instance.pk}/{action}")
        assert response.status_code == 403
    instance.refresh_from_db()
    assert instance.state == "pending" and instance.deleted_at is None
    assert not AuditEvent.objects.filter(action__in=["instance.stop", "instance.delete"]).exists()


def test_post_without_csrf_token_is_refused(alice, catalog):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice.user)
    assert client.post("/console/launch/", LAUNCH).status_code == 403
    assert not Workload.objects.exists()


def test_other_tenant_gets_404_on_every_instance_page(charlie, instance):
    client = signed_in(charlie)
    base = f"/console/instances/{instance.pk}/"
    for url in (base, base + "live", base + "metrics.json", base + "logs", f"/console/jobs/{instance.pk}/"):
        assert client.get(url).status_code == 404, url
    for action in ("stop", "terminate"):
        assert client.post(base + action).status_code == 404
    instance.refresh_from_db()
    assert instance.state == "pending"
    assert "alice-box" not in client.get("/console/instances/?show=all").content.decode()


def test_launch_queues_an_instance_audited_as_the_user_with_their_address(alice, fleet):
    response = signed_in(alice).post("/console/launch/", LAUNCH, REMOTE_ADDR="203.0.113.7")
    workload = Workload.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/console/instances/{workload.pk}/"
    assert (workload.state, workload.env, workload.ports, workload.command) == (
        "pending", {"EPOCHS": "3"}, [8888], ["/bin/sh", "-c", "sleep infinity"])
    event = AuditEvent.objects.get(action="instance.launch")
    assert (event.actor_user, event.source_ip) == (alice.user, "203.0.113.7")


def test_launch_carries_idle_auto_stop_for_instances(alice, fleet):
    signed_in(alice).post("/console/launch/", {**LAUNCH, "auto_stop_idle_minutes": "45"})
    assert Workload.objects.get().auto_stop_idle_minutes == 45


BAD_LAUNCHES = [  # (change to a good form, the field to blame, the message: the API's own words)
    ({"image": "Not An Image!"}, "image", "Not a container image reference."),
    ({"ports": "22, http"}, "ports", "A valid integer is required."),
    ({"ports": "22, 22"}, "ports", "Each port once."),
    ({"env": "1BAD=x"}, "env", "Invalid variable names: 1BAD."),
    ({"env": "no equals sign"}, "env", "Line 1 is not KEY=value."),
    ({"ssh_keys": "not a key"}, "ssh_keys", "Not an OpenSSH public key"),
    ({"name": ""}, "name", "This field is required."),
    ({"auto_stop_idle_minutes": "2"}, "auto_stop_idle_minutes", "greater than or equal to 5"),
    ({"instance_type": "h100.1x", "region": "ap-northeast-1", "spot": "on", "max_price": "0.0001"},
     "max_price", "Below the current spot price"),
]


def test_bad_launch_input_says_why_and_creates_nothing(alice, catalog):
    # One test over the table: seeding the catalogue once keeps the suite fast.
    client = signed_in(alice)
    for change, field, message in BAD_LAUNCHES:
        response = client.post("/console/launch/", {**LAUNCH, **change})
        assert response.status_code == 400, change
        assert message in response.content.decode(), change
        errors = response.context["form"].errors
        assert any(message in e for e in errors.get(field, [])), (change, errors)
    assert not Workload.objects.exists()
    spot = client.post("/console/launch/", {**LAUNCH, **BAD_LAUNCHES[-1][0]})
    assert "above your max price 0.0001/h" in spot.content.decode()  # the service's whole sentence


def test_launch_without_credit_says_so_in_plain_words(alice, catalog, fleet):
    from billing.accounts import launch_blocks_refresh
    from billing.models import Account

    Account.objects.filter(tenant=alice.tenant).update(balance=0)
    launch_blocks_refresh(tenant_ids=[alice.tenant.pk])  # as the ledger services do after a posting
    response = signed_in(alice).post("/console/launch/", LAUNCH)
    assert response.status_code == 400
    assert "Your balance is used up: add credit to launch." in response.content.decode()
    assert not Workload.objects.exists()


def test_api_rejects_the_same_image_with_the_same_message(alice, catalog):
    body = {"name": "x", "instance_type": "h100.1x", "region": "us-east-1", "image": "Not An Image!"}
    answer = alice.client().post("/api/v1/instances", body, format="json").json()
    assert answer["error"]["fields"]["image"] == ["Not a container image reference."]


def test_signup_creates_an_account_and_a_tenant_and_signs_in(db):
    client = Client()
    response = client.post("/console/signup/", {"email": "new@example.test", "password": "a long passphrase 42",
                                                "tenant_name": "Newco", "name": "Nia New"})
    assert response.status_code == 302
    page = client.get("/console/").content.decode()
    assert "Newco" in page and "new@example.test" in page
    again = Client().post("/console/signup/", {"email": "new@example.test", "password": "a long passphrase 42",
                                               "tenant_name": "Other"})
    assert "An account with this email already exists." in again.content.decode()
    weak = Client().post("/console/signup/", {"email": "weak@example.test", "password": "123", "tenant_name": "W"})
    assert "This password is too short." in weak.content.decode()


def test_api_key_secret_is_shown_once_and_works_against_the_api(alice):
    client = signed_in(alice)
    response = client.post("/console/settings/api-keys/", {"name": "ci", "scopes": ["read", "write"]})
    secret = response.context["created"]["secret"]
    assert secret in response.content.decode() and response["Cache-Control"] == "no-store"
    assert secret not in client.get("/console/settings/api-keys/").content.decode()
    assert Client().get("/api/v1/quotas", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 200
    key = ApiKey.objects.get(name="ci")
    client.post(f"/console/settings/api-keys/{key.pk}/revoke")
    assert Client().get("/api/v1/quotas", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code == 401


def test_viewer_cannot_mint_a_write_key(victor):
    client = signed_in(victor)
    assert client.post("/console/settings/api-keys/", {"name": "x", "scopes": ["write"]}).status_code == 403


def test_member_cannot_revoke_someone_elses_key(alice, bob):
    theirs = ApiKey.objects.get(created_by=alice.user)
    assert signed_in(bob).post(f"/console/settings/api-keys/{theirs.pk}/revoke").status_code == 403
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_tenant_switch_changes_what_the_pages_show(alice, charlie):
    from gpucloud.tenancy.models import Membership

    Membership.objects.create(tenant=charlie.tenant, user=alice.user, role="viewer")
    client = signed_in(alice)
    assert "Acme" in client.get("/console/").content.decode()
    client.post("/console/tenant/", {"tenant": str(charlie.tenant.pk)})
    page = client.get("/console/").content.decode()
    assert "<h1>Globex</h1>" in page
    assert client.post("/console/launch/", LAUNCH).status_code == 403  # a viewer in Globex


def test_ssh_keys_are_checked_like_the_launch_api_and_offered_at_launch(alice, catalog):
    client = signed_in(alice)
    bad = client.post("/console/settings/ssh-keys/", {"name": "laptop", "public_key": "hello"})
    assert "Not an OpenSSH public key" in bad.content.decode()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 alice@laptop"
    client.post("/console/settings/ssh-keys/", {"name": "laptop", "public_key": key})
    launch = client.get("/console/launch/").content.decode()
    assert "laptop" in launch


def test_metrics_endpoint_answers_uplot_shaped_json(alice, instance):
    data = signed_in(alice).get(f"/console/instances/{instance.pk}/metrics.json").json()
    assert data == {"t": [], "gpus": [], "step": 2, "state": "pending"}


def test_launch_price_partial_shows_the_hourly_cost(alice, catalog):
    html = signed_in(alice).get("/console/launch/price", {"instance_type": "h100.8x", "region": "us-east-1",
                                                          "spot": "on"}).content.decode()
    assert "19.92/h" in html and "8.96/h" in html and "You pay 8.96 an hour" in html


def test_launch_box_says_whether_the_type_starts_now_waits_or_is_refused(alice, catalog):
    from agents.models import Gpu
    from tests.scheduler.fleet import make_hosts

    make_hosts(region="us-east-1", n=1)  # 8 H100s
    client = signed_in(alice)

    def box(region: str, instance_type: str = "h100.2x") -> str:
        html = client.get("/console/launch/price", {"instance_type": instance_type, "region": region}).content.decode()
        return " ".join(html.split("launch-availability", 1)[1].split())

    assert "4 fit on free GPUs in us-east-1 now: it starts within seconds." in box("us-east-1")
    tokyo = box("ap-northeast-1")
    assert ("No host in ap-northeast-1 can ever run h100.2x: the fleet has no H100 GPUs in ap-northeast-1. "
            "A launch is refused.") in tokyo
    assert "Free now in us-east-1 (4)." in tokyo
    assert ("No host in us-east-1 can ever run a100.quarter: the fleet has no A100 GPUs in us-east-1. A launch "
            "is refused.") in box("us-east-1", "a100.quarter")
    Gpu.objects.update(whole=True, used_milli=1000)  # all booked
    assert ("no host in us-east-1 has 2 free H100 GPUs. A launch waits in the queue until GPUs free up."
            in box("us-east-1"))
    Gpu.objects.update(whole=False, used_milli=0, healthy=False)  # all broken: the scheduler counts none
    assert "No host in us-east-1 can ever run h100.2x: the fleet has no H100 GPUs in us-east-1." in box("us-east-1")


def test_launch_form_picks_the_region_where_the_type_fits_now(alice, catalog):
    from tests.scheduler.fleet import make_hosts

    client = signed_in(alice)
    assert client.get("/console/launch/", {"type": "h100.1x"}).context["form"].initial["region"] == ""
    make_hosts(region="eu-north-1", n=1)
    response = client.get("/console/launch/", {"type": "h100.1x"})
    assert response.context["form"].initial["region"] == "eu-north-1"
    assert 'value="eu-north-1" selected' in response.content.decode()
    # a region the user asked for is kept, whatever fits where
    assert client.get("/console/launch/", {"type": "h100.1x", "region": "us-east-1"}).context["form"].initial[
        "region"] == "us-east-1"


def test_catalogue_counts_what_fits_on_ready_hosts_now(alice, catalog):
    from agents.models import Gpu, Host
    from gpucloud.catalogue.models import GpuModel, Region

    host = Host.objects.create(name="h1", region=Region.objects.get(code="us-east-1"), vcpus=192,
                               memory_mib=2048 * 1024)
    h100 = GpuModel.objects.get(code="H100")
    for i in range(8):
        Gpu.objects.create(uuid=f"GPU-{i}", host=host, index=i, gpu_model=h100,
                           **({"used_milli": 1000, "whole": True} if i < 3 else {}))
    response = signed_in(alice).get("/console/catalogue/", {"gpu": "H100", "region": "us-east-1", "sort": "gpu"})
    free = {r["type"].code: r["available"] for r in response.context["rows"]}
    assert free == {"h100.1x": 5, "h100.2x": 2, "h100.4x": 1, "h100.8x": 0}


def test_catalogue_tells_busy_from_never_and_hides_never_behind_a_filter(alice, charlie, catalog):
    from scheduler.cycle import run_cycle
    from scheduler.services import WorkloadSpec, workload_launch
    from tests.scheduler.fleet import make_hosts

    host = make_hosts(region="us-east-1", n=1)[0]
    workload_launch(tenant=charlie.tenant, spec=WorkloadSpec(
        kind="instance", name="half", instance_type="h100.4x", region="us-east-1", image="ubuntu:24.04"))
    run_cycle(region_id=host.region_id)  # 4 of the 8 H100s taken
    client = signed_in(alice)
    response = client.get("/console/catalogue/", {"gpu": "H100"})
    rows = {(r["type"].code, r["region"]): r["availability"] for r in response.context["rows"]}
    assert rows == {("h100.1x", "us-east-1"): "available", ("h100.2x", "us-east-1"): "available",
                    ("h100.4x", "us-east-1"): "available", ("h100.8x", "us-east-1"): "busy"}
    html = response.content.decode()
    assert 'data-availability="busy"' in html and "busy: queues" in html
    hidden = response.context["never_hidden"]
    assert hidden > 0 and f"{hidden} offers this fleet can never run are hidden" in " ".join(html.split())
    shown = client.get("/console/catalogue/", {"gpu": "H100", "never": "1"})
    never = [r for r in shown.context["rows"] if r["availability"] == "never"]
    assert len(never) == hidden and shown.context["never_hidden"] == 0
    assert [r["availability"] for r in shown.context["rows"]][-len(never):] == ["never"] * len(never)  # last
    row = shown.content.decode().split('data-type="h100.8x" data-region="us-west-2"', 1)[1].split("</tr>", 1)[0]
    assert "never here" in row and "Launch</a>" not in row  # no Launch link for what a launch refuses


def test_launch_form_opens_on_what_can_run_now(alice, catalog):
    from tests.scheduler.fleet import make_hosts

    client = signed_in(alice)
    make_hosts(region="eu-north-1", n=1, model="L40S", gpus=4)
    initial = client.get("/console/launch/").context["form"].initial
    # the first type of the form's list that would start now, where it would (not a100.quarter in
    # ap-northeast-1, the list's first, which no host here can run)
    assert (initial["instance_type"], initial["region"]) == ("l40s.eighth", "eu-north-1")
    price = client.get("/console/launch/").context["price"]
    assert price["blocker"] is None and price["fits_now"] > 0
    # what the user asked for is kept
    asked = client.get("/console/launch/", {"type": "h100.1x", "region": "us-east-1"}).context["form"].initial
    assert (asked["instance_type"], asked["region"]) == ("h100.1x", "us-east-1")


def test_volume_form_opens_on_a_region_with_hosts(alice, catalog):
    from tests.scheduler.fleet import make_hosts

    client = signed_in(alice)
    make_hosts(region="eu-north-1", n=1)
    form = client.get("/console/volumes/").context["form"]
    assert form.initial["region"] == "eu-north-1"
    assert form.fields["region"].choices[0][0] == "eu-north-1"
    assert "no hosts yet" in dict(form.fields["region"].choices)["ap-northeast-1"]


def test_an_admin_invites_and_the_invitee_joins_from_the_console(alice, charlie):
    response = signed_in(alice).post("/console/settings/members/", {"email": "charlie@globex.test",
                                                                    "role": "member"})
    token = response.context["invited"]["token"]
    assert token in response.content.decode()
    # the link carries the token in its fragment, which no server (nor its access log) ever sees
    assert f"/console/invitations/accept/#token={token}" in response.content.decode()
    assert "?token=" not in response.content.decode()
    client = signed_in(charlie)
    wrong = client.post("/console/invitations/accept/", {"token": "inv_wrong"})
    assert "This invitation does not exist, has expired or was used." in wrong.content.decode()
    assert client.post("/console/invitations/accept/", {"token": token}).status_code == 302
    assert "<h1>Acme</h1>" in client.get("/console/").content.decode()
    event = AuditEvent.objects.get(action="invitation.accept")
    assert event.actor_user == charlie.user


def test_a_viewer_cannot_invite_or_change_roles(victor, bob):
    client = signed_in(victor)
    assert client.post("/console/settings/members/", {"email": "x@y.test", "role": "viewer"}).status_code == 403
    assert client.post(f"/console/settings/members/{bob.membership.pk}/role", {"role": "owner"}).status_code == 403
    bob.membership.refresh_from_db()
    assert bob.membership.role == "member"


def test_the_console_refuses_an_internal_webhook_url(alice, catalog):
    from billing.models import Budget

    resp = signed_in(alice).post("/console/budgets/", {"name": "b", "monthly_amount": "10", "thresholds": "50",
                                                       "webhook_url": "https://169.254.169.254/latest/meta-data/"},
                                 follow=True)
    assert not Budget.objects.exists()
    assert "169.254.169.254 is a link-local, multicast, reserved or metadata address" in resp.content.decode()


def test_the_invitation_page_takes_no_token_from_a_url(charlie):
    # signed out: the page itself (a redirect to sign-in would drop the link's fragment), no form
    page = Client().get("/console/invitations/accept/")
    assert page.status_code == 200 and page.context["form"] is None
    assert 'href="/console/signin/?next=/console/invitations/accept/"' in page.content.decode()
    # a token in the query (an old link, already in some log) is not used
    page = signed_in(charlie).get("/console/invitations/accept/", {"token": "inv_from_a_log"})
    assert "inv_from_a_log" not in page.content.decode()
