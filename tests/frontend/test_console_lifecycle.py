"""The console's lifecycle and availability, through Django's test client (no browser): Start on a
stopped instance, "ran on", the Launch button disabled with the reason, the catalogue's available-first
order and filter, the landing page showing only what can be rented, the favicon."""
from __future__ import annotations

import pytest
from django.test import Client

from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.services import WorkloadSpec, workload_launch, workload_stop
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_instances_api import region_id

pytestmark = pytest.mark.django_db


def signed_in(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


def test_a_stopped_instance_shows_start_and_where_it_ran_and_starts_again(alice, victor, fleet):
    w = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="instance", name="box", instance_type="h100.1x", region="us-east-1", image="ubuntu:24.04"))
    run_cycle(region_id=region_id())
    workload_stop(workload=w)
    page = signed_in(alice).get(f"/console/instances/{w.pk}/").content.decode()
    assert f'action="/console/instances/{w.pk}/start"' in page and "Remove from list" not in page
    assert "<dt>Ran on</dt>" in page and fleet[0].name in page  # the record keeps where it ran
    # a viewer sees no Start, and a forged one is refused
    assert "/start" not in signed_in(victor).get(f"/console/instances/{w.pk}/").content.decode()
    assert signed_in(victor).post(f"/console/instances/{w.pk}/start").status_code == 403
    response = signed_in(alice).post(f"/console/instances/{w.pk}/start", follow=True)
    assert Workload.objects.get(pk=w.pk).state == State.PENDING
    assert "box is queued again" in response.content.decode()
    # starting what is not stopped says why, and changes nothing
    again = signed_in(alice).post(f"/console/instances/{w.pk}/start", follow=True).content.decode()
    assert "Could not start box: Only a stopped instance can start; box is pending." in again


def test_the_launch_button_is_disabled_with_the_reason_where_no_host_could_run_it(alice, fleet):
    client = signed_in(alice)
    html = client.get("/console/launch/price", {"instance_type": "h100.1x", "region": "us-west-2"}).content.decode()
    assert 'id="launch-submit" disabled' in html and "the fleet has no H100 GPUs in us-west-2" in html
    html = client.get("/console/launch/price", {"instance_type": "h100.1x", "region": "us-east-1"}).content.decode()
    assert 'id="launch-submit">' in html and "8 fit on free GPUs in us-east-1 now" in html


def test_the_catalogue_lists_what_would_start_now_first_and_filters_on_it(alice, fleet):
    client = signed_in(alice)
    rows = client.get("/console/catalogue/", {"sort": "price", "never": "1"}).context["rows"]
    free = [r["available"] > 0 for r in rows]
    assert free == sorted(free, reverse=True) and free[0] and not free[-1]
    assert {r["type"].code for r in rows if r["available"]} == {"h100.1x", "h100.2x", "h100.4x", "h100.8x"}
    only = client.get("/console/catalogue/", {"available": "1"})
    assert [(r["type"].code, r["region"], r["available"]) for r in only.context["rows"]] == [
        ("h100.1x", "us-east-1", 8), ("h100.2x", "us-east-1", 4), ("h100.4x", "us-east-1", 2),
        ("h100.8x", "us-east-1", 1)]
    assert 'id="f-available" name="available" value="1" checked' in only.content.decode()


def test_the_landing_page_shows_only_what_can_be_rented_and_has_an_icon(catalog):
    assert "GPUs you can rent" in Client().get("/").content.decode()
    assert Client().get("/").context["rows"] == []  # no fleet yet: nothing to rent
    make_hosts(n=1, model="L40S", region="eu-central-1")
    response = Client().get("/")
    rows = {r["type"].code: (r["price"].region, r["free"]) for r in response.context["rows"]}
    assert set(rows) == {"l40s.1x", "l40s.2x", "l40s.4x", "l40s.8x", "l40s.eighth", "l40s.quarter", "l40s.half"}
    assert rows["l40s.8x"] == ("eu-central-1", 1)
    assert 'rel="icon" href="/static/frontend/favicon.svg"' in response.content.decode()
    icon = Client().get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"] == "/static/frontend/favicon.svg"


def test_the_job_list_shows_finished_jobs_with_a_filter_for_active_ones(alice, fleet):
    from scheduler.services import workload_transition

    done = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="job", name="done-job", instance_type="h100.1x", region="us-east-1", image="busybox"))
    run_cycle(region_id=region_id())
    done.refresh_from_db()
    assert workload_transition(workload=done, to=State.RUNNING)
    assert workload_transition(workload=done, to=State.SUCCEEDED, exit_code=0)
    workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="job", name="queued-job", instance_type="h100.8x", region="us-east-1", image="busybox"))
    client = signed_in(alice)
    shown = client.get("/console/jobs/")
    assert {w.name for w, _ in shown.context["rows"]} == {"done-job", "queued-job"}
    assert 'href="?show=active">Active only' in shown.content.decode()
    active = client.get("/console/jobs/", {"show": "active"})
    assert {w.name for w, _ in active.context["rows"]} == {"queued-job"}


def test_an_operator_without_a_tenant_is_sent_to_the_fleet_page_not_a_403(db):
    from django.contrib.auth import get_user_model

    operator = get_user_model().objects.create_superuser(username="ops@x.test", email="ops@x.test", password="pw")
    client = Client()
    client.force_login(operator)
    response = client.get("/console/")
    assert response.status_code == 302 and response["Location"] == "/admin/fleet/"
    assert client.get("/admin/fleet/").status_code == 200
    nobody = get_user_model().objects.create_user(username="n@x.test", email="n@x.test", password="pw")
    client.force_login(nobody)
    assert client.get("/console/").status_code == 403  # a user in no tenant still reads why


def test_a_draft_invoice_says_when_it_was_last_refreshed(alice, catalog):
    from django.utils import timezone

    from billing.services import invoice_refresh

    invoice = invoice_refresh(tenant_id=alice.tenant.pk, month=timezone.now().date())
    page = signed_in(alice).get(f"/console/invoices/{invoice.pk}/").content.decode()
    assert "Last refreshed" in page and invoice.updated_at.strftime("%Y-%m-%d %H:%M") in page
    body = alice.client().get(f"/api/v1/invoices/{invoice.pk}").json()
    assert body["status"] == "draft" and body["refreshed_at"]


def test_sign_in_asks_for_an_e_mail_address_and_says_so_when_it_fails(alice):
    page = Client().get("/console/signin/").content.decode()
    assert ">E-mail</label>" in page and "Username" not in page
    failed = Client().post("/console/signin/", {"username": "alice@acme.test", "password": "wrong"})
    assert "That e-mail address and password do not match an account." in failed.content.decode()


def test_launch_form_errors_show_all_at_once_beside_each_field_with_a_summary_and_the_input_kept(alice, fleet):
    from tests.frontend.test_console_views import LAUNCH

    response = signed_in(alice).post("/console/launch/", {**LAUNCH, "name": "", "image": "Not An Image!",
                                                          "ports": "22, 22", "env": "EPOCHS=3"})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert set(errors) >= {"name", "image", "ports"}, errors  # the form's own and the API's, together
    html = response.content.decode()
    summary = html.split('id="error-summary"', 1)[1].split("</div>", 1)[0]
    for label in ("Name", "Image", "Ports"):
        assert f">{label}</a>:" in summary, summary
    assert 'value="Not An Image!"' in html and "EPOCHS=3" in html  # what was typed stays
    assert not Workload.objects.exists()


def test_budget_form_errors_stand_beside_their_fields_with_the_input_kept(alice, catalog):
    response = signed_in(alice).post("/console/budgets/", {"name": "team-budget", "monthly_amount": "lots",
                                                           "thresholds": "50, 80", "webhook_url": "not a url"})
    assert response.status_code == 400
    errors = response.context["budget_form"].errors
    assert set(errors) == {"monthly_amount", "webhook_url"}, errors
    html = response.content.decode()
    assert 'id="error-summary"' in html and 'value="team-budget"' in html and 'value="lots"' in html
