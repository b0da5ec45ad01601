"""The console's volume pages: the list with a create form, one volume's detail (grow, delete)."""
from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render

from billing import selectors as billing_selectors
from frontend.console import console_action, console_view, service_error_to_form
from frontend.forms import ConsoleForm
from gpucloud.catalogue.selectors import region_list
from gpucloud.lib.errors import ServiceError
from gpucloud.tenancy import permissions as perms
from scheduler.feasibility import region_host_counts
from volumes import selectors, services
from volumes.services import MAX_SIZE_GIB


class VolumeForm(ConsoleForm):
    name = forms.RegexField(label="Name", regex=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100,
                            help_text="Letters, digits, . _ - ; unique among your volumes.",
                            error_messages={"invalid": "Letters, digits, . _ - (starting with a letter or digit)."})
    region = forms.ChoiceField(label="Region", help_text="Work that uses it runs in this region.")
    size_gib = forms.IntegerField(label="Size (GiB)", min_value=1, max_value=MAX_SIZE_GIB, initial=100)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        hosts = region_host_counts()
        # regions with hosts first (most first), then the rest: a volume lives on a host of its region
        regions = sorted(region_list(), key=lambda r: (-hosts.get(r.code, 0), r.code))
        prices = billing_selectors.storage_prices(region_ids=[r.pk for r in regions])
        # the price a renter pays per GiB-hour, beside the region it is paid in
        self.fields["region"].choices = [
            (r.code, f"{r.name} ({r.code})" + (f" — {prices[r.pk]} per GiB-hour" if r.pk in prices else "")
             + ("" if r.code in hosts else " — no hosts yet")) for r in regions]
        if regions and not self.is_bound:
            self.initial.setdefault("region", regions[0].code)


class ResizeForm(ConsoleForm):
    size_gib = forms.IntegerField(label="New size (GiB)", min_value=1, max_value=MAX_SIZE_GIB,
                                  help_text="A volume only grows.")


@console_view(read=perms.WORKLOADS_READ, write=perms.WORKLOADS_LAUNCH)
def volume_list(request):
    console = request.console
    form = VolumeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            v = services.volume_create(tenant=console.tenant, user=request.user, **form.cleaned_data)
        except ServiceError as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(request, f"Created volume {v.name}; attach it on the launch form or with "
                                      f"`gpucloud launch --volume {v.name}:/workspace`.")
            return redirect("console:volume", pk=v.pk)
    volumes = list(selectors.volume_list(tenant=console.tenant).order_by("name"))
    costs = billing_selectors.volume_costs(volumes=volumes)
    ctx = {"form": form, "volumes": volumes, "rows": [(v, costs[v.pk]) for v in volumes],
           "quota_gib": services.quota_gib(console.tenant),
           "used_gib": services.used_gib(console.tenant)}
    return render(request, "frontend/volumes.html", ctx, status=400 if form.is_bound and form.errors else 200)


@console_view(read=perms.WORKLOADS_READ, write=perms.WORKLOADS_MANAGE)
def volume_detail(request, pk):
    console = request.console
    volume = selectors.volume_list(tenant=console.tenant).filter(pk=pk).first()
    if volume is None:
        raise Http404("No such volume.")
    form = ResizeForm(request.POST or None, initial={"size_gib": volume.size_gib})
    if request.method == "POST" and form.is_valid():
        try:
            services.volume_resize(volume=volume, size_gib=form.cleaned_data["size_gib"])
        except ServiceError as exc:
            service_error_to_form(form, exc)
        else:
            messages.success(request, f"{volume.name} is now {form.cleaned_data['size_gib']} GiB.")
            return redirect("console:volume", pk=volume.pk)
    attached = volume.active_attachments[0] if volume.active_attachments else None
    ctx = {"volume": volume, "form": form, "attached": attached,
           "cost": billing_selectors.volume_costs(volumes=[volume])[volume.pk],
           "events": list(selectors.volume_events(volume=volume)),
           "history": list(volume.attachments.select_related("workload").order_by("-created_at")[:20])}
    return render(request, "frontend/volume_detail.html", ctx, status=400 if form.is_bound and form.errors else 200)


@console_action(write=perms.WORKLOADS_MANAGE)
def volume_delete(request, pk):
    volume = selectors.volume_list(tenant=request.console.tenant).filter(pk=pk).first()
    if volume is None:
        raise Http404("No such volume.")
    try:
        services.volume_delete(volume=volume)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("console:volume", pk=volume.pk)
    messages.success(request, f"Deleted {volume.name}: no longer billed; its data is purged from its host "
                              "after the grace period.")
    return redirect("console:volumes")
