"""Tenancy in the operators' panel, and what every admin module shares.

`OperatorAdmin` runs each admin request as the signed-in operator (`acting_as`), so
whatever a service records in the audit log through an action, an add form or a
save names the operator and their address. `Outcome` collects what an action did to
each selected object and tells the operator in plain words: what changed, what was
already so, and what could not be done and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, F

from gpucloud.catalogue.models import Quota
from gpucloud.lib.errors import ServiceError
from gpucloud.lib.http import client_ip
from gpucloud.tenancy import services
from gpucloud.tenancy.audit import Actor, acting_as
from gpucloud.tenancy.choices import TenantStatus
from gpucloud.tenancy.models import ApiKey, AuditEvent, EmailVerification, Invitation, Membership, SshKey, Tenant


def operator_actor(request) -> Actor:
    return Actor(user=request.user, ip=client_ip(request))


class OperatorAdmin(admin.ModelAdmin):
    """A ModelAdmin whose writes (actions, add and change forms, deletes) are audited as
    the operator: services read the actor from the context, not from an argument."""

    def changelist_view(self, request, extra_context=None):
        with acting_as(operator_actor(request)):
            return super().changelist_view(request, extra_context)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        with acting_as(operator_actor(request)):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        with acting_as(operator_actor(request)):
            return super().delete_view(request, object_id, extra_context)


def names(items: list[str], limit: int = 8) -> str:
    """Names as "a, b and c"; a long list ends in "and N more", so a message stays short."""
    shown = items[:limit]
    rest = len(items) - len(shown)
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) <= 1:
        return "".join(shown)
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


@dataclass
class Outcome:
    """What one admin action did, object by object, to be told to the operator."""

    done: list[str] = field(default_factory=list)  # names of the objects changed
    notes: list[str] = field(default_factory=list)  # sentences: nothing to do, or a caveat
    failed: list[str] = field(default_factory=list)  # sentences: what could not be done, and why

    def attempt(self, name: str, verb: str, fn) -> object | None:
        """Run `fn()` for one object; a service's refusal becomes a sentence, not a 500."""
        try:
            result = fn()
        except ServiceError as e:
            self.failed.append(f"Could not {verb} {name}: {e.message}")
            return None
        self.done.append(name)
        return result

    def tell(self, modeladmin: admin.ModelAdmin, request, done: str) -> None:
        """`done` is a sentence with {names} (and optionally {n}) for the changed objects."""
        if self.done:
            modeladmin.message_user(
                request, done.format(names=names(self.done), n=len(self.done)), messages.SUCCESS
            )
        for note in self.notes:
            modeladmin.message_user(request, note, messages.WARNING)
        for why in self.failed:
            modeladmin.message_user(request, why, messages.ERROR)


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


class GrantCreditForm(forms.Form):
    """The second step of "Grant credit": how much, and why (the memo is on the ledger)."""

    amount = forms.DecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        help_text="Added to each selected tenant's balance, in its account currency.",
        error_messages={
            "min_value": "A credit is a positive amount: at least 0.01.",
            "max_decimal_places": "Cents at most: two decimal places.",
        },
    )
    memo = forms.CharField(
        max_length=300,
        help_text="Why: the tenant reads it on their ledger, the audit log keeps it.",
        error_messages={
            "required": "Say why the credit is granted; the tenant reads it on their ledger."
        },
    )


@admin.register(Tenant)
class TenantAdmin(OperatorAdmin):
    list_display = [
        "name",
        "slug",
        "plan",
        "status",
        "balance",
        "fair_share_weight",
        "member_count",
        "created_at",
    ]
    list_filter = ["status", "plan"]
    search_fields = ["name", "slug", "memberships__user__email"]
    readonly_fields = ["id", "created_at", "status", "suspended_reason", "launch_blocked", "launch_blocked_reason"]
    inlines = [MembershipInline, QuotaInline]
    actions = ["suspend", "reactivate"]  # billing adds "grant_credit" (billing/admin.py)

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(_members=Count("memberships"), _balance=F("billing_account__balance"))
        )

    @admin.display(ordering="_members", description="members")
    def member_count(self, obj) -> int:
        return obj._members

    @admin.display(ordering="_balance", description="balance")
    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        # A member deleted in the inline goes as in MembershipAdmin: their keys with them.
        instances = formset.save(commit=False)
        for membership in formset.deleted_objects:
            services.member_remove_by_operator(membership=membership)
        for membership in instances:
            membership.save()
        formset.save_m2m()

    def balance(self, obj) -> str:
        return "—" if obj._balance is None else f"{obj._balance:.2f}"

    @admin.action(description="Suspend: can read and stop, cannot launch")
    def suspend(self, request, queryset):
        outcome = Outcome()
        for tenant in queryset:
            if tenant.status == TenantStatus.SUSPENDED:
                outcome.notes.append(f"{tenant.name} was already suspended: nothing changed.")
                continue
            outcome.attempt(
                tenant.name,
                "suspend",
                lambda t=tenant: services.tenant_suspend(
                    tenant=t, reason=f"suspended by operator {request.user.email}"
                ),
            )
        outcome.tell(
            self,
            request,
            "Suspended {names}: they can still read and stop their work, but launch nothing new.",
        )

    @admin.action(description="Resume: can launch again")
    def reactivate(self, request, queryset):
        outcome = Outcome()
        for tenant in queryset:
            if tenant.status == TenantStatus.ACTIVE:
                outcome.notes.append(f"{tenant.name} was not suspended: nothing changed.")
                continue
            outcome.attempt(
                tenant.name, "resume", lambda t=tenant: services.tenant_reactivate(tenant=t)
            )
        outcome.tell(self, request, "Resumed {names}: they can launch again.")


@admin.register(Membership)
class MembershipAdmin(OperatorAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "tenant__name", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user", "tenant"]

    # Deleting a membership here removes the member as the console does: their API keys
    # revoked, their SSH keys deleted (a bare delete would leave them for a rejoin).
    def delete_model(self, request, obj):
        services.member_remove_by_operator(membership=obj)

    def delete_queryset(self, request, queryset):
        for membership in queryset.select_related("tenant", "user"):
            services.member_remove_by_operator(membership=membership)


@admin.register(SshKey)
class SshKeyAdmin(OperatorAdmin):
    """Members' saved SSH public keys: members save their own; an operator may delete one
    (audited as the member's own removal is)."""

    list_display = ["name", "user", "tenant", "fingerprint", "created_at"]
    search_fields = ["name", "user__email", "tenant__name", "tenant__slug"]
    list_select_related = ["user", "tenant"]
    readonly_fields = ["tenant", "user", "name", "public_key", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        services.ssh_key_remove(key=obj)

    def delete_queryset(self, request, queryset):
        for key in queryset.select_related("tenant"):
            services.ssh_key_remove(key=key)


@admin.register(Invitation)
class InvitationAdmin(OperatorAdmin):
    list_display = [
        "email",
        "tenant",
        "role",
        "created_at",
        "expires_at",
        "accepted_at",
        "revoked_at",
    ]
    list_filter = ["role"]
    search_fields = ["email", "tenant__name"]
    list_select_related = ["tenant"]
    readonly_fields = ["token_hash", "accepted_by", "accepted_at"]


@admin.register(EmailVerification)
class EmailVerificationAdmin(OperatorAdmin):
    """Self-service sign-ups and whether their address is confirmed (read-only: the emailed
    link confirms, and grants the sign-up credit; an operator grants credit by hand instead)."""

    list_display = ["email", "user", "tenant", "created_at", "verified_at"]
    list_filter = ["verified_at"]
    search_fields = ["email", "tenant__name"]
    list_select_related = ["user", "tenant"]
    readonly_fields = ["user", "email", "tenant", "created_at", "verified_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(OperatorAdmin):
    list_display = [
        "prefix",
        "name",
        "tenant",
        "created_by",
        "scopes",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "tenant__name", "created_by__email"]
    list_select_related = ["tenant", "created_by"]
    # Keys are created by members (the secret is shown once, to them); operators revoke or limit.
    readonly_fields = [
        "id",
        "tenant",
        "created_by",
        "prefix",
        "secret_hash",
        "scopes",
        "created_at",
        "last_used_at",
        "last_used_ip",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        outcome = Outcome()
        for key in queryset:
            label = f"{key.prefix}… ({key.tenant})"
            if key.revoked_at is not None:
                outcome.notes.append(f"Key {label} was already revoked.")
                continue
            outcome.attempt(label, "revoke", lambda k=key: services.api_key_revoke(key=k))
        outcome.tell(self, request, "Revoked {names}: they no longer authenticate.")


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = [
        "created_at",
        "tenant",
        "actor",
        "action",
        "object_type",
        "object_repr",
        "source_ip",
    ]
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
# The index links the fleet page (frontend/fleet); a template of our own name, because
# django.contrib.admin comes first in INSTALLED_APPS and its admin/index.html would win.
admin.site.index_template = "admin/gpucloud_index.html"


# Sign-in lockouts (django-axes): operators lift one by deleting its access attempt(s); each
# lift is audited as `auth.unlock`, as the lockout itself is as `auth.lockout`.
from axes.admin import AccessAttemptAdmin  # noqa: E402
from axes.models import AccessAttempt  # noqa: E402

from gpucloud.tenancy.audit import audit_record  # noqa: E402

admin.site.unregister(AccessAttempt)


@admin.register(AccessAttempt)
class AuditedAccessAttemptAdmin(OperatorAdmin, AccessAttemptAdmin):
    def _audit_unlock(self, attempt: AccessAttempt) -> None:
        audit_record(tenant=None, action="auth.unlock", object_type="accessattempt", object_id=str(attempt.pk),
                     object_repr=(attempt.username or "")[:200],
                     data={"username": attempt.username, "ip_address": attempt.ip_address,
                           "failures": attempt.failures_since_start})

    def delete_model(self, request, obj):
        self._audit_unlock(obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for attempt in queryset:
            self._audit_unlock(attempt)
        super().delete_queryset(request, queryset)
