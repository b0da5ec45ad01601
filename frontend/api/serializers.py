"""SSH keys over the API: the same rows and services as the console's SSH-keys page."""
from __future__ import annotations

from rest_framework import serializers

from gpucloud.api.serializers import StrictSerializer
from gpucloud.tenancy.models import SshKey


class SshKeySerializer(serializers.ModelSerializer):
    fingerprint = serializers.SerializerMethodField()

    class Meta:
        model = SshKey
        fields = ["id", "name", "public_key", "fingerprint", "created_at"]
        read_only_fields = fields

    def get_fingerprint(self, obj: SshKey) -> str:
        return obj.fingerprint


class SshKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, min_length=1)
    public_key = serializers.CharField(max_length=4096)
