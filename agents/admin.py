"""Hosts, GPUs and bootstrap tokens in the operators' panel.

Host admin states change only through the actions (cordon, drain, uncordon), which call
`agents.services`; GPU health only through "Clear unhealthy". "Replace host" lets the next
registration of a host's name take it over (a re-installed machine that lost its token). Each action tells, host by
host, what happened: changed, already so, or waiting for a DOWN host to come back.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Prefetch
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from agents.choices import AdminState, HostState
from agents.models import BootstrapToken, ContainerLog, Gpu, GpuSample, GpuSampleMinute, Host
from agents.protocol import host_name_normalise
from agents.services.host_ops import gpu_mark_healthy, host_cordon, host_drain, host_replace_allow, host_uncordon
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.admin import RegionAdmin
from gpucloud.tenancy.admin import OperatorAdmin, Outcome, names
from scheduler.models import Allocation


def bootstrap_secret_message(request, token: BootstrapToken, secret: str) -> None:
    """The secret is not stored: this message is the only time anyone sees it."""
    messages.warning(
        request,
        f"Bootstrap token for {token.region} — copy it now, it is shown only once and admits one "
        f"host: {secret}  — on the new host run: python -m agents.host --server "
        f"{request.build_absolute_uri('/').rstrip('/')} --bootstrap-token {secret}",
    )


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = [
        "uuid",
        "index",
        "gpu_model",
        "healthy",
        "unhealthy_reason",
        "unhealthy_since",
        "whole",
        "used_milli",
        "utilisation",
        "sampled_at",
        "running",
    ]
    readonly_fields = fields
    can_delete = False

    def get_queryset(self, request):
        # what runs on each GPU, in the inline's one query (no query per row)
        return super().get_queryset(request).prefetch_related(Prefetch(
            "allocations", queryset=Allocation.objects.filter(active=True).select_related("workload__tenant"),
            to_attr="active_allocations"))

    @admin.display(description="workload (tenant)")
    def running(self, gpu: Gpu) -> str:
        """What runs here and whose it is: an operator's first question about a busy GPU."""
        allocs = getattr(gpu, "active_allocations", [])
        if not allocs:
            return "—"
        return format_html_join(", ", '<a href="{}">{}</a> ({}, {}){}', (
            (reverse("admin:scheduler_workload_change", args=[a.workload_id]), a.workload.name,
             a.workload.kind, a.workload.tenant.name,
             "" if a.milli == 1000 else format_html(" {}‰", a.milli)) for a in allocs))


class HostForm(forms.ModelForm):
    """A rename takes the one form of host names, as a registration does (no lookalikes)."""

    class Meta:
        model = Host
        # what the page edited before this form (the rest is HostAdmin.readonly_fields)
        fields = ["name", "region", "vcpus", "memory_mib", "agent_version", "created_at"]

    def clean_name(self) -> str:
        try:
            return host_name_normalise(self.cleaned_data["name"])
        except ValueError as e:
            raise ValidationError(str(e)) from None


@admin.register(Host)
class HostAdmin(OperatorAdmin):
    form = HostForm
    list_display = [
        "name",
        "region",
        "state",
        "admin_state",
        "vcpus",
        "used_vcpus",
        "memory_mib",
        "last_heartbeat_at",
    ]
    list_filter = ["state", "admin_state", "region"]
    search_fields = ["name", "id"]
    list_select_related = ["region"]
    # State changes go through the actions (services), never through the form.
    readonly_fields = [
        "state",
        "admin_state",
        "token_hash",
        "last_heartbeat_at",
        "last_seq",
        "down_since",
        "used_vcpus",
        "used_memory_mib",
        "replace_allowed_at",
    ]
    inlines = [GpuInline]
    actions = ["cordon", "drain", "uncordon", "replace"]

    def has_add_permission(self, request):
        # A host joins by registering with a bootstrap token; a row made by hand has no agent.
        return False

    def _set(
        self,
        request,
        queryset,
        *,
        to: str,
        verb: str,
        already: str,
        service,
        done: str | Callable[[], str],
    ) -> Outcome:
        """Move each selected host to admin state `to` through `service`, and say what happened."""
        outcome = Outcome()
        down = []
        for host in queryset:
            if host.admin_state == to:
                outcome.notes.append(f"{host.name} was already {already}: nothing changed.")
                continue
            if outcome.attempt(host.name, verb, lambda h=host: service(host=h)) is not None:
                if host.state == HostState.DOWN:
                    down.append(host.name)
        outcome.tell(self, request, done if isinstance(done, str) else done())
        if down:
            verb = "is" if len(down) == 1 else "are"
            self.message_user(
                request,
                f"{names(down)} {verb} down (no heartbeat): "
                "the change applies when the agent is back.",
                messages.WARNING,
            )
        return outcome

    @admin.action(description="Cordon: take no new work")
    def cordon(self, request, queryset):
        self._set(
            request,
            queryset,
            to=AdminState.CORDONED,
            verb="cordon",
            already="cordoned",
            service=host_cordon,
            done="Cordoned {names}: no new work lands there; what runs there keeps running.",
        )

    @admin.action(description="Drain: no new work, batch jobs requeued after their notice, instances run to their end")
    def drain(self, request, queryset):
        requeued: list[int] = []

        def drain_one(*, host):
            host, jobs = host_drain(host=host)
            requeued.append(len(jobs))
            return host

        self._set(
            request,
            queryset,
            to=AdminState.DRAINING,
            verb="drain",
            already="draining",
            service=drain_one,
            done=lambda: (
                "Draining {names}: no new work lands there; instances run until "
                f"their owners stop them; {sum(requeued)} batch job(s) got notice and go "
                "back to the queue when it ends."
            ),
        )

    @admin.action(description="Uncordon: take new work again")
    def uncordon(self, request, queryset):
        self._set(
            request,
            queryset,
            to=AdminState.READY,
            verb="uncordon",
            already="taking new work",
            service=host_uncordon,
            done="Uncordoned {names}: new work may land there again.",
        )


    @admin.action(
        description="Replace host: the next registration of its name with a bootstrap token "
        "of its region takes it over"
    )
    def replace(self, request, queryset):
        outcome = Outcome()
        for host in queryset:
            outcome.attempt(host.name, "allow replacing", lambda h=host: host_replace_allow(host=h))
        outcome.tell(
            self,
            request,
            "{names}: the next registration under this name with an unused bootstrap token of "
            "its region takes the host over; the current agent's token is revoked then. Until "
            "then nothing changes, and any other registration under this name is refused.",
        )


@admin.register(Gpu)
class GpuAdmin(OperatorAdmin):
    list_display = [
        "uuid",
        "host",
        "index",
        "gpu_model",
        "healthy",
        "unhealthy_reason",
        "whole",
        "used_milli",
        "utilisation",
        "mig_enabled",
    ]
    list_filter = ["gpu_model", "healthy", "whole", "mig_enabled", "host__region"]
    search_fields = ["uuid", "host__name"]
    list_select_related = ["host", "gpu_model"]
    # Booking counters are the scheduler's; health changes through the action (audited).
    readonly_fields = [
        "healthy",
        "unhealthy_reason",
        "unhealthy_since",
        "ecc_uncorrected",
        "whole",
        "used_milli",
        "utilisation",
        "memory_used_mib",
        "idle_since",
        "sampled_at",
    ]
    actions = ["mark_healthy"]

    def has_add_permission(self, request):
        return False  # GPUs are what an agent discovers

    @admin.action(description="Clear unhealthy (repaired): take new work again")
    def mark_healthy(self, request, queryset):
        outcome = Outcome()
        for gpu in queryset.select_related("host"):
            label = f"{gpu.host.name}#{gpu.index}"
            if gpu.healthy:
                outcome.notes.append(
                    f"GPU {label} ({gpu.uuid}) is healthy: there was nothing to clear."
                )
                continue
            outcome.attempt(label, "clear", lambda g=gpu: gpu_mark_healthy(gpu=g))
        outcome.tell(self, request, "Cleared {names}: marked healthy, they take new work again.")


@admin.register(BootstrapToken)
class BootstrapTokenAdmin(OperatorAdmin):
    """Operators mint a token per new host; the secret appears once, in a message."""

    list_display = [
        "prefix",
        "region",
        "note",
        "created_at",
        "created_by",
        "expires_at",
        "used_at",
        "host",
    ]
    list_filter = ["region", ("used_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "note", "host__name"]
    list_select_related = ["region", "created_by", "host"]
    fields = [
        "region",
        "note",
        "expires_at",
        "prefix",
        "created_at",
        "created_by",
        "used_at",
        "host",
    ]
    readonly_fields = ["prefix", "created_at", "created_by", "used_at", "host"]
    actions = ["expire_now"]

    def get_readonly_fields(self, request, obj=None):
        # A token's region is what it admits to; changing it afterwards would be a new token.
        return self.readonly_fields + (["region"] if obj is not None else [])

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        # Through the service (secret made, hash stored, audited as the operator, one transaction).
        token, secret = bootstrap_token_create(
            region=obj.region, note=obj.note, expires_at=obj.expires_at, created_by=request.user
        )
        obj.pk, obj.prefix, obj.created_at = token.pk, token.prefix, token.created_at
        obj.created_by = token.created_by
        obj._state.adding = False  # the admin's "added" message and log entry name this row
        bootstrap_secret_message(request, token, secret)

    @admin.action(description="Expire the selected unused tokens now")
    def expire_now(self, request, queryset):
        used = [t.prefix for t in queryset if t.used_at is not None]
        n = queryset.filter(used_at__isnull=True).update(expires_at=timezone.now())
        if n:
            self.message_user(
                request, f"Expired {n} token(s): they admit no host any more.", messages.SUCCESS
            )
        if used:
            self.message_user(
                request,
                f"{names(used)} already admitted a host: a used token "
                "admits nothing more, so there was nothing to expire.",
                messages.WARNING,
            )


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Measurements written by heartbeats: to look at, never to edit."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(GpuSample)
class GpuSampleAdmin(_ReadOnlyAdmin):
    list_display = [
        "gpu",
        "time",
        "gpu_util",
        "mem_util",
        "mem_used_mib",
        "temperature_c",
        "power_w",
    ]
    search_fields = ["gpu__uuid"]
    date_hierarchy = "time"
    show_full_result_count = False  # the table is large; counting it is not free


@admin.register(GpuSampleMinute)
class GpuSampleMinuteAdmin(_ReadOnlyAdmin):
    list_display = ["gpu", "minute", "samples", "gpu_util", "mem_util", "temperature_c", "power_w"]
    search_fields = ["gpu__uuid"]
    show_full_result_count = False


@admin.register(ContainerLog)
class ContainerLogAdmin(_ReadOnlyAdmin):
    list_display = ["workload", "host", "attempt_id", "captured_at", "requested_at"]
    search_fields = ["attempt_id"]
    list_select_related = ["workload", "host"]


# The agents add their action to the regions' admin: the catalogue sits below them and imports nothing of them.
@admin.action(description="Create a bootstrap token (one new host joins the region)")
def create_bootstrap_token(modeladmin, request, queryset):
    for region in queryset:
        token, secret = bootstrap_token_create(
            region=region, note=f"by {request.user.email}", created_by=request.user
        )
        bootstrap_secret_message(request, token, secret)


RegionAdmin.actions = [*RegionAdmin.actions, create_bootstrap_token]
