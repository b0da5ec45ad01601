from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing.choices import UsageGroup
from billing.models import Budget, Invoice, InvoiceLine, LedgerEntry
from gpucloud.api.serializers import StrictModelSerializer, StrictQuerySerializer
from gpucloud.catalogue.choices import PriceKind
from gpucloud.catalogue.models import Price
from gpucloud.lib.outbound import outbound_url_validator


class LedgerEntrySerializer(serializers.ModelSerializer):
    instance_type = serializers.CharField(source="instance_type.code", default=None, allow_null=True)
    region = serializers.CharField(source="region.code", default=None, allow_null=True)
    # "" on entries that price nothing (credits, adjustments): the schema must say so
    price_kind = serializers.ChoiceField(choices=PriceKind.choices, allow_blank=True, read_only=True)

    class Meta:
        model = LedgerEntry
        fields = ["id", "created_at", "kind", "amount", "memo", "workload", "instance_type", "region", "price_kind",
                  "per_hour", "nodes", "period_start", "period_end", "seconds"]
        read_only_fields = fields


class InvoiceLineSerializer(serializers.ModelSerializer):
    instance_type = serializers.CharField(source="instance_type.code", allow_null=True,
                                          help_text="null on a storage line (kind `storage`: volumes)")
    region = serializers.CharField(source="region.code")

    class Meta:
        model = InvoiceLine
        fields = ["instance_type", "region", "kind", "per_hour", "unit_price", "gpu_hours", "gib_hours", "seconds",
                  "amount"]
        read_only_fields = fields


class InvoiceSerializer(serializers.ModelSerializer):
    number = serializers.CharField(read_only=True)
    lines = InvoiceLineSerializer(many=True, read_only=True)
    refreshed_at = serializers.DateTimeField(
        source="updated_at", read_only=True,
        help_text="when its lines were last rebuilt from the metered usage (a draft is rebuilt as usage "
                  "is metered, until it is issued)")

    class Meta:
        model = Invoice
        fields = ["id", "number", "period_start", "period_end", "status", "currency", "total", "issued_at", "paid_at",
                  "refreshed_at", "lines"]
        read_only_fields = fields


class BudgetSerializer(serializers.ModelSerializer):
    # "" when the budget has no webhook: declared, so the schema can say "a URI or empty"
    webhook_url = serializers.URLField(read_only=True, allow_blank=True)

    class Meta:
        model = Budget
        fields = ["id", "name", "monthly_amount", "thresholds", "notify_email", "webhook_url", "hard_stop",
                  "created_at"]
        read_only_fields = fields


class BudgetCreatedSerializer(BudgetSerializer):
    """The create answer is the only one that shows the webhook secret."""

    class Meta(BudgetSerializer.Meta):
        fields = [*BudgetSerializer.Meta.fields, "webhook_secret"]
        read_only_fields = fields


class BudgetWriteSerializer(StrictModelSerializer):
    thresholds = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=1000),
                                       min_length=1, max_length=10, required=False,
                                       help_text="alert at these percentages of the monthly amount")
    monthly_amount = serializers.DecimalField(max_digits=14, decimal_places=2, min_value=Decimal("0.01"))

    class Meta:
        model = Budget
        fields = ["name", "monthly_amount", "thresholds", "notify_email", "webhook_url", "hard_stop"]
        # Checked again at each delivery (DNS can change): docs/billing.md, gpucloud/lib/outbound.py.
        extra_kwargs = {"webhook_url": {"validators": [outbound_url_validator],
                                        "help_text": "https, a public address; empty for none"}}


class SpotPriceSerializer(serializers.ModelSerializer):
    instance_type = serializers.CharField(source="instance_type.code")
    region = serializers.CharField(source="region.code")

    class Meta:
        model = Price
        fields = ["instance_type", "region", "per_hour", "currency", "effective_from"]
        read_only_fields = fields


class UsageQuerySerializer(StrictQuerySerializer):
    # "from" is a Python keyword: the query parameters are read into this by name.
    to = serializers.DateTimeField(required=False, help_text="exclusive; default now")
    group_by = serializers.ChoiceField(choices=UsageGroup.choices, default=UsageGroup.INSTANCE_TYPE)

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(required=False, help_text="default: the start of this month")
        return fields

    def validate(self, attrs):
        if attrs.get("from") and attrs.get("to") and attrs["from"] >= attrs["to"]:
            raise serializers.ValidationError({"from": ["Must be before to."]})
        return attrs


class UsageRowSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    seconds = serializers.IntegerField()
    gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=4)
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class StorageUsageSerializer(serializers.Serializer):
    gib_hours = serializers.DecimalField(max_digits=20, decimal_places=4)
    seconds = serializers.IntegerField()
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class UsageSerializer(serializers.Serializer):
    group_by = serializers.CharField()
    currency = serializers.CharField()
    rows = UsageRowSerializer(many=True)
    storage = StorageUsageSerializer(help_text="volumes in the period (GiB-hours), beside the rows' compute")
    total = serializers.DecimalField(max_digits=14, decimal_places=2, help_text="the rows' amounts plus storage")

    def get_fields(self):
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField()
        fields["to"] = serializers.DateTimeField()
        return fields


class BudgetStatusSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="budget.id")
    name = serializers.CharField(source="budget.name")
    monthly_amount = serializers.DecimalField(source="budget.monthly_amount", max_digits=14, decimal_places=2)
    hard_stop = serializers.BooleanField(source="budget.hard_stop")
    spend = serializers.DecimalField(max_digits=14, decimal_places=2)
    percent = serializers.DecimalField(max_digits=8, decimal_places=1)


class BalanceSerializer(serializers.Serializer):
    balance = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()
    low = serializers.BooleanField(help_text="below the low-balance warning level")
    exhausted_since = serializers.DateTimeField(allow_null=True)
    month_to_date = serializers.DecimalField(max_digits=14, decimal_places=2)
    budgets = BudgetStatusSerializer(many=True)
