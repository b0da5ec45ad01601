from __future__ import annotations

from rest_framework import serializers

from alarms.choices import ActionStatus, AlarmState, Comparison, MissingData, Statistic
from alarms.models import Alarm, AlarmAction, AlarmHistory
from gpucloud.api.serializers import StrictSerializer


class ActionSerializer(StrictSerializer):
    """One action. Its type's own fields: webhook `url`; email `to` (optional, members only);
    scaling_policy `policy` (registered by the autoscaling app); stop_workload none."""

    type = serializers.CharField(max_length=32, help_text="email, webhook, stop_workload, scaling_policy, ...")
    url = serializers.CharField(max_length=500, required=False, help_text="webhook: https, a public address")
    to = serializers.ListField(child=serializers.EmailField(), required=False, min_length=1, max_length=20,
                               help_text="email: some of the tenant's members (default: its owners and admins)")
    policy = serializers.CharField(max_length=64, required=False, help_text="scaling_policy: the policy's id")


class ActionsSerializer(StrictSerializer):
    """What runs when the alarm enters each state (CloudWatch's AlarmActions, OKActions, InsufficientDataActions)."""

    alarm = ActionSerializer(many=True, required=False, max_length=10)
    ok = ActionSerializer(many=True, required=False, max_length=10)
    insufficient_data = ActionSerializer(many=True, required=False, max_length=10)


class DatapointSerializer(serializers.Serializer):
    t = serializers.DateTimeField(help_text="start of the period")
    value = serializers.FloatField(allow_null=True, help_text="null: no data in the period")


class AlarmSerializer(serializers.ModelSerializer):
    actions = ActionsSerializer(read_only=True)
    datapoints = DatapointSerializer(many=True, read_only=True, help_text="the last evaluation's, oldest first")
    state = serializers.ChoiceField(choices=AlarmState.choices, read_only=True)

    class Meta:
        model = Alarm
        fields = ["id", "name", "description", "target_kind", "target_id", "metric", "statistic", "period",
                  "evaluation_periods", "datapoints_to_alarm", "threshold", "comparison", "treat_missing_data",
                  "actions", "enabled", "state", "state_reason", "state_changed_at", "datapoints",
                  "last_evaluated_at", "next_eval_at", "created_at"]
        read_only_fields = fields


class AlarmCreatedSerializer(AlarmSerializer):
    """The create answer is the only one that shows the webhook signing secret."""

    webhook_secret = serializers.CharField(read_only=True, help_text="signs this alarm's webhooks; shown once")

    class Meta(AlarmSerializer.Meta):
        fields = [*AlarmSerializer.Meta.fields, "webhook_secret"]
        read_only_fields = fields


class AlarmWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(max_length=500, required=False, allow_blank=True)
    target_kind = serializers.CharField(max_length=32, help_text="workload or tenant (more where registered)")
    target_id = serializers.CharField(max_length=64, required=False, allow_blank=True,
                                      help_text="the workload's id; empty for the tenant")
    metric = serializers.CharField(max_length=32, help_text="workload: gpu_util, gpu_mem_used, gpu_temp, power, "
                                                            "cost_rate; tenant: spend_rate, queued_gpus, queue_wait")
    statistic = serializers.ChoiceField(choices=Statistic.choices, required=False)
    period = serializers.IntegerField(min_value=60, max_value=86400, required=False,
                                      help_text="seconds, a multiple of 60 (default 60)")
    evaluation_periods = serializers.IntegerField(min_value=1, max_value=100, required=False)
    datapoints_to_alarm = serializers.IntegerField(min_value=1, max_value=100, required=False)
    threshold = serializers.FloatField(min_value=-1e12, max_value=1e12)
    comparison = serializers.ChoiceField(choices=Comparison.choices)
    treat_missing_data = serializers.ChoiceField(choices=MissingData.choices, required=False)
    actions = ActionsSerializer(required=False)
    enabled = serializers.BooleanField(required=False)


class AlarmActionSerializer(serializers.ModelSerializer):
    status = serializers.ChoiceField(choices=ActionStatus.choices)

    class Meta:
        model = AlarmAction
        fields = ["id", "type", "action", "status", "attempts", "next_attempt_at", "last_error", "outcome",
                  "created_at", "finished_at"]
        read_only_fields = fields


class AlarmHistorySerializer(serializers.ModelSerializer):
    old_state = serializers.ChoiceField(choices=AlarmState.choices)
    new_state = serializers.ChoiceField(choices=AlarmState.choices)
    datapoints = DatapointSerializer(many=True)
    actions = AlarmActionSerializer(many=True, help_text="what the change set off, with the delivery log")

    class Meta:
        model = AlarmHistory
        fields = ["id", "created_at", "old_state", "new_state", "reason", "datapoints", "actions"]
        read_only_fields = fields
