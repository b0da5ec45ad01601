from __future__ import annotations

from rest_framework import serializers

from gpucloud.api.serializers import StrictSerializer
from notifications.choices import Channel, Event, Scope
from notifications.models import Notification, NotificationSettings
from notifications.selectors import channels_for


class NotificationSerializer(serializers.ModelSerializer):
    read = serializers.SerializerMethodField()

    class Meta:
        model = Notification
        fields = ["id", "event", "subject", "body", "link", "created_at", "read", "read_at", "email_status",
                  "webhook_status"]

    def get_read(self, obj: Notification) -> bool:
        return obj.read_at is not None


class MarkReadSerializer(StrictSerializer):
    ids = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, max_length=1000,
                                help_text="the notifications to mark read; all of yours in this tenant without it")


class MarkedSerializer(serializers.Serializer):
    marked = serializers.IntegerField()


class SettingsSerializer(serializers.ModelSerializer):
    """A person's choices: every event with its channels (the defaults where never changed)."""

    channels = serializers.SerializerMethodField()
    webhook_secret_set = serializers.SerializerMethodField()

    class Meta:
        model = NotificationSettings
        fields = ["scope", "channels", "webhook_url", "webhook_secret_set"]

    def get_channels(self, obj: NotificationSettings) -> dict[str, list[str]]:
        events = [e for e in Event if obj.tenant_id is None or not e.startswith("host.")]
        return {e.value: list(channels_for(obj, e)) for e in events}

    def get_webhook_secret_set(self, obj: NotificationSettings) -> bool:
        return bool(obj.webhook_secret_sealed)


class SettingsUpdatedSerializer(SettingsSerializer):
    webhook_secret = serializers.CharField(allow_null=True, help_text="shown once, when the URL was set or changed")

    class Meta(SettingsSerializer.Meta):
        fields = [*SettingsSerializer.Meta.fields, "webhook_secret"]


class SettingsWriteSerializer(StrictSerializer):
    scope = serializers.ChoiceField(choices=Scope.choices, required=False)
    channels = serializers.DictField(child=serializers.ListField(child=serializers.ChoiceField(Channel.choices)),
                                     required=False)
    webhook_url = serializers.CharField(max_length=500, required=False, allow_blank=True)
