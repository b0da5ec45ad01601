"""What agents report to tenants: the queries of GPU metrics and log tails, and the series.

The metrics and logs are served on the workloads' own endpoints (`/api/v1/instances/{id}/metrics`,
`.../logs`, and the same under `/jobs/`), so tenancy is the workload viewset's (404 across
tenants); their answers' shapes are the scheduler's (scheduler/api/serializers.py), filled by
agents/api/workloads.py. The series (`/api/v1/metrics`) is agents' own endpoint.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from agents.protocol import LOG_TAIL_MAX_LINES
from agents.selectors import MAX_POINTS, SERIES_METRICS, SERIES_STATS
from gpucloud.api.serializers import StrictQuerySerializer


class MetricsQuerySerializer(StrictQuerySerializer):
    since = serializers.DateTimeField(
        required=False, help_text="start of the range (ISO 8601); default: an hour ago"
    )
    step = serializers.IntegerField(
        required=False, default=60, min_value=5, max_value=86400,
        help_text="seconds per point; under 60 only for the last hour (raw samples)",
    )

    def validate(self, data):
        now = timezone.now()
        since = data.get("since") or now - timedelta(hours=1)
        if since > now:
            raise serializers.ValidationError({"since": ["Must not be in the future."]})
        if (now - since).total_seconds() / data["step"] > MAX_POINTS:
            raise serializers.ValidationError(
                {"step": [f"Too many points: at most {MAX_POINTS} per series; use a larger step."]}
            )
        data["since"] = since
        return data


class LogsQuerySerializer(StrictQuerySerializer):
    tail = serializers.IntegerField(required=False, default=100, min_value=1,
                                    max_value=LOG_TAIL_MAX_LINES)


class SeriesQuerySerializer(StrictQuerySerializer):
    """GET /api/v1/metrics: one series of one of the tenant's workloads."""

    workload = serializers.UUIDField(help_text="an instance's or a job's id")
    metric = serializers.ChoiceField(choices=[*SERIES_METRICS, "cost_rate"])
    stat = serializers.ChoiceField(choices=list(SERIES_STATS), required=False, default="avg",
                                   help_text="per step, over the samples of the workload's GPUs")
    # `from` is a Python keyword: the field is declared below under its query parameter name.
    to = serializers.DateTimeField(required=False, help_text="ISO 8601; default: now")
    step = serializers.IntegerField(required=False, default=60, min_value=5, max_value=86400,
                                    help_text="seconds per point")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(required=False, help_text="ISO 8601; default: an hour before `to`")
        return fields

    def validate(self, data):
        now = timezone.now()
        end = data.get("to") or now
        start = data.get("from") or end - timedelta(hours=1)
        if start >= end:
            raise serializers.ValidationError({"from": ["Must be before `to`."]})
        if start > now:
            raise serializers.ValidationError({"from": ["Must not be in the future."]})
        if (end - start).total_seconds() / data["step"] > MAX_POINTS:
            raise serializers.ValidationError(
                {"step": [f"Too many points: at most {MAX_POINTS} per series; use a larger step."]}
            )
        data["from"], data["to"] = start, end
        return data


class SeriesPointSerializer(serializers.Serializer):
    t = serializers.DateTimeField(help_text="start of the step")
    value = serializers.FloatField(allow_null=True)


class SeriesSerializer(serializers.Serializer):
    workload = serializers.UUIDField()
    metric = serializers.ChoiceField(choices=[*SERIES_METRICS, "cost_rate"])
    stat = serializers.ChoiceField(choices=list(SERIES_STATS))
    unit = serializers.CharField(help_text="percent, MiB, celsius, watts, or <currency>/hour")
    step = serializers.IntegerField()
    points = SeriesPointSerializer(many=True, help_text="steps with no samples are left out (cost_rate: 0)")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField()
        fields["to"] = serializers.DateTimeField()
        return fields
