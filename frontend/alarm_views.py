"""Console pages for alarms: the list with a create form, an alarm's page (its metric with the
threshold line, state, history with the actions' delivery log), delete. The same services and
validation as /api/v1/alarms."""
from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from agents.selectors import workload_series
from alarms import selectors, services
from alarms.api import serializers as alarm_s
from alarms.choices import Comparison, MissingData, Statistic
from alarms.evaluate import period_parse, period_words
from alarms.registry import sources
from frontend.console import apply_errors, console_action, console_view, service_error_to_form
from frontend.forms import ConsoleForm
from gpucloud.lib.errors import NotFoundError, ServiceError
from gpucloud.tenancy import permissions as perms
from scheduler.choices import ACTIVE
from scheduler.models import Workload
from scheduler.selectors import workload_get

CHART_PERIODS = 60  # the chart shows this many periods back (at most a day)


class AlarmForm(ConsoleForm):
    name = forms.CharField(label="Name", max_length=100)
    target = forms.ChoiceField(label="Watch", help_text="One of your instances or jobs, or the whole tenant.")
    metric = forms.ChoiceField(label="Metric")
    statistic = forms.ChoiceField(label="Statistic", choices=Statistic.choices, initial="avg")
    comparison = forms.ChoiceField(label="Is", choices=Comparison.choices, initial="gt")
    threshold = forms.FloatField(label="Threshold", help_text="percent, MiB, °C, W, currency/hour, GPUs or seconds")
    period = forms.CharField(label="Period", initial="1m", max_length=12,
                             help_text="5m, 300s or 1h; whole minutes, 1m to 24h (a bare number is seconds)")
    evaluation_periods = forms.IntegerField(label="Evaluation periods (N)", min_value=1, max_value=100, initial=1)
    datapoints_to_alarm = forms.IntegerField(label="Datapoints to alarm (M of N)", min_value=1, max_value=100,
                                             initial=1)
    treat_missing_data = forms.ChoiceField(label="Missing data is", choices=MissingData.choices, initial="missing")
    notify_email = forms.BooleanField(label="E-mail owners and admins on ALARM and OK", required=False)
    webhook_url = forms.CharField(label="Webhook URL (ALARM and OK)", required=False, max_length=500,
                                  help_text="https, a public address; signed with the secret shown once")
    stop_workload = forms.BooleanField(label="Stop the workload on ALARM", required=False)

    def __init__(self, *args, tenant, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        mine = (Workload.objects.for_tenant(tenant).filter(state__in=ACTIVE, deleted_at__isnull=True)
                .order_by("name").values_list("pk", "name", "kind"))
        self.fields["target"].choices = [("tenant", "the tenant (spend rate, queue)")] + [
            (f"workload:{pk}", f"{kind} {name}") for pk, name, kind in mine]
        self.fields["metric"].choices = [(m, f"{m} ({kind})") for kind, src in sources().items()
                                         for m in src.metrics]

    def clean_period(self) -> int:
        seconds = period_parse(self.cleaned_data["period"])
        if seconds is None:
            raise forms.ValidationError("Write a period as 5m, 300s or 1h.")
        return seconds

    def api_data(self) -> dict:
        d = self.cleaned_data
        kind, _, target_id = d["target"].partition(":")
        notify = ([{"type": "email"}] if d["notify_email"] else []) + (
            [{"type": "webhook", "url": d["webhook_url"]}] if d["webhook_url"] else [])
        return {
            "name": d["name"], "target_kind": kind, "target_id": target_id, "metric": d["metric"],
            "statistic": d["statistic"], "comparison": d["comparison"], "threshold": d["threshold"],
            "period": d["period"], "evaluation_periods": d["evaluation_periods"],
            "datapoints_to_alarm": d["datapoints_to_alarm"], "treat_missing_data": d["treat_missing_data"],
            "actions": {"alarm": notify + ([{"type": "stop_workload"}] if d["stop_workload"] else []),
                        "ok": notify},
        }


@console_view(read=perms.WORKLOADS_READ, write=perms.WORKLOADS_MANAGE)
def alarm_list(request):
    tenant = request.console.tenant
    form = AlarmForm(request.POST or None, tenant=tenant)
    created = None
    if request.method == "POST" and form.is_valid():
        ser = alarm_s.AlarmWriteSerializer(data=form.api_data())
        if not ser.is_valid():
            apply_errors(form, ser.errors, field_map={"target_kind": "target", "target_id": "target"})
        else:
            try:
                alarm, secret = services.alarm_create(tenant=tenant, **ser.validated_data)
            except ServiceError as exc:
                service_error_to_form(form, exc, field_map={"target_kind": "target", "target_id": "target",
                                                            "actions": "webhook_url"})
            else:
                created = {"alarm": alarm, "secret": secret if form.cleaned_data["webhook_url"] else None}
                messages.success(request, f"Alarm {alarm.name!r} created: it is evaluated within a minute.")
                form = AlarmForm(tenant=tenant)
    alarms = list(selectors.alarm_list(tenant=tenant))
    labels = selectors.alarm_target_labels(tenant=tenant, alarms=alarms)
    for a in alarms:
        a.target_label = labels[str(a.pk)]
    return render(request, "frontend/alarm_list.html", {"alarms": alarms, "form": form, "created": created})


def _chart(alarm) -> dict:
    """The alarm's metric over the last CHART_PERIODS periods, for uPlot: {t, v, threshold, unit}."""
    now = timezone.now()
    source = sources().get(alarm.target_kind)
    unit = source.metrics.get(alarm.metric, "") if source else ""
    points: list[tuple[int, float | None]] = []
    if alarm.target_kind == "workload":
        try:
            workload = workload_get(tenant=alarm.tenant, pk=alarm.target_id)
        except NotFoundError:
            workload = None
        if workload is not None:
            start = now - timedelta(seconds=min(86400, alarm.period * CHART_PERIODS))
            series = workload_series(workload=workload, metric=alarm.metric, stat=alarm.statistic, start=start,
                                     end=now, step=alarm.period, now=now)
            points = [(int(p["t"].timestamp()), p["value"]) for p in series["points"]]
    else:
        points = [(int(t), v) for t, v in sorted(alarm.samples)]
    return {"t": [t for t, _ in points], "v": [v for _, v in points], "threshold": alarm.threshold,
            "unit": unit, "title": f"{alarm.statistic}({alarm.metric}) per {period_words(alarm.period)}"}


@console_view(read=perms.WORKLOADS_READ)
def alarm_detail(request, pk):
    try:
        alarm = selectors.alarm_get(tenant=request.console.tenant, pk=pk)
    except NotFoundError:
        raise Http404("No such alarm in this tenant.") from None
    history = list(selectors.alarm_history_list(alarm=alarm)[:50])
    target_url = None
    if alarm.target_kind == "workload":
        kind = Workload.objects.for_tenant(alarm.tenant).filter(pk=alarm.target_id).values_list("kind", flat=True)
        if kind:
            target_url = reverse(f"console:{kind[0]}", args=[alarm.target_id])
    target_label = selectors.alarm_target_labels(tenant=alarm.tenant, alarms=[alarm])[str(alarm.pk)]
    return render(request, "frontend/alarm_detail.html", {"alarm": alarm, "history": history, "target_url": target_url,
                                                          "target_label": target_label, "chart_json": _chart(alarm)})


@console_action(write=perms.WORKLOADS_MANAGE)
def alarm_delete(request, pk):
    try:
        alarm = selectors.alarm_get(tenant=request.console.tenant, pk=pk)
    except NotFoundError:
        raise Http404("No such alarm in this tenant.") from None
    services.alarm_delete(alarm=alarm)
    messages.success(request, f"Alarm {alarm.name!r} deleted.")
    return redirect("console:alarms")
