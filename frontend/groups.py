"""Console pages of autoscaling groups: list, create, detail (members, policies, scheduled
actions, activity) and its actions. Input goes through the API's serializers and the
services, so a mistake reads the same here as from the API."""
from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render

from autoscaling import selectors, services
from autoscaling.api import serializers as s
from autoscaling.models import MAX_GROUP_SIZE
from frontend.console import apply_errors, console_action, console_view, flatten_errors, service_error_to_form
from frontend.forms import ConsoleForm
from gpucloud.catalogue.selectors import instance_type_list, region_list
from gpucloud.lib.errors import ServiceError
from gpucloud.tenancy import permissions as perms


def _choices(rows, label) -> list[tuple[str, str]]:
    return [(r.code, label(r)) for r in rows]


class GroupForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=60, help_text="Members are named <name>-<6 hex>.")
    instance_type = forms.ChoiceField(label="Instance type")
    region = forms.ChoiceField(label="Region")
    image = forms.CharField(label="Image", max_length=500, initial="ubuntu:24.04")
    command = forms.CharField(label="Command", required=False, max_length=8192,
                              help_text="Run by /bin/sh -c; empty: the image's own.")
    env = forms.CharField(label="Environment", required=False, widget=forms.Textarea(attrs={"rows": 3}),
                          help_text="KEY=VALUE, one a line.")
    min_size = forms.IntegerField(label="Min", min_value=0, max_value=MAX_GROUP_SIZE, initial=1)
    desired = forms.IntegerField(label="Desired", min_value=0, max_value=MAX_GROUP_SIZE, initial=1)
    max_size = forms.IntegerField(label="Max", min_value=0, max_value=MAX_GROUP_SIZE, initial=4)
    on_demand_base = forms.IntegerField(label="On-demand base", min_value=0, initial=0,
                                        help_text="The first members, on demand.")
    on_demand_percent = forms.IntegerField(label="On demand above the base (%)", min_value=0, max_value=100,
                                           initial=100, help_text="The rest is spot.")
    warmup_s = forms.IntegerField(label="Warm-up (s)", min_value=0, max_value=3600, initial=120,
                                  help_text="A new member's metrics are ignored this long.")
    target_gpu_util = forms.FloatField(label="Target GPU utilisation (%)", required=False, min_value=1,
                                       max_value=100, help_text="Adds a target tracking policy; empty: none.")
    job_queue = forms.RegexField(label="Batch pool: job queue", regex=r"^[a-z0-9][a-z0-9-]*$", required=False,
                                 max_length=64, help_text="Desired follows this queue's GPU demand.")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["instance_type"].choices = _choices(instance_type_list(), lambda t: f"{t.code} — {t.name}")
        self.fields["region"].choices = _choices(region_list(), lambda r: f"{r.code} — {r.name}")

    def api_data(self) -> dict:
        d = {k: v for k, v in self.cleaned_data.items() if v not in (None, "") and k != "target_gpu_util"}
        env = {}
        for line in (self.cleaned_data.get("env") or "").splitlines():
            if line.strip():
                key, _, value = line.strip().partition("=")
                env[key] = value
        d["env"] = env
        return d


class ScaleForm(ConsoleForm):
    min_size = forms.IntegerField(label="Min", min_value=0, max_value=MAX_GROUP_SIZE)
    desired = forms.IntegerField(label="Desired", min_value=0, max_value=MAX_GROUP_SIZE)
    max_size = forms.IntegerField(label="Max", min_value=0, max_value=MAX_GROUP_SIZE)


class ScheduleForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=60)
    cron = forms.CharField(label="Cron", max_length=100, initial="0 9 * * 1-5",
                           help_text="minute hour day-of-month month day-of-week")
    timezone = forms.CharField(label="Time zone", max_length=64, initial="UTC")
    desired = forms.IntegerField(label="Desired", min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    min_size = forms.IntegerField(label="Min", min_value=0, max_value=MAX_GROUP_SIZE, required=False)
    max_size = forms.IntegerField(label="Max", min_value=0, max_value=MAX_GROUP_SIZE, required=False)


def _group(request, pk):
    group = selectors.group_list(tenant=request.console.tenant).filter(pk=pk).first()
    if group is None:
        raise Http404("No such autoscaling group in this tenant.")
    return group


@console_view(read=perms.WORKLOADS_READ)
def group_list(request):
    groups = list(selectors.group_list(tenant=request.console.tenant))
    return render(request, "autoscaling/group_list.html", {"groups": groups})


@console_view(read=perms.WORKLOADS_LAUNCH, write=perms.WORKLOADS_LAUNCH)
def group_create(request):
    form = GroupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        ser = s.GroupCreateSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, ser.errors)
        else:
            try:
                group = services.group_create(tenant=request.console.tenant, user=request.user,
                                              **ser.validated_data)
                target = form.cleaned_data.get("target_gpu_util")
                if target:
                    services.policy_create(group=group, name="gpu-util", kind="target_tracking",
                                           metric="gpu_util", target=target)
            except ServiceError as e:
                service_error_to_form(form, e)
            else:
                messages.success(request, f"Group {group.name} created: it launches {group.desired} "
                                          f"member{'s' if group.desired != 1 else ''}.")
                return redirect("console:group", group.pk)
    return render(request, "autoscaling/group_create.html", {"form": form},
                  status=400 if request.method == "POST" else 200)


@console_view(read=perms.WORKLOADS_READ)
def group_detail(request, pk):
    group = _group(request, pk)
    ctx = {
        "g": group, "members": group.live_members,
        "policies": list(group.policies.all()),
        "scheduled": [(a, services.next_runs(a)) for a in group.scheduled_actions.all()],
        "activities": list(selectors.activity_list(group=group)[:50]),
        "scale_form": ScaleForm(initial={"min_size": group.min_size, "desired": group.desired,
                                         "max_size": group.max_size}),
        "schedule_form": ScheduleForm(),
    }
    return render(request, "autoscaling/group_detail.html", ctx)


def _refused(request, group, form):
    messages.error(request, "Not saved: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    return redirect("console:group", group.pk)


def _done(request, group, fn, ok: str):
    try:
        fn()
    except ServiceError as e:
        messages.error(request, " ".join([e.message, *flatten_errors(e.fields)]))
    else:
        messages.success(request, ok)
    return redirect("console:group", group.pk)


@console_action(write=perms.WORKLOADS_LAUNCH)
def group_scale(request, pk):
    group = _group(request, pk)
    form = ScaleForm(request.POST)
    if not form.is_valid():
        return _refused(request, group, form)
    return _done(request, group, lambda: services.group_update(group=group, **form.cleaned_data),
                 "Sizes saved; the group converges to them now.")


@console_action(write=perms.WORKLOADS_MANAGE)
def group_protect(request, pk):
    group = _group(request, pk)
    protected = request.POST.get("protected") == "1"
    instance = request.POST.get("instance", "")
    ser = s.ProtectionSerializer(data={"instance": instance, "protected": protected})
    if not ser.is_valid():
        raise Http404("No such member.")
    instance_id = ser.validated_data["instance"]
    return _done(request, group,
                 lambda: services.member_protect(group=group, instance_id=instance_id, protected=protected),
                 f"Scale-in protection {'on' if protected else 'off'}.")


@console_action(write=perms.WORKLOADS_LAUNCH)
def group_schedule(request, pk):
    group = _group(request, pk)
    form = ScheduleForm(request.POST)
    if not form.is_valid():
        return _refused(request, group, form)
    return _done(request, group, lambda: services.scheduled_create(group=group, **form.cleaned_data),
                 f"Scheduled action {form.cleaned_data['name']} added.")


@console_action(write=perms.WORKLOADS_MANAGE)
def group_delete(request, pk):
    group = _group(request, pk)
    services.group_delete(group=group)
    messages.success(request, f"Group {group.name} deleted; its members are stopping.")
    return redirect("console:groups")
