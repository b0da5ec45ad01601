"""The console's job arrays: a form that submits many tasks of one job at once, through the same
serializer and service as `POST /api/v1/jobs` with `array` (scheduler/arrays.py).

GET /console/jobs/arrays/new    the form (workloads.launch)
POST /console/jobs/arrays/new   submit it (workloads.launch, CSRF): to the array's task list
"""
from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse

from frontend.console import apply_errors, console_view, service_error_to_form
from frontend.forms import IMAGE_TEMPLATES, LaunchForm
from gpucloud.lib.errors import ServiceError
from gpucloud.tenancy import permissions as perms
from scheduler import arrays as scheduler_arrays
from scheduler.api import serializers as workload_s
from scheduler.choices import WorkloadKind
from scheduler.services import WorkloadSpec

MAX_TASKS = 10_000  # as the API's `array.count`


class JobArrayForm(LaunchForm):
    """The launch form's job fields plus how many tasks; what only instances have is left out."""

    count = forms.IntegerField(label="Tasks", min_value=1, max_value=MAX_TASKS, initial=10,
                               help_text="Each task runs the command once, with GPUCLOUD_ARRAY_INDEX 0 … N-1 "
                                         "in its environment.")
    queue = forms.CharField(label="Queue", max_length=64, required=False,
                            help_text="Empty: default. A batch pool's queue runs its tasks on the pool's members.")

    INSTANCE_ONLY = ("kind", "ssh_keys", "saved_ssh_keys", "ports", "auto_stop_idle_minutes", "volume",
                     "mount_path")
    FIELD_MAP = {**LaunchForm.FIELD_MAP, "array": "count"}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name in self.INSTANCE_ONLY:
            self.fields.pop(name, None)
        self.order_fields(["name", "count", "instance_type", "region", "template", "image", "command", "env",
                           "queue", "max_retries", "timeout_s", "spot", "max_price"])

    def api_data(self) -> dict:
        self.cleaned_data["kind"] = WorkloadKind.JOB
        body = super().api_data()
        for unused in ("ports", "ssh_keys"):
            body.pop(unused, None)
        if self.cleaned_data.get("queue"):
            body["queue"] = self.cleaned_data["queue"]
        body["array"] = {"count": self.cleaned_data.get("count") or 0}
        return body


@console_view(read=perms.WORKLOADS_LAUNCH, write=perms.WORKLOADS_LAUNCH)
def job_array_create(request):
    tenant = request.console.tenant
    initial = {"image": IMAGE_TEMPLATES["pytorch"].image, "command": IMAGE_TEMPLATES["pytorch"].command,
               "instance_type": request.GET.get("type", ""), "region": request.GET.get("region", "")}
    form = JobArrayForm(request.POST or None, initial=initial)
    if request.method == "POST":
        form_ok = form.is_valid()
        ser = workload_s.JobCreateSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, {k: v for k, v in ser.errors.items()
                                if JobArrayForm.FIELD_MAP.get(k, k) not in form.errors},
                         field_map=JobArrayForm.FIELD_MAP)
        elif form_ok:
            data = dict(ser.validated_data)
            count = data.pop("array")["count"]
            try:
                array = scheduler_arrays.job_array_launch(
                    tenant=tenant, spec=WorkloadSpec(kind=WorkloadKind.JOB, **data), count=count,
                    user=request.user)
            except ServiceError as exc:
                service_error_to_form(form, exc, JobArrayForm.FIELD_MAP)
            else:
                messages.success(request, f"Job array {array.name}: {array.count} tasks queued.")
                return redirect(f"{reverse('console:jobs')}?array={array.pk}")
    return render(request, "frontend/job_array_new.html", {"form": form},
                  status=400 if form.is_bound else 200)
