from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from gpucloud.api.serializers import StrictSerializer
from gpucloud.tenancy.choices import Role, Scope
from gpucloud.tenancy.models import ApiKey, AuditEvent, Invitation, Membership, Tenant


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "plan", "status", "suspended_reason", "created_at"]
        read_only_fields = fields


class MyTenantSerializer(serializers.Serializer):
    tenant = TenantSerializer(read_only=True)
    role = serializers.ChoiceField(choices=Role.choices, read_only=True)


class TenantUpdateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, min_length=1)


class UserSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    email = serializers.EmailField(read_only=True)
    name = serializers.SerializerMethodField()

    def get_name(self, user) -> str:
        return user.get_full_name()


class MemberSerializer(serializers.ModelSerializer):
    user = UserSerializer(read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "user", "role", "created_at"]
        read_only_fields = fields


class MemberUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(choices=Role.choices)


class InvitationSerializer(serializers.ModelSerializer):
    invited_by = serializers.EmailField(source="invited_by.email", read_only=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "email", "role", "invited_by", "created_at", "expires_at", "accepted_at",
                  "revoked_at"]
        read_only_fields = fields


class InvitationCreateSerializer(StrictSerializer):
    email = serializers.EmailField(max_length=254)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class InvitationCreatedSerializer(InvitationSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once: send it to the invitee.")

    class Meta(InvitationSerializer.Meta):
        fields = [*InvitationSerializer.Meta.fields, "token"]
        read_only_fields = fields


class InvitationAcceptSerializer(StrictSerializer):
    token = serializers.CharField(max_length=200)


class ApiKeySerializer(serializers.ModelSerializer):
    created_by = serializers.EmailField(source="created_by.email", read_only=True)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_by", "created_at", "expires_at",
                  "revoked_at", "last_used_at", "last_used_ip", "active"]
        read_only_fields = fields

    def get_active(self, key) -> bool:
        return key.is_active()


class ApiKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, min_length=1)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=Scope.choices), min_length=1, max_length=3,
        default=lambda: [Scope.READ],
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    expires_in_days = serializers.IntegerField(required=False, min_value=1, max_value=3650)

    def validate(self, attrs):
        if attrs.get("expires_at") and attrs.get("expires_in_days"):
            raise serializers.ValidationError("Give expires_at or expires_in_days, not both.")
        days = attrs.pop("expires_in_days", None)
        if days:
            attrs["expires_at"] = timezone.now() + timedelta(days=days)
        expires = attrs.get("expires_at")
        if expires is not None and expires <= timezone.now():
            raise serializers.ValidationError({"expires_at": ["Must be in the future."]})
        return attrs


class ApiKeyCreatedSerializer(ApiKeySerializer):
    secret = serializers.CharField(read_only=True, help_text="The full key. Shown only this once.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "secret"]
        read_only_fields = fields


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "created_at", "actor", "action", "object_type", "object_id",
                  "object_repr", "data", "source_ip"]
        read_only_fields = fields


class SignupSerializer(StrictSerializer):
    email = serializers.EmailField(max_length=254)
    password = serializers.CharField(max_length=128, write_only=True, style={"input_type": "password"})
    tenant_name = serializers.CharField(max_length=100, min_length=1)
    name = serializers.CharField(max_length=150, required=False, default="")
    create_api_key = serializers.BooleanField(
        default=False, help_text="Also return an admin-scoped API key (shown once)."
    )


class SignupResultSerializer(serializers.Serializer):
    user = UserSerializer()
    tenant = TenantSerializer()
    api_key = serializers.CharField(allow_null=True)
    email_verified = serializers.BooleanField(
        help_text="False until the emailed link is opened; the sign-up credit comes then."
    )
