from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from billing import services
from billing.choices import EntryKind, InvoiceStatus
from billing.models import (
    Account,
    Budget,
    BudgetAlert,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    Meter,
    MeteringCursor,
    SpotFloor,
    TopUp,
    VolumeMeter,
)
from gpucloud.lib.outbound import outbound_url_validator
from gpucloud.tenancy.admin import GrantCreditForm, OperatorAdmin, Outcome, TenantAdmin


class _ReadOnly(admin.ModelAdmin):
    """Rows written only by services: operators read them, never edit them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Account)
class AccountAdmin(_ReadOnly):
    list_display = [
        "tenant",
        "balance",
        "currency",
        "exhausted_since",
        "low_balance_notified_at",
        "budget_blocked",
    ]
    list_filter = ["budget_blocked", "currency"]
    search_fields = ["tenant__name", "tenant__slug"]
    list_select_related = ["tenant"]


class CreditForm(forms.ModelForm):
    kind = forms.ChoiceField(
        choices=[
            (k, v)
            for k, v in EntryKind.choices
            if k in (EntryKind.CREDIT, EntryKind.PAYMENT, EntryKind.ADJUSTMENT)
        ]
    )

    class Meta:
        model = LedgerEntry
        fields = ["tenant", "kind", "amount", "memo"]

    def clean(self):
        # The service's own rule, said on the form rather than as a 500 from save_model.
        data = super().clean()
        amount, kind = data.get("amount"), data.get("kind")
        if amount is not None and kind != EntryKind.ADJUSTMENT and amount <= 0:
            self.add_error(
                "amount",
                "A credit or payment is a positive amount; use an adjustment to take money off.",
            )
        return data


@admin.register(LedgerEntry)
class LedgerEntryAdmin(OperatorAdmin):
    """The ledger is append-only: operators add credits (and payments, adjustments) here."""

    list_display = [
        "created_at",
        "tenant",
        "kind",
        "amount",
        "workload",
        "instance_type",
        "region",
        "period_start",
        "seconds",
        "per_hour",
        "memo",
    ]
    list_filter = ["kind", "price_kind", "region"]
    search_fields = ["tenant__name", "tenant__slug", "memo", "workload__name"]
    list_select_related = ["tenant", "workload", "instance_type", "region"]
    date_hierarchy = "created_at"
    form = CreditForm

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        # Through the service (balance moved in the same transaction, audited as the operator).
        entry = services.credit_grant(
            tenant=obj.tenant, amount=obj.amount, memo=obj.memo, kind=obj.kind
        )
        obj.pk = entry.pk
        obj._state.adding = False


@admin.register(Meter)
class MeterAdmin(_ReadOnly):
    list_display = ["workload", "tenant", "metered_until", "seconds", "amount", "done"]
    list_filter = ["done"]
    search_fields = ["workload__name", "tenant__name", "tenant__slug"]
    list_select_related = ["workload", "tenant"]


@admin.register(VolumeMeter)
class VolumeMeterAdmin(_ReadOnly):
    list_display = ["volume", "tenant", "metered_until", "gib_seconds", "amount", "done"]
    list_filter = ["done"]
    search_fields = ["volume__name", "tenant__name", "tenant__slug"]
    list_select_related = ["volume", "tenant"]


@admin.register(MeteringCursor)
class MeteringCursorAdmin(_ReadOnly):
    list_display = ["name", "events_until", "updated_at"]
    search_fields = ["name"]


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = ["instance_type", "region", "kind", "per_hour", "unit_price", "gpu_hours", "amount"]
    readonly_fields = fields


@admin.register(Invoice)
class InvoiceAdmin(OperatorAdmin):
    list_display = ["period_start", "tenant", "status", "total", "currency", "issued_at", "paid_at"]
    list_filter = ["status", "period_start"]
    search_fields = ["tenant__name", "tenant__slug", "id"]
    list_select_related = ["tenant"]
    inlines = [InvoiceLineInline]
    readonly_fields = [
        "tenant",
        "period_start",
        "period_end",
        "status",
        "currency",
        "total",
        "issued_at",
        "paid_at",
        "payment_reference",
    ]
    actions = ["mark_paid"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Record payment in full (credits the ledger, marks paid)")
    def mark_paid(self, request, queryset):
        outcome = Outcome()
        for invoice in queryset.select_related("tenant"):
            label = f"{invoice.tenant} {invoice.period_start:%Y-%m}"
            if invoice.status != InvoiceStatus.ISSUED:
                outcome.notes.append(
                    f"The invoice of {label} is {invoice.get_status_display().lower()}, "
                    "not issued: only an issued invoice can be marked paid."
                )
                continue
            outcome.attempt(
                label,
                "mark paid the invoice of",
                lambda i=invoice: services.invoice_mark_paid(
                    invoice=i, amount=i.total, reference="recorded by operator"
                ),
            )
        outcome.tell(self, request, "Recorded payment in full of the invoices of {names}.")


@admin.register(TopUp)
class TopUpAdmin(OperatorAdmin):
    """Renters' requests to add credit. The default provider's wait here for an operator:
    *Approve and credit* puts the amount on the tenant's ledger once (approving again, or a
    request a provider already paid, changes nothing); *Reject* declines it."""

    list_display = ["created_at", "tenant", "amount", "currency", "provider", "status", "requested_by",
                    "decided_by", "paid_at"]
    list_filter = ["status", "provider"]
    search_fields = ["tenant__name", "tenant__slug", "id", "provider_ref", "paid_event"]
    list_select_related = ["tenant", "requested_by", "decided_by"]
    readonly_fields = ["tenant", "amount", "currency", "provider", "status", "requested_by", "created_at",
                       "provider_ref", "paid_event", "paid_at", "decided_by", "entry"]
    actions = ["approve", "reject"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _each(self, request, queryset, verb: str, fn, done: str) -> None:
        outcome = Outcome()
        for topup in queryset.select_related("tenant"):
            label = f"{topup.tenant} {topup.amount} {topup.currency}"
            changed = outcome.attempt(label, verb, lambda t=topup: fn(topup=t, operator=request.user))
            if changed is False:  # already decided (paid once, or rejected): nothing more happens
                outcome.done.remove(label)
                outcome.notes.append(f"The top-up of {label} is already {topup.get_status_display().lower()}: "
                                     "nothing changed.")
        outcome.tell(self, request, done)

    @admin.action(description="Approve and credit (adds the amount to the balance once)")
    def approve(self, request, queryset):
        self._each(request, queryset, "approve the top-up of", services.topup_approve,
                   "Credited the top-ups of {names}.")

    @admin.action(description="Reject (credits nothing)")
    def reject(self, request, queryset):
        self._each(request, queryset, "reject the top-up of", services.topup_reject,
                   "Rejected the top-ups of {names}.")


@admin.register(InvoiceLine)
class InvoiceLineAdmin(_ReadOnly):
    list_display = ["invoice", "instance_type", "region", "kind", "per_hour", "gpu_hours", "amount"]
    list_filter = ["kind", "region"]
    search_fields = ["invoice__tenant__name", "instance_type__code"]
    list_select_related = ["invoice__tenant", "instance_type", "region"]


class BudgetAdminForm(forms.ModelForm):
    """The operator's edit of a webhook URL passes the same outbound guard as the tenant's."""

    webhook_url = forms.URLField(max_length=500, required=False, assume_scheme="https",
                                 validators=[outbound_url_validator])

    class Meta:
        model = Budget
        fields = ["tenant", "name", "monthly_amount", "thresholds", "notify_email", "webhook_url", "webhook_secret",
                  "hard_stop", "created_at"]


@admin.register(Budget)
class BudgetAdmin(OperatorAdmin):
    form = BudgetAdminForm
    list_display = [
        "tenant",
        "name",
        "monthly_amount",
        "thresholds",
        "hard_stop",
        "notify_email",
        "webhook_url",
    ]
    list_filter = ["hard_stop", "notify_email"]
    search_fields = ["tenant__name", "tenant__slug", "name"]
    list_select_related = ["tenant"]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(_ReadOnly):
    list_display = [
        "created_at",
        "budget",
        "month",
        "threshold",
        "spend",
        "email_sent_at",
        "webhook_delivered_at",
        "webhook_attempts",
        "last_error",
    ]
    list_filter = ["threshold", "month"]
    search_fields = ["budget__tenant__name", "budget__name"]
    list_select_related = ["budget__tenant"]


@admin.register(SpotFloor)
class SpotFloorAdmin(OperatorAdmin):
    list_display = ["region", "gpu_model", "floor_fraction"]
    list_filter = ["region", "gpu_model"]
    search_fields = ["region__code", "gpu_model__code"]
    list_select_related = ["region", "gpu_model"]


# Billing adds its action to the tenants' admin: tenancy sits below billing and imports nothing of it.
@admin.action(description="Grant credit…")
def grant_credit(modeladmin, request, queryset):
    """Two steps: the action renders the form; its submit posts the action again + `apply`."""
    form = GrantCreditForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        amount, memo = form.cleaned_data["amount"], form.cleaned_data["memo"]
        outcome = Outcome()
        for tenant in queryset:
            outcome.attempt(
                tenant.name,
                "credit",
                lambda t=tenant: services.credit_grant(tenant=t, amount=amount, memo=memo),
            )
        outcome.tell(modeladmin, request, f"Granted {amount:.2f} of credit to {{names}}.")
        return None  # back to the list, where the messages show
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Grant credit",
        "opts": modeladmin.model._meta,
        "tenants": list(queryset),
        "form": form,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/tenancy/tenant/grant_credit.html", context)


TenantAdmin.actions = [*TenantAdmin.actions, grant_credit]
