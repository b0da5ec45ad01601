"""Prepaid accounts, the immutable ledger, metering watermarks, invoices, budgets, spot floors.

docs/billing.md describes the money rules; billing/pricing.py and billing/metering.py
hold the arithmetic.
"""
from __future__ import annotations

import secrets
import uuid
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from billing.choices import EntryKind, InvoiceStatus, TopUpStatus
from gpucloud.catalogue.choices import PriceKind
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet
from scheduler.models import Workload
from volumes.models import Volume

MONEY = {"max_digits": 18, "decimal_places": 6}  # ledger money: micro-units
CENTS = {"max_digits": 14, "decimal_places": 2}  # invoices and budgets: cents
PRICE_SECONDS = {"max_digits": 24, "decimal_places": 4}  # exact usage (pricing.py rule 2)


class Account(models.Model):
    """A tenant's prepaid account. `balance` is the sum of its ledger entries, kept in the
    same transaction as every entry (so launches and the scheduler read one row, not a SUM).
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True,
                                  related_name="billing_account")
    balance = models.DecimalField(default=Decimal(0), **MONEY)
    currency = models.CharField(max_length=3, default="USD")
    # When the balance last reached zero; running on-demand work stops BILLING_GRACE_S later.
    exhausted_since = models.DateTimeField(null=True, blank=True)
    low_balance_notified_at = models.DateTimeField(null=True, blank=True)
    # A hard-stop budget is spent this month: nothing new is admitted (set by the budget check).
    budget_blocked = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant__name"]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.balance} {self.currency}"


class LedgerEntry(models.Model):
    """One charge or credit. Immutable: a mistake is corrected by another entry.

    Usage entries carry what was billed: the workload, one slice of time
    [period_start, period_end) at one price, its running seconds and exact
    price-seconds. (workload, period_start) is unique: a slice is never posted twice.
    """

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="ledger_entries")
    kind = models.CharField(max_length=16, choices=EntryKind.choices)
    amount = models.DecimalField(**MONEY, help_text="positive credits, negative charges")
    memo = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # usage only
    workload = models.ForeignKey(Workload, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="ledger_entries")
    instance_type = models.ForeignKey(InstanceType, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+")
    region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    price_kind = models.CharField(max_length=10, choices=PriceKind.choices, blank=True)
    per_hour = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    nodes = models.PositiveSmallIntegerField(default=1)
    gpu_milli = models.PositiveIntegerField(default=0, help_text="milli-GPUs held (all nodes)")
    period_start = models.DateTimeField(null=True, blank=True)
    period_end = models.DateTimeField(null=True, blank=True)
    seconds = models.PositiveIntegerField(default=0)
    price_seconds = models.DecimalField(default=Decimal(0), **PRICE_SECONDS)
    # storage only: the volume and its size in the slice (per_hour is then per_gib_hour × gib)
    volume = models.ForeignKey(Volume, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    gib = models.PositiveIntegerField(default=0)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["volume", "period_start"], condition=Q(volume__isnull=False),
                                    name="ledger_storage_slice_once"),
            models.CheckConstraint(
                condition=~Q(kind=EntryKind.STORAGE) | (
                    Q(volume__isnull=False, period_start__isnull=False, period_end__gt=models.F("period_start"),
                      seconds__gt=0, gib__gt=0, amount__lte=0)),
                name="ledger_storage_complete"),
            models.UniqueConstraint(fields=["workload", "period_start"], condition=Q(workload__isnull=False),
                                    name="ledger_slice_once"),
            models.CheckConstraint(
                condition=~Q(kind=EntryKind.USAGE) | (
                    Q(workload__isnull=False, period_start__isnull=False, period_end__gt=models.F("period_start"),
                      seconds__gt=0, amount__lte=0)),
                name="ledger_usage_complete"),
            models.CheckConstraint(condition=Q(kind=EntryKind.USAGE) | Q(workload__isnull=True),
                                   name="ledger_only_usage_has_workload"),
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="ledger_tenant_recent"),
            models.Index(fields=["tenant", "period_start"], condition=Q(kind="usage"), name="ledger_usage_period"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} ({self.tenant_id})"

    def save(self, *args, **kwargs):
        # The ledger is append-only; the admin and the services only ever add rows.
        if not self._state.adding:
            raise ValueError("Ledger entries are immutable; post a correcting entry instead.")
        super().save(*args, **kwargs)


class Meter(models.Model):
    """A workload's metering watermark: every second before `metered_until` is posted.

    It advances in the same transaction as the ledger entries it covers, so a run
    killed at any point either posted a window whole or not at all.
    """

    workload = models.OneToOneField(Workload, on_delete=models.CASCADE, primary_key=True, related_name="meter")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    metered_until = models.DateTimeField()
    # Cumulative exact usage and money posted so far (pricing.py rule 3: rounding telescopes).
    price_seconds = models.DecimalField(default=Decimal(0), **PRICE_SECONDS)
    amount = models.DecimalField(default=Decimal(0), **MONEY)
    seconds = models.PositiveBigIntegerField(default=0)
    # False while the workload may still have unposted running seconds.
    done = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["metered_until"], condition=Q(done=False), name="meter_open")]

    def __str__(self) -> str:
        return f"{self.workload_id} until {self.metered_until:%Y-%m-%d %H:%M:%S}"


class VolumeMeter(models.Model):
    """A volume's metering watermark (billing/storage.py): the same rule as `Meter`, per
    GiB-second from its creation until its deletion."""

    volume = models.OneToOneField(Volume, on_delete=models.CASCADE, primary_key=True, related_name="meter")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    metered_until = models.DateTimeField()
    price_seconds = models.DecimalField(default=Decimal(0), **PRICE_SECONDS)
    amount = models.DecimalField(default=Decimal(0), **MONEY)
    gib_seconds = models.PositiveBigIntegerField(default=0)
    done = models.BooleanField(default=False)  # deleted and metered to its deletion
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["metered_until"], condition=Q(done=False), name="volume_meter_open")]

    def __str__(self) -> str:
        return f"{self.volume_id} until {self.metered_until:%Y-%m-%d %H:%M:%S}"


class MeteringCursor(models.Model):
    """How far the metering run has scanned the transition log for workloads to meter."""

    name = models.CharField(max_length=32, primary_key=True, default="default")
    events_until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name}: events until {self.events_until:%Y-%m-%d %H:%M:%S}"


class Invoice(models.Model):
    """A tenant's statement for one calendar month (UTC), from its usage entries."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invoices")
    period_start = models.DateField(help_text="the first day of the month")
    period_end = models.DateField(help_text="the first day of the next month (exclusive)")
    status = models.CharField(max_length=10, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT)
    currency = models.CharField(max_length=3, default="USD")
    total = models.DecimalField(default=Decimal(0), **CENTS)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    issued_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    payment_reference = models.CharField(max_length=200, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-period_start"]
        constraints = [models.UniqueConstraint(fields=["tenant", "period_start"], name="invoice_one_per_month")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.period_start:%Y-%m} ({self.status})"

    @property
    def number(self) -> str:
        return f"{self.period_start:%Y%m}-{str(self.pk)[:8].upper()}"


class InvoiceLine(models.Model):
    """Usage of one instance type, region and kind at one price within the invoice's month."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    # null on a storage line (kind "storage": volumes, per GiB-hour)
    instance_type = models.ForeignKey(InstanceType, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=10, choices=[*PriceKind.choices, ("storage", "Storage")])
    per_hour = models.DecimalField(max_digits=12, decimal_places=4, help_text="instance price per hour")
    unit_price = models.DecimalField(max_digits=16, decimal_places=6, help_text="price per GPU-hour")
    seconds = models.PositiveBigIntegerField()
    gpu_hours = models.DecimalField(max_digits=16, decimal_places=4)
    price_seconds = models.DecimalField(**PRICE_SECONDS)
    amount = models.DecimalField(**CENTS)
    gib_hours = models.DecimalField(max_digits=20, decimal_places=4, default=Decimal(0),
                                    help_text="storage lines: GiB-hours of volumes")

    class Meta:
        ordering = ["invoice", "instance_type__code", "region__code", "kind", "per_hour"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "instance_type", "region", "kind", "per_hour"],
                                    name="invoice_line_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_type} {self.region} {self.kind} @ {self.per_hour}: {self.amount}"


def _webhook_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(24)


def _default_thresholds() -> list[int]:
    return [50, 80, 100]


class Budget(models.Model):
    """A monthly spending limit with alert thresholds (percent) and an optional hard stop."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    name = models.CharField(max_length=100, default="monthly")
    monthly_amount = models.DecimalField(validators=[MinValueValidator(Decimal("0.01"))], **CENTS)
    thresholds = models.JSONField(default=_default_thresholds, help_text="percentages, e.g. [50, 80, 100]")
    notify_email = models.BooleanField(default=True, help_text="email the tenant's owners and admins")
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret = models.CharField(max_length=64, default=_webhook_secret)
    hard_stop = models.BooleanField(default=False, help_text="refuse new launches past 100 %")
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name", "created_at"]
        constraints = [models.CheckConstraint(condition=Q(monthly_amount__gt=0), name="budget_positive")]

    def __str__(self) -> str:
        return f"{self.tenant} {self.name}: {self.monthly_amount}/month"


class BudgetAlert(models.Model):
    """A threshold a budget crossed in a month: created once, delivered by a task after commit."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    month = models.DateField()
    threshold = models.PositiveSmallIntegerField(validators=[MaxValueValidator(1000)])
    spend = models.DecimalField(**CENTS)
    created_at = models.DateTimeField(default=timezone.now)
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_delivered_at = models.DateTimeField(null=True, blank=True)
    webhook_attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["budget", "month", "threshold"], name="budget_alert_once")]

    def __str__(self) -> str:
        return f"{self.budget} {self.month:%Y-%m} {self.threshold}%"


class SpotFloor(models.Model):
    """The operator's floor for spot prices of a GPU model in a region, as a share of on demand."""

    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="+")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="+")
    floor_fraction = models.DecimalField(max_digits=5, decimal_places=4,
                                         validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))])

    class Meta:
        ordering = ["region", "gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["region", "gpu_model"], name="spot_floor_unique"),
            models.CheckConstraint(condition=Q(floor_fraction__gte=0) & Q(floor_fraction__lte=1),
                                   name="spot_floor_range"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model} in {self.region}: floor {self.floor_fraction:%}"


class TopUp(models.Model):
    """A renter's request to add credit, and how it was paid (docs/billing.md, "Adding credit").

    Filed from the console through the payment provider (`billing/payments.py`): the default
    one leaves it for an operator to approve in the admin; Stripe Checkout pays it and says so
    with a signed webhook. The credit lands once: `topup_credit` moves a `requested` row to
    `paid` under its lock with one ledger entry (`entry`, unique), and `(provider, paid_event)`
    is unique, so a replayed or duplicated provider event can never pay twice.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="topups")
    amount = models.DecimalField(**CENTS)
    currency = models.CharField(max_length=3, default="USD")
    provider = models.CharField(max_length=32, help_text="the payment provider that handles it")
    status = models.CharField(max_length=10, choices=TopUpStatus.choices, default=TopUpStatus.REQUESTED)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    # the provider's own reference (a Checkout Session id), once it has one
    provider_ref = models.CharField(max_length=200, blank=True)
    # what paid it: the provider's event id (Stripe's `evt_…`) or the operator's approval
    paid_event = models.CharField(max_length=200, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="the operator who approved or rejected it")
    entry = models.OneToOneField(LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, related_name="topup")

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "paid_event"], condition=~Q(paid_event=""),
                                    name="topup_event_pays_once"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="topup_positive"),
            models.CheckConstraint(condition=~Q(status="paid") | (Q(entry__isnull=False) & ~Q(paid_event="")),
                                   name="topup_paid_has_entry"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} top-up {self.amount} {self.currency} ({self.status})"
