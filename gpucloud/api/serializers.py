"""Serializer base: unknown input fields are an error, not silently dropped.

A typo like `{"scope": ["read"]}` for `scopes` must answer 400, or the user
gets a key with defaults they never asked for.
"""
from __future__ import annotations

from rest_framework import serializers


class StrictMixin:
    def to_internal_value(self, data):
        if isinstance(data, dict):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


class StrictSerializer(StrictMixin, serializers.Serializer):
    pass


class StrictModelSerializer(StrictMixin, serializers.ModelSerializer):
    pass
