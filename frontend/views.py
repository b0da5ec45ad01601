"""The web console (/console/) and the public landing page.

Views are thin: each passes through `frontend.console.console_view` (sign-in, tenant,
permission from the matrix, audit actor), reads through the apps' selectors and writes
through their services. Input is validated by the API's own serializers, so a mistake
reads the same in the console as from the API.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.contrib import messages
from django.contrib.auth import logout
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.http import url_has_allowed_host_and_scheme

from agents import selectors as agent_selectors
from agents.protocol import IDLE_BELOW
from agents.services.logs import workload_logs_request
from billing import selectors as billing_selectors
from billing import services as billing_services
from billing.api import serializers as billing_s
from billing.api.views import invoice_csv
from billing.choices import UsageGroup
from billing.models import BudgetAlert
from frontend.console import account_view, apply_errors, console_action, console_view, refusal, service_error_to_form
from frontend.forms import (
    IMAGE_TEMPLATES,
    ApiKeyForm,
    BudgetForm,
    InvitationAcceptForm,
    InviteForm,
    LaunchForm,
    RoleForm,
    SshKeyForm,
    TopUpForm,
)
from gateway.public import connect_hints, terminal_ws_url
from gateway.services import terminal_ticket_issue
from gpucloud.catalogue.selectors import (
    gpu_model_list,
    instance_type_list,
    price_at,
    prices_in_force,
    quota_list,
    region_list,
)
from gpucloud.lib.errors import ServiceError
from gpucloud.lib.http import client_ip
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy import selectors as tenancy_selectors
from gpucloud.tenancy import services as tenancy_services
from gpucloud.tenancy.api import serializers as tenancy_s
from gpucloud.tenancy.audit import Actor, acting_as
from gpucloud.tenancy.selectors import membership_list_for_user
from scheduler import arrays as scheduler_arrays
from scheduler import selectors as workload_selectors
from scheduler import services as workload_services
from scheduler.admission import launch_admission
from scheduler.api import serializers as workload_s
from scheduler.choices import ACTIVE, HOLDING, TERMINAL, Billing, State, WorkloadKind
from scheduler.core import blockers
from volumes import selectors as volume_selectors

# Live parts refresh at this pace (htmx `every Ns`); the GPU chart shows this window.
POLL_S = 2
CHART_WINDOW_S = 600
CHART_STEP_S = 2
# Lists show this many rows a page (Django's Paginator); `?page=N` picks one, other filters stay.
PAGE_SIZE = 25


def _paginate(request, rows, *, noun: str, per_page: int = PAGE_SIZE, anchor: str = "") -> tuple[list, dict]:
    """One page of `rows` (a queryset or a list) and what `_pager.html` needs.

    A page number that is not a number reads as page 1; one past the end is an empty page
    (the template says so and links back), not a silent jump to another page.
    """
    paginator = Paginator(rows, per_page)
    try:
        number = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        number = 1
    last = max(paginator.num_pages, 1)
    beyond = number > last
    items = [] if beyond else list(paginator.page(number).object_list)
    start = (number - 1) * per_page + 1
    pager = {
        "number": number, "num_pages": last, "count": paginator.count, "noun": noun, "anchor": anchor,
        "start": start, "end": start + len(items) - 1, "beyond": beyond,
        "prev": min(number - 1, last) if number > 1 else None, "next": number + 1 if number < last else None,
        "range": [] if beyond else list(paginator.get_elided_page_range(number, on_each_side=1, on_ends=1)),
        "ellipsis": Paginator.ELLIPSIS,
    }
    return items, pager


# ------------------------------------------------------------------ public


def home(request):
    """The landing page: signed-in users go to their console; others see what can be rented."""
    if request.user.is_authenticated:
        return redirect("console:dashboard")
    types = list(instance_type_list())
    prices = prices_in_force(instance_types=types)
    # only what can be rented: priced where some host could ever run it
    rentable: dict[int, dict[str, int]] = {}
    for a in agent_selectors.availability(instance_types=types, prices=prices):
        if a.can_host:
            rentable.setdefault(a.instance_type.pk, {})[a.region] = a.available_now
    rows = []
    for it in types:
        where = rentable.get(it.pk, {})
        on_demand = [p for p in prices[it.pk] if p.kind == "on_demand" and p.region in where]
        cheapest = min(on_demand, key=lambda p: p.per_hour, default=None)
        if cheapest is not None:
            rows.append({"type": it, "price": cheapest, "free": sum(where.values())})
    return render(request, "frontend/home.html", {"rows": rows})


def favicon(request):
    """What browsers ask for without a <link rel="icon"> (the API's pages): the console's icon."""
    return redirect(static("frontend/favicon.svg"), permanent=True)


def healthz(request):
    """Liveness for load balancers and compose: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


# ------------------------------------------------------------------ accounts


@account_view(methods=("POST",))
def signout(request):
    logout(request)
    return redirect("console:login")


@account_view(methods=("GET", "POST"))
def invitation_accept(request):
    """Join a tenant with an invitation token. Needs a signed-in user, not a tenant yet.

    The token is never in a URL the server sees (access logs, `?next=`, Referer): the link the
    members page shows carries it in the fragment (`#token=…`), which console.js copies into
    this form (kept in the tab's sessionStorage while the user signs in first); it is POSTed.
    """
    if not request.user.is_authenticated:
        # Not a redirect: the sign-in page would drop the fragment. This page keeps the token
        # for the tab and links to sign-in, which returns here.
        return render(request, "frontend/invitation_accept.html", {"form": None})
    form = InvitationAcceptForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        ser = tenancy_s.InvitationAcceptSerializer(data=form.cleaned_data)
        if not ser.is_valid():
            apply_errors(form, ser.errors)
        else:
            try:
                with acting_as(Actor(user=request.user, ip=client_ip(request))):
                    membership = tenancy_services.invitation_accept(token=ser.validated_data["token"],
                                                                    user=request.user)
            except ServiceError as exc:
                service_error_to_form(form, exc)
            else:
                request.session["tenant_id"] = str(membership.tenant_id)
                messages.success(request, f"You joined {membership.tenant.name} as {membership.role}.")
                return redirect("console:dashboard")
    return render(request, "frontend/invitation_accept.html", {"form": form},
                  status=400 if form.is_bound and form.errors else 200)


@console_action(write=perms.TENANT_READ)
def tenant_switch(request):
    """Act for another of the user's tenants from now on (kept in the session)."""
    wanted = request.POST.get("tenant", "")
    for m in membership_list_for_user(user=request.user):
        if wanted in (str(m.tenant_id), m.tenant.slug):
            request.session["tenant_id"] = str(m.tenant_id)
            messages.success(request, f"Now working in {m.tenant.name}.")
            break
    else:
        messages.error(request, "You are not a member of that tenant.")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = reverse("console:dashboard")  # never bounce to another site
    return redirect(target)


# ------------------------------------------------------------------ dashboard


@console_view(read=perms.WORKLOADS_READ)
def dashboard(request):
    tenant = request.console.tenant
    work = list(
        workload_selectors.workload_list(tenant=tenant, kind=WorkloadKind.INSTANCE).filter(state__in=ACTIVE)
    ) + list(workload_selectors.workload_list(tenant=tenant, kind=WorkloadKind.JOB).filter(state__in=ACTIVE))
    costs = billing_selectors.workload_costs(workloads=work)
    running = [w for w in work if w.state in HOLDING]
    queued = sorted((w for w in work if w.state == State.PENDING),
                    key=lambda w: (w.queue_position is None, w.queue_position or 0, w.created_at))
    ctx = {
        "running": [(w, costs[w.pk]) for w in running],
        "queued": queued,
        "balance": billing_selectors.balance_get(tenant=tenant),
        "quotas": quota_list(tenant=tenant),
        "hourly": sum((costs[w.pk].hourly or Decimal(0)) for w in running if w.state == State.RUNNING),
        "email_unverified": tenancy_selectors.email_verification_pending(user=request.user),
    }
    return render(request, "frontend/dashboard.html", ctx)


# ------------------------------------------------------------------ catalogue


# Sortable columns of the catalogue: the column header, and the value rows are ordered by
# (rows without that price go last whichever way the column is sorted).
SORTS = {
    "gpu": ("GPU", lambda r: (r["type"].gpu_model.code, r["type"].gpu_count, r["type"].gpu_share_milli)),
    "price": ("On demand", lambda r: r["on_demand"].per_hour if r["on_demand"] else None),
    "spot": ("Spot", lambda r: r["spot"].per_hour if r["spot"] else None),
    "perf": ("Per TFLOPS", lambda r: r["on_demand"].per_bf16_tflops_hour if r["on_demand"] else None),
}
SORT_WORDS = {"gpu": "GPU model", "price": "on-demand price per hour", "spot": "spot price per hour",
              "perf": "on-demand price per BF16 TFLOPS-hour"}


def _catalogue_sort(rows: list[dict], sort: str, descending: bool) -> list[dict]:
    key = SORTS[sort][1]
    priced = [r for r in rows if key(r) is not None]
    # a stable tie-break, so equal prices keep one order: type code, then region
    priced.sort(key=lambda r: (r["type"].code, r["region"]))
    priced.sort(key=key, reverse=descending)
    return priced + [r for r in rows if key(r) is None]


@console_view(read=perms.TENANT_READ)
def catalogue(request):
    region = request.GET.get("region", "")
    gpu = request.GET.get("gpu", "")
    sort = request.GET.get("sort") if request.GET.get("sort") in SORTS else "perf"
    direction = "desc" if request.GET.get("dir") == "desc" else "asc"
    types = list(instance_type_list())
    if gpu:
        types = [t for t in types if t.gpu_model.code == gpu]
    only_free = request.GET.get("available") in ("1", "on", "true")
    # offers no host of this fleet could ever run are hidden unless asked for (runnable first)
    show_never = request.GET.get("never") in ("1", "on", "true")
    prices = prices_in_force(instance_types=types)
    available = {(a.instance_type.pk, a.region): a for a in agent_selectors.availability(
        instance_types=types, region_codes=[region] if region else None, tenant=request.console.tenant,
        prices=prices)}
    rows = []
    for it in types:
        by_region: dict[str, dict] = {}
        for p in prices[it.pk]:
            if region and p.region != region:
                continue
            by_region.setdefault(p.region, {})[p.kind] = p
        for code, kinds in by_region.items():
            a = available.get((it.pk, code))
            rows.append({"type": it, "region": code, "on_demand": kinds.get("on_demand"),
                         "spot": kinds.get("spot"), "available": a.available_now if a else 0,
                         "availability": a.availability if a else blockers.NEVER,
                         "never_why": a.reason if a else ""})
    never_hidden = 0 if show_never else sum(1 for r in rows if r["availability"] == blockers.NEVER)
    if not show_never:
        rows = [r for r in rows if r["availability"] != blockers.NEVER]
    if only_free:
        rows = [r for r in rows if r["available"] > 0]
    rows = _catalogue_sort(rows, sort, direction == "desc")
    # runnable first: what would start now, in the chosen order; then what would queue; then
    # (when shown) what no host here could ever run
    rank = {blockers.AVAILABLE: 0, blockers.BUSY: 1, blockers.NEVER: 2}
    rows.sort(key=lambda r: rank[r["availability"]])  # stable: the chosen order within each part
    # One entry per sortable header: its label, where a click goes (the other direction when it
    # is the sorted column, else ascending) and its aria-sort value.
    columns = {key: {"key": key, "label": label, "current": key == sort,
                     "next": ("asc" if direction == "desc" else "desc") if key == sort else "asc",
                     "aria": ("descending" if direction == "desc" else "ascending") if key == sort else ""}
               for key, (label, _) in SORTS.items()}
    ctx = {"rows": rows, "regions": region_list().order_by("code"), "gpus": gpu_model_list().order_by("code"),
           "region": region, "gpu": gpu, "sort": sort, "dir": direction, "columns": columns,
           "only_free": only_free, "show_never": show_never, "never_hidden": never_hidden,
           "sort_words": SORT_WORDS[sort]}
    template = "frontend/partials/catalogue_table.html" if request.htmx else "frontend/catalogue.html"
    return render(request, template, ctx)


# ------------------------------------------------------------------ launch


def _launch_price(instance_type: str, region: str, tenant, free: dict[str, int] | None = None) -> dict:
    """What the box beside the launch form shows: the price of a type in a region now, on
    demand and spot, and whether it would start at once, and if not why (the one admission
    answer, `scheduler.admission`: the same cause and words as the API's error or the
    workload's waiting reason; the Launch button is disabled when it would be refused).
    `free` is `_free_by_region` of the type when the caller has it already."""
    it = instance_type_list().filter(code=instance_type).first()
    reg = region_list().filter(code=region).first()
    out: dict = {"type": it, "region": reg, "on_demand": None, "spot": None}
    if it and reg:
        now = timezone.now()
        for kind in (Billing.ON_DEMAND, Billing.SPOT):
            price = price_at(instance_type=it, region=reg, kind=kind, at=now)
            out[kind] = price.per_hour if price else None
        free = _free_by_region(it, tenant) if free is None else free
        out["fits_now"] = free.get(reg.code, 0)
        blocker = launch_admission(tenant=tenant, instance_type=it, region=reg, available_now=out["fits_now"])
        out["blocker"] = blocker
        out["refused"] = blocker is not None and blocker.refused
        out["why"] = blockers.sentence(blocker) if blocker else ""
        out["then"] = blockers.consequence(blocker) if blocker else ""
        out["free_elsewhere"] = [(code, n) for code, n in free.items() if code != reg.code]
    return out


def _free_by_region(it, tenant) -> dict[str, int]:
    """{region code: how many of `it` the scheduler would start now for `tenant`}, most first,
    only where some would."""
    rows = agent_selectors.availability(instance_types=[it], tenant=tenant)
    free = sorted(((r.region, r.available_now) for r in rows if r.available_now > 0), key=lambda cn: (-cn[1], cn[0]))
    return dict(free)


def _runnable_first(tenant, type_codes: list[str]) -> tuple[str, str]:
    """The (type, region) the launch form opens on: the first type of the form's list that would
    start now (where most of it would), else the first some host could ever run; ("", "") when
    nothing in the catalogue can run in this fleet."""
    rows = agent_selectors.availability(instance_types=list(instance_type_list()), tenant=tenant)
    order = {code: i for i, code in enumerate(type_codes)}
    best = min(((r.available_now <= 0, not r.can_host, order.get(r.instance_type.code, len(order)),
                 -r.available_now, r.region, r.instance_type.code) for r in rows), default=None)
    if best is None or best[1]:
        return "", ""
    return best[5], best[4]


@console_view(read=perms.WORKLOADS_LAUNCH, write=perms.WORKLOADS_LAUNCH)
def launch(request):
    console = request.console
    saved = list(tenancy_selectors.ssh_key_list(tenant=console.tenant, user=request.user))
    vols = list(volume_selectors.volume_list(tenant=console.tenant).order_by("name"))
    initial = {"instance_type": request.GET.get("type", ""), "region": request.GET.get("region", ""),
               "kind": request.GET.get("kind", "instance"), "mount_path": "/workspace",
               "volume": request.GET.get("volume", ""),
               "image": IMAGE_TEMPLATES["pytorch"].image, "command": IMAGE_TEMPLATES["pytorch"].command}
    form = LaunchForm(request.POST or None, initial=initial, saved_keys=saved, volumes=vols)
    if request.method == "POST":
        form_ok = form.is_valid()
        kind = form.cleaned_data.get("kind") or WorkloadKind.INSTANCE
        serializer = workload_s.JobCreateSerializer if kind == WorkloadKind.JOB else workload_s.WorkloadCreateSerializer
        ser = serializer(data=form.api_data())
        if not ser.is_valid():
            # every field's error at once: the API's words beside the form's own (one per field)
            apply_errors(form, {k: v for k, v in ser.errors.items()
                                if LaunchForm.FIELD_MAP.get(k, k) not in form.errors}, field_map=LaunchForm.FIELD_MAP)
        elif form_ok:
            try:
                workload = workload_services.workload_launch(
                    tenant=console.tenant, spec=workload_services.WorkloadSpec(kind=kind, **ser.validated_data),
                    user=request.user)
            except ServiceError as exc:
                service_error_to_form(form, exc, LaunchForm.FIELD_MAP)
            else:
                # said while it is queued: the page's live part takes it away once it is not
                messages.success(request, f"{workload.name} is queued; the scheduler places it in a moment.",
                                 extra_tags="pending")
                return redirect(_detail_url(workload))
    first = {name: (form.fields[name].choices[0][0] if form.fields[name].choices else "")
             for name in ("instance_type", "region")}
    free = None
    if not form.is_bound and not initial["instance_type"] and not initial["region"]:
        # nothing asked for: open on what can run now, not on the alphabet's first type
        code, where = _runnable_first(console.tenant, [c for c, _ in form.fields["instance_type"].choices])
        if code:
            initial.update(instance_type=code, region=where)
            form = LaunchForm(initial=initial, saved_keys=saved, volumes=vols)
    if not form.is_bound and not initial["region"]:
        # no region asked for: the one where most of the type fits now, not the alphabet's first
        it = instance_type_list().filter(code=initial["instance_type"] or first["instance_type"]).first()
        free = _free_by_region(it, console.tenant) if it else {}
        best = next(iter(free), "")
        if best:
            initial["region"] = best
            form = LaunchForm(initial=initial, saved_keys=saved, volumes=vols)
    # Only what the form accepted reaches the price box's lookups (a NUL or a made-up code does not).
    values = form.cleaned_data if form.is_bound else initial
    price = _launch_price(values.get("instance_type") or first["instance_type"],
                          values.get("region") or first["region"], console.tenant, free)
    ctx = {"form": form, "price": price, "spot": bool(values.get("spot")),
           "templates_json": {k: {"image": t.image, "ports": t.ports, "command": t.command}
                              for k, t in IMAGE_TEMPLATES.items()}}
    return render(request, "frontend/launch.html", ctx, status=400 if form.is_bound else 200)


@console_view(read=perms.WORKLOADS_LAUNCH)
def launch_price(request):
    """The partial under the launch form: what an hour costs, on demand and spot."""
    price = _launch_price(request.GET.get("instance_type", ""), request.GET.get("region", ""),
                          request.console.tenant)
    return render(request, "frontend/partials/launch_price.html",
                  {"price": price, "spot": request.GET.get("spot") in ("on", "true", "1")})


# ------------------------------------------------------------------ instances and jobs


def _detail_url(workload) -> str:
    name = "console:instance" if workload.kind == WorkloadKind.INSTANCE else "console:job"
    return reverse(name, args=[workload.pk])


def _workload(request, kind: str, pk, *, detail: bool = False):
    """The tenant's workload or 404: another tenant's is simply not there."""
    select = workload_selectors.workload_detail_list if detail else workload_selectors.workload_list
    workload = select(tenant=request.console.tenant, kind=kind).filter(pk=pk).first()
    if workload is None:
        raise Http404("No such workload in this tenant.")
    return workload


def _kind(kind: str) -> dict:
    return {"kind": kind, "kind_label": "instance" if kind == WorkloadKind.INSTANCE else "batch job",
            "plural": "Instances" if kind == WorkloadKind.INSTANCE else "Batch jobs",
            "list_url": "console:instances" if kind == WorkloadKind.INSTANCE else "console:jobs"}


@console_view(read=perms.WORKLOADS_READ)
def workload_list(request, kind: str):
    # a job's end is its result: job lists show finished jobs unless asked for active ones only
    show = request.GET.get("show", "all" if kind == WorkloadKind.JOB else "active")
    qs = workload_selectors.workload_list(tenant=request.console.tenant, kind=kind)
    if show == "active":
        qs = qs.filter(state__in=ACTIVE)
    info = _kind(kind)
    # Jobs: an array is one row of its own table; `?array=<id>` lists that array's tasks instead.
    array, arrays = None, []
    if kind == WorkloadKind.JOB:
        array, arrays = _job_arrays(request, show)
        qs = qs.filter(array=array).order_by("array_index") if array else qs.filter(array__isnull=True)
    items, pager = _paginate(request, qs if array else qs.order_by("-created_at", "-pk"),
                             noun=f"{info['kind_label']}s")
    costs = billing_selectors.workload_costs(workloads=items)
    ctx = {**info, "rows": [(w, costs[w.pk]) for w in items], "show": show, "poll_s": POLL_S, "pager": pager,
           "array": array, "arrays": arrays}
    template = "frontend/partials/workload_rows.html" if request.htmx else "frontend/workload_list.html"
    return render(request, template, ctx)


def _job_arrays(request, show: str) -> tuple:
    """(the array named by `?array=`, or None; the tenant's arrays with their task counts, active
    ones only when `show` is "active"). Another tenant's array is a 404."""
    tenant = request.console.tenant
    wanted = request.GET.get("array")
    if wanted:
        try:
            array = workload_selectors.job_array_list(tenant=tenant).filter(pk=UUID(wanted)).first()
        except ValueError:
            array = None
        if array is None:
            raise Http404("No such job array in this tenant.")
        counts = scheduler_arrays.task_counts(array_ids=[array.pk])[array.pk]
        array.counts, array.state = sorted(counts.items()), scheduler_arrays.array_state(counts)
        return array, []
    listed = list(workload_selectors.job_array_list(tenant=tenant)[:200])
    counts = scheduler_arrays.task_counts(array_ids=[a.pk for a in listed])
    for a in listed:
        a.counts, a.state = sorted(counts[a.pk].items()), scheduler_arrays.array_state(counts[a.pk])
    if show == "active":
        listed = [a for a in listed if a.state in ("pending", "running")]
    return None, listed


@console_action(write=perms.WORKLOADS_MANAGE)
def job_array_stop(request, pk):
    array = workload_selectors.job_array_list(tenant=request.console.tenant).filter(pk=pk).first()
    if array is None:
        raise Http404("No such job array in this tenant.")
    n = scheduler_arrays.job_array_stop(array=array)
    messages.success(request, f"Stopping {n} tasks of {array.name}.")
    return redirect(f"{reverse('console:jobs')}?array={array.pk}")


def _live_context(request, workload) -> dict:
    cost = billing_selectors.workload_costs(workloads=[workload])[workload.pk]
    allocations = sorted(workload.active_allocations, key=lambda a: (a.host.name, a.gpu_id))
    ran_on = not allocations  # holds no GPUs now: show where its last run ran, if it ran
    if ran_on:
        allocations = sorted(workload_selectors.workload_last_allocations(workload=workload),
                             key=lambda a: (a.host.name, a.gpu_id))
    # the volumes it uses (its mounts name them), read through the tenant's own volumes
    mounts = {str(m["volume_id"]): m["path"] for m in workload.mounts or []}
    volumes = [(v, mounts[str(v.pk)]) for v in volume_selectors.volume_list(tenant=request.console.tenant)
               .filter(pk__in=list(mounts)).order_by("name")] if mounts else []
    return {**_kind(workload.kind), "w": workload, "cost": cost, "allocations": allocations, "volumes": volumes,
            "idle_below_pct": f"{IDLE_BELOW * 100:g}",
            "ran_on": ran_on and bool(allocations),
            "hosts": sorted({a.host.name for a in allocations}), "poll_s": POLL_S,
            "terminal": workload.state in TERMINAL, "stoppable": workload.state not in TERMINAL
            and workload.state != State.STOPPING, "events": list(workload.events.all())[::-1],
            "container_events": list(workload.container_events.all())[::-1],
            "connect": connect_hints(workload)}


@console_view(read=perms.WORKLOADS_READ)
def workload_detail(request, kind: str, pk):
    workload = _workload(request, kind, pk, detail=True)
    return render(request, "frontend/workload_detail.html", _live_context(request, workload))


@console_view(read=perms.WORKLOADS_READ)
def workload_live(request, kind: str, pk):
    """The polled part of the detail page: state, reason, cost, host and GPUs, the timeline."""
    workload = _workload(request, kind, pk, detail=True)
    return render(request, "frontend/partials/workload_live.html", _live_context(request, workload))


@console_view(read=perms.WORKLOADS_CONNECT)
def instance_terminal(request, pk):
    """The web terminal: xterm.js over a WebSocket to the gateway, opened with a one-time ticket
    for this user, session, instance and page origin (gateway/services.py; the gateway then
    checks the rules SSH does). The page is not cached: each load asks for a new ticket."""
    workload = _workload(request, WorkloadKind.INSTANCE, pk)
    ws_url = None
    if workload.state == State.RUNNING:
        # the origin the browser will send with the upgrade: this page's, as Django's CSRF check reads it
        ticket = terminal_ticket_issue(user_id=request.user.pk, workload_id=workload.pk,
                                       session_key=request.session.session_key or "",
                                       origin=f"{request.scheme}://{request.get_host()}")
        ws_url = terminal_ws_url(workload.pk, ticket)
    response = render(request, "frontend/terminal.html", {**_kind(WorkloadKind.INSTANCE), "w": workload,
                                                          "ws_url": ws_url})
    add_never_cache_headers(response)
    return response


@console_view(read=perms.WORKLOADS_READ)
def workload_metrics(request, kind: str, pk):
    """GPU utilisation and memory per GPU for uPlot: {t: [...], gpus: [{label, util, mem}]}."""
    workload = _workload(request, kind, pk)
    now = timezone.now()
    data = agent_selectors.workload_metrics(workload=workload, since=now - timedelta(seconds=CHART_WINDOW_S),
                                            step=CHART_STEP_S, now=now)
    times = sorted({int(p["t"].timestamp()) for g in data["gpus"] for p in g["points"]})
    index = {t: i for i, t in enumerate(times)}
    gpus = []
    for g in data["gpus"]:
        util: list[float | None] = [None] * len(times)
        mem: list[float | None] = [None] * len(times)
        for p in g["points"]:
            i = index[int(p["t"].timestamp())]
            util[i] = p["gpu_util"]
            mem[i] = None if p["mem_used_mib"] is None else round(p["mem_used_mib"] / 1024, 2)
        gpus.append({"label": f"GPU {g['index']}", "uuid": g["uuid"], "util": util, "mem": mem})
    return JsonResponse({"t": times, "gpus": gpus, "step": CHART_STEP_S, "state": workload.state})


@console_view(read=perms.WORKLOADS_READ)
def workload_logs(request, kind: str, pk):
    """The latest log tail; asks the agent for a fresh one while the container runs."""
    workload = _workload(request, kind, pk)
    tail = workload_logs_request(workload=workload, tail=200)
    return render(request, "frontend/partials/workload_logs.html",
                  {"tail": tail, "w": workload, "poll_s": POLL_S * 2, **_kind(kind)})


def _workload_action(request, kind: str, pk, service, verb: str, done: str, while_state: str = ""):
    """Run `service(workload=…)` on the tenant's workload; say how it went; back to its page.
    `while_state`: the message is true only in that state; the detail page's live part
    removes it once the workload left it (console.js)."""
    workload = _workload(request, kind, pk)
    try:
        service(workload=workload)
    except ServiceError as exc:
        messages.error(request, f"Could not {verb} {workload.name}: {exc.message}")
    else:
        messages.success(request, done.format(name=workload.name), extra_tags=while_state)
    return redirect(_detail_url(workload))


@console_action(write=perms.WORKLOADS_MANAGE)
def workload_stop(request, kind: str, pk):
    return _workload_action(request, kind, pk, workload_services.workload_stop, "stop", "Stopping {name}.",
                            while_state="stopping")


@console_action(write=perms.WORKLOADS_MANAGE)
def workload_start(request, kind: str, pk):
    """Start a stopped instance again: back through the queue with the same configuration."""
    return _workload_action(request, kind, pk, workload_services.workload_start, "start",
                            "{name} is queued again; the scheduler places it in a moment.", while_state="pending")


@console_action(write=perms.WORKLOADS_MANAGE)
def workload_terminate(request, kind: str, pk):
    workload = _workload(request, kind, pk)
    try:
        workload_services.workload_delete(workload=workload)
    except ServiceError as exc:
        messages.error(request, f"Could not terminate {workload.name}: {exc.message}")
        return redirect(_detail_url(workload))
    messages.success(request, f"{workload.name} is terminated; its cost stays in usage and invoices.")
    return redirect(_kind(kind)["list_url"])


# ------------------------------------------------------------------ usage and billing


@console_view(read=perms.BILLING_READ)
def usage(request, budget_form: BudgetForm | None = None, topup_form: TopUpForm | None = None):
    """Usage and billing; `budget_form`, `topup_form`: a form that did not save, shown with its errors."""
    tenant = request.console.tenant
    now = timezone.now().astimezone(UTC)
    start, end = billing_services.month_began(now), now + timedelta(seconds=1)
    by_type = billing_selectors.usage(tenant=tenant, start=start, end=end, group_by=UsageGroup.INSTANCE_TYPE)
    by_instance = billing_selectors.usage(tenant=tenant, start=start, end=end, group_by=UsageGroup.INSTANCE)
    volumes = list(volume_selectors.volume_list(tenant=tenant).order_by("name")[:50])
    volume_costs = billing_selectors.volume_costs(volumes=volumes, now=now)
    ctx = {"by_type": by_type, "by_instance": by_instance, "month": start, "poll_s": 5,
           "storage": billing_selectors.storage_usage(tenant=tenant, start=start, end=end),
           "volumes": [(v, volume_costs[v.pk]) for v in volumes]}
    if request.htmx:
        return render(request, "frontend/partials/usage_tables.html", ctx)
    since = (now - timedelta(days=30)).replace(hour=0, minute=0, second=0, microsecond=0)
    by_day = billing_selectors.usage(tenant=tenant, start=since, end=end, group_by=UsageGroup.DAY)
    budgets = list(billing_selectors.budget_list(tenant=tenant))
    invoices, pager = _paginate(request, billing_selectors.invoice_list(tenant=tenant)
                                .order_by("-period_start", "-pk"), noun="invoices", anchor="#invoices")
    ctx.update({
        "invoices": invoices, "pager": pager,
        "balance": billing_selectors.balance_get(tenant=tenant, now=now),
        "alerts": list(BudgetAlert.objects.filter(budget__in=budgets).select_related("budget")[:20]),
        "spend_json": {"t": [int(datetime.fromisoformat(r.key).replace(tzinfo=UTC).timestamp()) for r in by_day],
                       "amount": [float(r.amount) for r in by_day],
                       # the whole window, so one day of usage is not stretched over the axis
                       "from": int(since.timestamp()), "to": int(since.timestamp()) + 31 * 86400},
        "budget_form": budget_form or BudgetForm(),
        "topup_form": topup_form or TopUpForm(),
        "topups": list(billing_selectors.topup_list(tenant=tenant)[:10]),
    })
    failed = budget_form is not None or topup_form is not None
    return render(request, "frontend/usage.html", ctx, status=400 if failed else 200)


def _invoice(request, pk):
    invoice = billing_selectors.invoice_list(tenant=request.console.tenant).filter(pk=pk).first()
    if invoice is None:
        raise Http404("No such invoice in this tenant.")
    return invoice


@console_view(read=perms.BILLING_READ)
def invoice_detail(request, pk):
    invoice = _invoice(request, pk)
    return render(request, "frontend/invoice.html", {"invoice": invoice, "lines": list(invoice.lines.all())})


@console_view(read=perms.BILLING_READ)
def invoice_download(request, pk):
    invoice = _invoice(request, pk)
    response = HttpResponse(invoice_csv(invoice), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="invoice-{invoice.number}.csv"'
    return response


@console_action(write=perms.BILLING_MANAGE)
def budget_create(request):
    form = BudgetForm(request.POST)
    if form.is_valid():
        ser = billing_s.BudgetWriteSerializer(data=form.api_data())
        if ser.is_valid():
            budget = billing_services.budget_create(tenant=request.console.tenant, **ser.validated_data)
            messages.success(request, f"Budget {budget.name!r} saved: {budget.monthly_amount} a month.")
            return redirect("console:usage")
        apply_errors(form, ser.errors)
    # the usage page again, the form with each error beside its field, a summary and what was typed
    return usage.__wrapped__(request, budget_form=form)


@console_action(write=perms.BILLING_MANAGE)
def topup_create(request):
    """Add credit: file a top-up through the payment provider; then its checkout page, or the
    usage page saying an operator approves it."""
    form = TopUpForm(request.POST)
    if form.is_valid():
        back = request.build_absolute_uri(reverse("console:usage"))
        try:
            topup, start = billing_services.topup_request(
                tenant=request.console.tenant, user=request.user, amount=form.cleaned_data["amount"],
                success_url=f"{back}?topup=paid#credit", cancel_url=f"{back}?topup=cancelled#credit")
        except ServiceError as exc:
            service_error_to_form(form, exc)
        else:
            if start.redirect_url:
                return redirect(start.redirect_url)
            messages.success(request, f"Top-up of {topup.amount} {topup.currency} requested. {start.message}")
            return redirect(f"{reverse('console:usage')}#credit")
    return usage.__wrapped__(request, topup_form=form)


@console_action(write=perms.BILLING_MANAGE)
def budget_delete(request, pk):
    budget = billing_selectors.budget_list(tenant=request.console.tenant).filter(pk=pk).first()
    if budget is None:
        raise Http404("No such budget in this tenant.")
    billing_services.budget_delete(budget=budget)
    messages.success(request, f"Budget {budget.name!r} deleted.")
    return redirect("console:usage")


# ------------------------------------------------------------------ settings


@console_view(read=perms.API_KEYS_READ, write=perms.API_KEYS_CREATE)
def api_keys(request):
    console = request.console
    form = ApiKeyForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        ser = tenancy_s.ApiKeyCreateSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, ser.errors)
        else:
            try:
                key, secret = tenancy_services.api_key_create(membership=console.membership, **ser.validated_data)
            except ServiceError as exc:
                service_error_to_form(form, exc)
            else:
                # Rendered once, never stored: the response is not cached and the page is not redirected.
                created = {"key": key, "secret": secret}
                form = ApiKeyForm()
    keys, pager = _paginate(request, tenancy_selectors.api_key_list(tenant=console.tenant)
                            .order_by("-created_at", "-pk"), noun="API keys")
    ctx = {"form": form, "keys": keys, "pager": pager, "created": created,
           "api_base": request.build_absolute_uri("/api/v1/")}
    response = render(request, "frontend/settings_keys.html", ctx,
                      status=400 if form.is_bound and form.errors else 200)
    response["Cache-Control"] = "no-store"
    return response


@console_action(write=perms.API_KEYS_REVOKE)
def api_key_revoke(request, pk):
    console = request.console
    key = tenancy_selectors.api_key_list(tenant=console.tenant).filter(pk=pk).first()
    if key is None:
        raise Http404("No such key in this tenant.")
    needed = perms.to_revoke_key(created_by_id=key.created_by_id, user_id=request.user.pk)
    if not console.can(needed):
        raise PermissionDenied(refusal(console, needed))
    tenancy_services.api_key_revoke(key=key)
    messages.success(request, f"Key {key.prefix} is revoked; it stops working at once.")
    return redirect("console:api_keys")


@console_view(read=perms.SSH_KEYS_READ, write=perms.SSH_KEYS_MANAGE)
def ssh_keys(request):
    console = request.console
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenancy_services.ssh_key_add(membership=console.membership, **form.cleaned_data)
        except ServiceError as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(request, f"Saved {form.cleaned_data['name']}; the launch page offers it.")
            return redirect("console:ssh_keys")
    keys = list(tenancy_selectors.ssh_key_list(tenant=console.tenant, user=request.user))
    return render(request, "frontend/settings_ssh.html", {"form": form, "keys": keys},
                  status=400 if form.is_bound and form.errors else 200)


@console_action(write=perms.SSH_KEYS_MANAGE)
def ssh_key_delete(request, pk):
    key = tenancy_selectors.ssh_key_list(tenant=request.console.tenant, user=request.user).filter(pk=pk).first()
    if key is None:
        raise Http404("No such key.")
    tenancy_services.ssh_key_remove(key=key)
    messages.success(request, f"Removed {key.name}.")
    return redirect("console:ssh_keys")


@console_view(read=perms.MEMBERS_READ, write=perms.MEMBERS_MANAGE)
def members(request):
    console = request.console
    form = InviteForm(request.POST or None)
    invited = None
    if request.method == "POST" and form.is_valid():
        ser = tenancy_s.InvitationCreateSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, ser.errors)
        else:
            try:
                invitation, token = tenancy_services.invitation_create(actor=console.membership,
                                                                       **ser.validated_data)
            except ServiceError as exc:
                service_error_to_form(form, exc)
            else:
                invited = {"invitation": invitation, "token": token}
                form = InviteForm()
    members_page, pager = _paginate(request, tenancy_selectors.member_list(tenant=console.tenant)
                                    .order_by("user__email", "pk"), noun="members")
    ctx = {
        "form": form, "invited": invited, "members": members_page, "pager": pager,
        "invitations": [i for i in tenancy_selectors.invitation_list(tenant=console.tenant) if i.is_open()],
        "roles": RoleForm.base_fields["role"].choices,
    }
    response = render(request, "frontend/settings_members.html", ctx,
                      status=400 if form.is_bound and form.errors else 200)
    response["Cache-Control"] = "no-store"
    return response


def _member(request, pk):
    m = tenancy_selectors.member_list(tenant=request.console.tenant).filter(pk=pk).first()
    if m is None:
        raise Http404("No such member in this tenant.")
    return m


@console_action(write=perms.MEMBERS_MANAGE)
def member_role(request, pk):
    membership = _member(request, pk)
    ser = tenancy_s.MemberUpdateSerializer(data={"role": request.POST.get("role", "")})
    if not ser.is_valid():
        messages.error(request, "Choose one of the roles.")
        return redirect("console:members")
    try:
        tenancy_services.member_update_role(actor=request.console.membership, membership=membership,
                                            role=ser.validated_data["role"])
    except ServiceError as exc:
        messages.error(request, f"The role was not changed: {exc.message}")
    else:
        messages.success(request, f"{membership.user.email} is now {membership.role}.")
    return redirect("console:members")


@console_action(write=perms.MEMBERS_LEAVE)
def member_remove(request, pk):
    """Remove a member (members.manage), or leave (anybody may remove themselves)."""
    console = request.console
    membership = _member(request, pk)
    needed = perms.to_remove_member(membership_id=membership.pk, own_membership_id=console.membership.pk)
    if not console.can(needed):
        raise PermissionDenied(refusal(console, needed))
    try:
        tenancy_services.member_remove(actor=console.membership, membership=membership)
    except ServiceError as exc:
        messages.error(request, f"Not removed: {exc.message}")
        return redirect("console:members")
    if membership.pk == console.membership.pk:
        request.session.pop("tenant_id", None)
        messages.success(request, f"You left {console.tenant.name}.")
        return redirect("console:dashboard")
    messages.success(request, f"{membership.user.email} was removed.")
    return redirect("console:members")


@console_view(read=perms.QUOTAS_READ)
def quotas(request):
    return render(request, "frontend/settings_quotas.html", {"quotas": quota_list(tenant=request.console.tenant)})

