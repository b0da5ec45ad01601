from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from gpucloud.api.serializers import StrictSerializer
from volumes.models import Volume, VolumeEvent
from volumes.selectors import open_move
from volumes.services import MAX_SIZE_GIB, active_attachment


class VolumeCreateSerializer(StrictSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100,
                                  help_text="unique among your volumes; letters, digits, . _ -")
    region = serializers.CharField(max_length=32, help_text="e.g. us-east-1: work using it runs there")
    size_gib = serializers.IntegerField(min_value=1, max_value=MAX_SIZE_GIB)


class VolumeResizeSerializer(StrictSerializer):
    size_gib = serializers.IntegerField(min_value=1, max_value=MAX_SIZE_GIB, help_text="only grows")


class VolumeEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = VolumeEvent
        fields = ["created_at", "kind", "message"]


class AttachedToSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField()
    name = serializers.CharField()
    state = serializers.CharField()
    mount_path = serializers.CharField()


class VolumeSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")
    host = serializers.SerializerMethodField(help_text="the host its data lives on; null until first used")
    attached_to = serializers.SerializerMethodField(
        help_text="the queued or running workload using it (one writer at a time), or null")
    state = serializers.SerializerMethodField(
        help_text="available, attached, over_size, or moving (an operator moves its data to another host; "
                  "attaching it waits: 409 volume_moving)")

    class Meta:
        model = Volume
        fields = ["id", "name", "region", "size_gib", "host", "state", "attached_to", "used_bytes",
                  "measured_at", "over_size_since", "created_at", "updated_at"]
        read_only_fields = fields

    def _active(self, obj):
        got = getattr(obj, "active_attachments", None)
        if got is None:
            one = active_attachment(obj)
            got = [one] if one else []
        return got[0] if got else None

    def get_host(self, obj) -> str | None:
        return obj.host.name if obj.host_id else None

    def get_state(self, obj) -> str:
        moving = getattr(obj, "open_moves", None)
        if moving is None:
            one = open_move(obj.pk)
            moving = [one] if one else []
        if moving:
            return "moving"
        if obj.over_size_since is not None:
            return "over_size"
        return "attached" if self._active(obj) is not None else "available"

    @extend_schema_field(AttachedToSerializer(allow_null=True))
    def get_attached_to(self, obj) -> dict | None:
        att = self._active(obj)
        if att is None:
            return None
        w = att.workload
        return {"id": str(w.pk), "kind": w.kind, "name": w.name, "state": w.state, "mount_path": att.mount_path}


class VolumeDetailSerializer(VolumeSerializer):
    events = serializers.SerializerMethodField()

    class Meta(VolumeSerializer.Meta):
        fields = [*VolumeSerializer.Meta.fields, "events"]
        read_only_fields = fields

    @extend_schema_field(VolumeEventSerializer(many=True))
    def get_events(self, obj) -> list[dict]:
        return VolumeEventSerializer(obj.events.all()[:50], many=True).data
