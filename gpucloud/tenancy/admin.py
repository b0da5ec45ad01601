from __future__ import annotations

from django.contrib import admin, messages

from gpucloud.catalogue.models import Quota
from gpucloud.tenancy import services
from gpucloud.tenancy.audit import Actor, acting_as
from gpucloud.tenancy.models import ApiKey, AuditEvent, Invitation, Membership, Tenant


def _operator(request) -> Actor:
    return Actor(user=request.user, ip=request.META.get("REMOTE_ADDR"))


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]


class QuotaInline(admin.TabularInline):
    model = Quota
    extra = 0
    fields = ["gpu_model", "region", "max_gpus", "max_instances"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "plan", "status", "fair_share_weight", "member_count", "created_at"]
    list_filter = ["status", "plan"]
    search_fields = ["name", "slug", "memberships__user__email"]
    readonly_fields = ["id", "created_at", "status", "suspended_reason"]
    inlines = [MembershipInline, QuotaInline]
    actions = ["suspend", "reactivate"]

    def get_queryset(self, request):
        from django.db.models import Count

        return super().get_queryset(request).annotate(_members=Count("memberships"))

    @admin.display(ordering="_members", description="members")
    def member_count(self, obj) -> int:
        return obj._members

    @admin.action(description="Suspend: can read and stop, cannot launch")
    def suspend(self, request, queryset):
        with acting_as(_operator(request)):
            for tenant in queryset:
                services.tenant_suspend(tenant=tenant, reason=f"suspended by operator {request.user.email}")
        self.message_user(request, f"Suspended {queryset.count()} tenant(s).", messages.SUCCESS)

    @admin.action(description="Reactivate")
    def reactivate(self, request, queryset):
        with acting_as(_operator(request)):
            for tenant in queryset:
                services.tenant_reactivate(tenant=tenant)
        self.message_user(request, f"Reactivated {queryset.count()} tenant(s).", messages.SUCCESS)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "tenant__name", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["email", "tenant", "role", "created_at", "expires_at", "accepted_at", "revoked_at"]
    list_filter = ["role"]
    search_fields = ["email", "tenant__name"]
    list_select_related = ["tenant"]
    readonly_fields = ["token_hash", "accepted_by", "accepted_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "tenant", "created_by", "scopes", "created_at", "expires_at",
                    "revoked_at", "last_used_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "tenant__name", "created_by__email"]
    list_select_related = ["tenant", "created_by"]
    # Keys are created by members (the secret is shown once, to them); operators may revoke or limit.
    readonly_fields = ["id", "tenant", "created_by", "prefix", "secret_hash", "scopes", "created_at",
                       "last_used_at", "last_used_ip"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        with acting_as(_operator(request)):
            for key in queryset:
                services.api_key_revoke(key=key)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "actor", "action", "object_type", "object_repr", "source_ip"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor", "action", "object_id", "object_repr", "tenant__name"]
    list_select_related = ["tenant"]
    date_hierarchy = "created_at"

    # The audit log is append-only, also for operators.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# Operators find users by email in autocomplete fields above.
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.admin import UserAdmin  # noqa: E402

admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class GpucloudUserAdmin(UserAdmin):
    list_display = ["email", "first_name", "last_name", "is_staff", "is_active", "date_joined"]
    search_fields = ["email", "username", "first_name", "last_name"]


admin.site.site_header = "gpucloud operators"
admin.site.site_title = "gpucloud operators"
