"""Long lists page, the catalogue sorts by its column headers, invoices read and download.

Django's test client (no browser) except the last tests, which click and tab through the
catalogue headers in Chromium and check the paged pages on a 375 px phone.
"""
from __future__ import annotations

import csv
import io
from datetime import date, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from billing import services as billing_services
from frontend.views import PAGE_SIZE
from scheduler.choices import State
from tests.billing.helpers import at, make_run, set_price
from tests.frontend.conftest import horizontal_overflow, shot, sign_in


def signed_in(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


def names(response) -> list[str]:
    return [w.name for w, _ in response.context["rows"]]


# ------------------------------------------------------------------ pagination


@pytest.fixture
def many_instances(alice, catalog):
    """PAGE_SIZE + 5 pending instances and 3 stopped ones, created a minute apart (newest first in lists)."""
    start = at(2025, 3, 1)
    pending = [make_run(alice, name=f"box-{i:02d}", transitions=[(start + timedelta(minutes=i), State.PENDING)])
               for i in range(PAGE_SIZE + 5)]
    stopped = [make_run(alice, name=f"old-{i}", transitions=[
        (start - timedelta(days=1, minutes=i), State.PENDING), (start - timedelta(days=1), State.RUNNING),
        (start - timedelta(hours=20), State.STOPPED)]) for i in range(3)]
    return pending, stopped


def test_instance_list_pages_and_its_links_keep_the_filter(alice, many_instances):
    pending, stopped = many_instances
    client = signed_in(alice)
    first = client.get("/console/instances/")
    assert first.status_code == 200
    assert len(names(first)) == PAGE_SIZE
    assert names(first)[0] == f"box-{PAGE_SIZE + 4:02d}"  # newest first
    pager = first.context["pager"]
    assert (pager["number"], pager["num_pages"], pager["count"]) == (1, 2, PAGE_SIZE + 5)
    html = first.content.decode()
    assert f"1–{PAGE_SIZE} of {PAGE_SIZE + 5} instances · page 1 of 2" in html
    assert 'href="?show=active&amp;page=2"' not in html and 'href="?page=2"' in html
    second = client.get("/console/instances/", {"page": 2})
    assert set(names(first)) | set(names(second)) == {w.name for w in pending}
    assert not set(names(first)) & set(names(second))
    assert 'aria-current="page"' in second.content.decode()

    # the ended ones count on "show all", and the page links keep show=all
    everything = client.get("/console/instances/", {"show": "all"})
    assert everything.context["pager"]["count"] == PAGE_SIZE + 8
    page_html = everything.content.decode()
    assert 'href="?show=all&amp;page=2"' in page_html
    # the rows poll the page they show, with the filter
    assert 'hx-get="/console/instances/?show=all"' in page_html
    last = client.get("/console/instances/", {"show": "all", "page": 2}, HTTP_HX_REQUEST="true")
    assert set(names(last)) >= {w.name for w in stopped}
    assert 'href="?show=all&amp;page=1"' in last.content.decode()
    full = client.get("/console/instances/", {"show": "all", "page": 2}).content.decode()
    assert 'hx-get="/console/instances/?show=all&amp;page=2"' in full


def test_a_page_past_the_end_says_so_and_a_bad_number_is_page_one(alice, many_instances):
    client = signed_in(alice)
    beyond = client.get("/console/instances/", {"page": 9, "show": "all"})
    assert beyond.status_code == 200 and names(beyond) == []
    html = beyond.content.decode()
    assert f"Page 9 is empty: the {PAGE_SIZE + 8} instances fit on 2 pages." in html
    assert 'href="?page=1&amp;show=all"' in html or 'href="?show=all&amp;page=1"' in html
    assert "No instances yet" not in html
    assert names(client.get("/console/instances/", {"page": "x"}))[0] == f"box-{PAGE_SIZE + 4:02d}"
    assert client.get("/console/instances/", {"page": "-3"}).context["pager"]["number"] == 1
    # an empty list on page 1 keeps its own words
    assert "No batch jobs yet." in client.get("/console/jobs/", {"show": "all"}).content.decode()
    assert "Page 2 is empty: there are no batch jobs here." in client.get(
        "/console/jobs/", {"show": "all", "page": 2}).content.decode()


def test_job_list_pages_too(alice, catalog):
    for i in range(PAGE_SIZE + 1):
        make_run(alice, kind="job", name=f"job-{i:02d}", transitions=[(at(2025, 3, 1) + timedelta(minutes=i),
                                                                       State.PENDING)])
    client = signed_in(alice)
    assert len(names(client.get("/console/jobs/"))) == PAGE_SIZE
    assert names(client.get("/console/jobs/", {"page": 2})) == ["job-00"]


def test_api_keys_page(alice):
    from gpucloud.tenancy.services import api_key_create

    for i in range(PAGE_SIZE):  # alice already has one: PAGE_SIZE + 1 in all
        api_key_create(membership=alice.membership, name=f"key-{i:02d}", scopes=["read"])
    client = signed_in(alice)
    first = client.get("/console/settings/api-keys/")
    assert len(first.context["keys"]) == PAGE_SIZE and first.context["pager"]["count"] == PAGE_SIZE + 1
    second = client.get("/console/settings/api-keys/", {"page": 2})
    assert [k.name for k in second.context["keys"]] == ["alice@acme.test key"]  # the oldest
    assert "Page 3 is empty" in client.get("/console/settings/api-keys/", {"page": 3}).content.decode()
    # creating a key from page 2 still works and shows the secret once
    created = client.post("/console/settings/api-keys/?page=2", {"name": "ci", "scopes": ["read"]})
    assert created.status_code == 200 and created.context["created"]["secret"].startswith("gpc_")


def test_invoices_page_on_the_usage_page(alice, charlie):
    month = date(2023, 1, 1)
    for _ in range(PAGE_SIZE + 2):
        billing_services.invoice_refresh(tenant_id=alice.tenant.pk, month=month)
        month = billing_services.next_month(month)
    client = signed_in(alice)
    first = client.get("/console/usage/")
    assert [i.period_start for i in first.context["invoices"]][:2] == [date(2025, 3, 1), date(2025, 2, 1)]
    assert 'href="?page=2#invoices"' in first.content.decode()
    second = client.get("/console/usage/", {"page": 2})
    assert [i.period_start for i in second.context["invoices"]] == [date(2023, 2, 1), date(2023, 1, 1)]
    assert "Page 4 is empty" in client.get("/console/usage/", {"page": 4}).content.decode()
    assert "No invoices yet" in signed_in(charlie).get("/console/usage/").content.decode()


def test_this_month_begins_where_billing_says_for_the_console_and_the_api(alice):
    """One home for "this month" (billing.services.month_began): the console's usage tables and
    the API's default usage window begin where budgets count the month's spend from."""
    began = billing_services.month_began(timezone.now())
    assert signed_in(alice).get("/console/usage/").context["month"] == began
    assert datetime.fromisoformat(alice.client().get("/api/v1/usage").json()["from"]) == began


def test_members_page(alice, bob, victor):
    page = signed_in(alice).get("/console/settings/members/")
    assert [m.user.email for m in page.context["members"]] == ["alice@acme.test", "bob@acme.test",
                                                                 "victor@acme.test"]
    assert page.context["pager"]["num_pages"] == 1 and "page 1 of" not in page.content.decode()
    assert "No members on this page." in signed_in(alice).get("/console/settings/members/",
                                                              {"page": 2}).content.decode()


# ------------------------------------------------------------------ invoices


@pytest.fixture
def march_invoice(alice, catalog):
    """Acme's March 2025 invoice from real metered usage: a day of h100.8x across a price change."""
    set_price("h100.8x", "19.9200")
    set_price("h100.8x", "17.9200", since=at(2025, 3, 15))
    make_run(alice, it="h100.8x", name="train-1", transitions=[
        (at(2025, 3, 14, 12), State.PENDING), (at(2025, 3, 14, 12), State.RUNNING),
        (at(2025, 3, 15, 12), State.STOPPING)])
    billing_services.metering_run(now=at(2025, 4, 2))
    return billing_services.invoice_refresh(tenant_id=alice.tenant.pk, month=at(2025, 3, 1).date())


def test_invoice_page_shows_its_lines(alice, march_invoice):
    response = signed_in(alice).get(f"/console/invoices/{march_invoice.pk}/")
    assert response.status_code == 200
    lines = response.context["lines"]
    assert [(ln.instance_type.code, ln.per_hour, ln.gpu_hours, ln.amount) for ln in lines] == [
        ("h100.8x", Decimal("17.9200"), Decimal("96.0000"), Decimal("215.04")),
        ("h100.8x", Decimal("19.9200"), Decimal("96.0000"), Decimal("239.04"))]
    html = response.content.decode()
    assert f"Invoice {march_invoice.number}" in html
    assert "454.08" in html and "215.04" in html and "239.04" in html
    assert "No usage in this month." not in html
    assert f'href="/console/invoices/{march_invoice.pk}/csv"' in html
    # the usage page lists it with its page and CSV links
    usage = signed_in(alice).get("/console/usage/").content.decode()
    assert march_invoice.number in usage and f"/console/invoices/{march_invoice.pk}/csv" in usage


def test_invoice_csv_download(alice, victor, march_invoice):
    for actor in (alice, victor):  # billing.read is enough
        response = signed_in(actor).get(f"/console/invoices/{march_invoice.pk}/csv")
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/csv")
        assert response["Content-Disposition"] == f'attachment; filename="invoice-{march_invoice.number}.csv"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["invoice", "period_start", "period_end", "status", "instance_type", "region", "kind",
                       "gpu_hours", "unit_price_per_gpu_hour", "price_per_hour", "seconds", "amount", "currency",
                       "gib_hours"]  # storage lines (volumes), added last so the columns before keep their places
    body = [dict(zip(rows[0], r, strict=False)) for r in rows[1:]]
    assert [(r["instance_type"], r["region"], r["price_per_hour"], r["seconds"], r["amount"]) for r in body[:-1]] == [
        ("h100.8x", "us-east-1", "17.9200", "43200", "215.04"), ("h100.8x", "us-east-1", "19.9200", "43200", "239.04")]
    assert all(r["invoice"] == march_invoice.number and r["period_start"] == "2025-03-01" for r in body)
    assert (body[-1]["instance_type"], body[-1]["amount"], body[-1]["currency"]) == (
        "total", "454.08", march_invoice.currency)


def test_another_tenant_gets_404_for_the_invoice_and_its_csv(charlie, march_invoice):
    client = signed_in(charlie)
    for url in (f"/console/invoices/{march_invoice.pk}/", f"/console/invoices/{march_invoice.pk}/csv"):
        response = client.get(url)
        assert response.status_code == 404, url
        assert march_invoice.number not in response.content.decode()
    assert march_invoice.number not in client.get("/console/usage/").content.decode()


# ------------------------------------------------------------------ catalogue sorting


def _offers(response, field: str) -> list:
    out = []
    for r in response.context["rows"]:
        price = r["on_demand"] if field in ("price", "perf") else r["spot"]
        out.append(None if price is None else (price.per_hour if field != "perf" else price.per_bf16_tflops_hour))
    return out


@pytest.mark.parametrize("field", ["price", "spot", "perf"])
def test_catalogue_sorts_by_a_price_column_both_ways(alice, catalog, field):
    client = signed_in(alice)
    # the whole catalogue (no hosts here: every offer is "never", hidden by default)
    up = _offers(client.get("/console/catalogue/", {"sort": field, "never": "1"}), field)
    down = _offers(client.get("/console/catalogue/", {"sort": field, "dir": "desc", "never": "1"}), field)
    priced_up = [v for v in up if v is not None]
    assert len(priced_up) > 3 and priced_up == sorted(priced_up)
    assert [v for v in down if v is not None] == sorted(priced_up, reverse=True)
    # offers without that price go last, whichever way
    for values in (up, down):
        assert values[len(priced_up):] == [None] * (len(values) - len(priced_up))


def test_catalogue_headers_say_how_it_is_sorted_and_keep_the_filters(alice, catalog):
    client = signed_in(alice)
    response = client.get("/console/catalogue/", {"gpu": "H100", "region": "us-east-1", "sort": "price"})
    html = response.content.decode()
    assert html.count("aria-sort=") == 1
    assert '<th scope="col" class="num" aria-sort="ascending"><a class="sort" id="sort-price"' in html
    # a click on the sorted column reverses it; on another sorts that one ascending; filters stay
    assert 'href="/console/catalogue/?gpu=H100&amp;region=us-east-1&amp;sort=price&amp;dir=desc"' in html
    assert 'href="/console/catalogue/?gpu=H100&amp;region=us-east-1&amp;sort=spot&amp;dir=asc"' in html
    assert 'hx-get="/console/catalogue/?gpu=H100&amp;region=us-east-1&amp;sort=gpu&amp;dir=asc"' in html
    # the sort rides along when a filter changes (hidden inputs of the filter form)
    assert '<input type="hidden" name="sort" value="price" form="cat-filters">' in html
    assert "sorted by on-demand price per hour, lowest first" in html
    gpu = client.get("/console/catalogue/", {"sort": "gpu", "dir": "desc"}, HTTP_HX_REQUEST="true")
    assert 'aria-sort="descending"><a class="sort" id="sort-gpu"' in gpu.content.decode()
    codes = [r["type"].gpu_model.code for r in gpu.context["rows"]]
    assert codes == sorted(codes, reverse=True)
    assert "<html" not in gpu.content.decode()  # htmx gets only the table
    # an unknown sort is the default: price per TFLOPS, ascending
    assert client.get("/console/catalogue/", {"sort": "nope", "dir": "sideways"}).context["columns"]["perf"][
        "aria"] == "ascending"


# ------------------------------------------------------------------ in the browser


def test_catalogue_sorts_by_clicking_and_by_keyboard(page, live_server, alice, fleet):
    sign_in(page, alice.user, live_server.url)
    page.goto("/console/catalogue/?gpu=H100")
    on_demand = page.locator("#catalogue thead th", has=page.locator("#sort-price"))
    expect(on_demand).not_to_have_attribute("aria-sort", "ascending")

    page.get_by_role("link", name="On demand").click()
    expect(on_demand).to_have_attribute("aria-sort", "ascending")
    expect(page).to_have_url(f"{live_server.url}/console/catalogue/?gpu=H100&sort=price&dir=asc")
    first = page.locator("#catalogue tbody tr").first
    expect(first).to_have_attribute("data-type", "h100.1x")

    # keyboard: the header link keeps focus across the swap, Enter reverses the order
    expect(page.locator("#sort-price")).to_be_focused()
    page.keyboard.press("Enter")
    expect(on_demand).to_have_attribute("aria-sort", "descending")
    expect(first).to_have_attribute("data-type", "h100.8x")
    expect(page).to_have_url(f"{live_server.url}/console/catalogue/?gpu=H100&sort=price&dir=desc")
    page.keyboard.press("Shift+Tab")  # back to the GPU header, then sort by it
    expect(page.locator("#sort-gpu")).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.locator("#sort-spot")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#catalogue thead th", has=page.locator("#sort-spot"))).to_have_attribute(
        "aria-sort", "ascending")
    expect(on_demand).not_to_have_attribute("aria-sort", "descending")

    # a filter change keeps the sort
    page.get_by_label("Region").select_option("us-east-1")
    expect(page).to_have_url(f"{live_server.url}/console/catalogue/?region=us-east-1&gpu=H100&sort=spot&dir=asc")
    expect(page.locator("#catalogue tbody tr")).to_have_count(4)
    expect(page.locator("#catalogue thead [aria-sort]")).to_have_count(1)
    shot(page, "catalogue-sorted")


def test_paged_lists_fit_a_phone(phone, live_server, alice, many_instances):
    from gpucloud.tenancy.services import api_key_create

    for i in range(PAGE_SIZE):
        api_key_create(membership=alice.membership, name=f"key-{i:02d}", scopes=["read"])
    sign_in(phone, alice.user, live_server.url)
    pages = {"instances-paged": "/console/instances/?show=all&page=2", "api-keys-paged": "/console/settings/api-keys/",
             "instances-beyond": "/console/instances/?page=7",
             "catalogue-sorted": "/console/catalogue/?sort=spot&dir=desc"}
    for name, url in pages.items():
        phone.goto(url)
        expect(phone.locator("main h1")).to_be_visible()
        if name != "catalogue-sorted":
            expect(phone.locator(".pager, [role=status].empty").first).to_be_visible()
        assert horizontal_overflow(phone) == [], name
        shot(phone, f"phone-{name}")
    phone.goto("/console/instances/?show=all")
    phone.get_by_role("navigation", name="Pages of instances").get_by_role("link", name="Next page").click()
    expect(phone).to_have_url(f"{live_server.url}/console/instances/?show=all&page=2")
    expect(phone.locator("nav.pager [aria-current=page]")).to_have_text("Page 2")
