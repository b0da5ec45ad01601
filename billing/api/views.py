"""Billing API: balance, ledger, usage, invoices (JSON, CSV, HTML), budgets, spot prices."""
from __future__ import annotations

import csv
import io
from datetime import datetime

import django_filters
from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, permissions, renderers, status, viewsets
from rest_framework.response import Response

from billing import selectors, services
from billing.api import serializers as s
from billing.choices import EntryKind
from billing.models import Invoice, LedgerEntry
from billing.payments import InvalidEvent
from gpucloud.api.filters import UtcIsoDateTimeFilter
from gpucloud.api.views import ApiView, TenantMixin, TenantViewSet
from gpucloud.catalogue.models import Price
from gpucloud.lib.errors import InvalidInput
from gpucloud.tenancy import permissions as perms

_READ = {"list": perms.BILLING_READ, "retrieve": perms.BILLING_READ}


class LedgerFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=EntryKind.choices)

    class Meta:
        model = LedgerEntry
        fields = ["kind"]


class LedgerViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Every charge and credit of your tenant: the balance is their sum."""

    selector = selectors.ledger_list
    serializer_class = s.LedgerEntrySerializer
    permission_map = _READ
    filterset_class = LedgerFilter
    ordering_fields = ["created_at", "amount"]
    lookup_value_regex = "[0-9]+"


class InvoiceCsvRenderer(renderers.BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data.encode() if isinstance(data, str) else data


class InvoiceHtmlRenderer(renderers.TemplateHTMLRenderer):
    format = "html"
    template_name = "billing/invoice.html"


def invoice_csv(invoice: Invoice) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["invoice", "period_start", "period_end", "status", "instance_type", "region", "kind",
                "gpu_hours", "unit_price_per_gpu_hour", "price_per_hour", "seconds", "amount", "currency",
                "gib_hours"])
    for line in invoice.lines.all():
        w.writerow([invoice.number, invoice.period_start, invoice.period_end, invoice.status,
                    line.instance_type.code if line.instance_type else "volumes", line.region.code, line.kind,
                    line.gpu_hours, line.unit_price, line.per_hour, line.seconds, line.amount, invoice.currency,
                    line.gib_hours])
    w.writerow([invoice.number, invoice.period_start, invoice.period_end, invoice.status, "total", "", "", "", "",
                "", "", invoice.total, invoice.currency])
    return out.getvalue()


class InvoiceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Monthly invoices. One invoice also as CSV (`?format=csv`) or a printable page (`?format=html`)."""

    selector = selectors.invoice_list
    serializer_class = s.InvoiceSerializer
    permission_map = _READ
    filterset_fields = ["status"]
    ordering_fields = ["period_start"]

    def get_renderers(self):
        base = [renderers.JSONRenderer(), renderers.BrowsableAPIRenderer()]
        if getattr(self, "action", None) == "retrieve":
            base += [InvoiceCsvRenderer(), InvoiceHtmlRenderer()]
        return base

    def finalize_response(self, request, response, *args, **kwargs):
        # Errors keep the API's one JSON shape, also when CSV or HTML was asked for.
        if getattr(response, "exception", False) and getattr(request, "accepted_renderer", None) \
                and request.accepted_renderer.format in ("csv", "html"):
            request.accepted_renderer, request.accepted_media_type = renderers.JSONRenderer(), "application/json"
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(parameters=[OpenApiParameter("format", str, enum=["json", "csv", "html"],
                                                description="csv: a spreadsheet; html: a printable page")])
    def retrieve(self, request, *args, **kwargs):
        invoice = self.get_object()
        fmt = request.accepted_renderer.format
        if fmt == "csv":
            name = f"invoice-{invoice.number}.csv"
            return Response(invoice_csv(invoice), headers={"Content-Disposition": f'attachment; filename="{name}"'})
        if fmt == "html":
            return Response({"invoice": invoice, "lines": list(invoice.lines.all()), "tenant": invoice.tenant})
        return Response(self.get_serializer(invoice).data)


class BudgetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantViewSet):
    """Monthly budgets: alerts at thresholds by email and signed webhook, an optional hard stop."""

    selector = selectors.budget_list
    serializer_class = s.BudgetSerializer
    permission_map = {**_READ, "create": perms.BILLING_MANAGE, "update": perms.BILLING_MANAGE,
                      "partial_update": perms.BILLING_MANAGE, "destroy": perms.BILLING_MANAGE}

    @extend_schema(request=s.BudgetWriteSerializer, responses={201: s.BudgetCreatedSerializer})
    def create(self, request, *args, **kwargs):
        ser = s.BudgetWriteSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        budget = services.budget_create(tenant=self.tenant, **ser.validated_data)
        return Response(s.BudgetCreatedSerializer(budget).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.BudgetWriteSerializer, responses=s.BudgetSerializer)
    def update(self, request, *args, **kwargs):
        budget = self.get_object()
        ser = s.BudgetWriteSerializer(budget, data=request.data, partial=kwargs.get("partial", False))
        ser.is_valid(raise_exception=True)
        budget = services.budget_update(budget=budget, **ser.validated_data)
        return Response(s.BudgetSerializer(budget).data)

    @extend_schema(request=s.BudgetWriteSerializer, responses=s.BudgetSerializer)
    def partial_update(self, request, *args, **kwargs):
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request, *args, **kwargs):
        services.budget_delete(budget=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class BalanceApi(TenantMixin, ApiView):
    """Your prepaid balance, this month's spend and each budget's progress."""

    permission_map = {"get": perms.BILLING_READ}

    @extend_schema(responses=s.BalanceSerializer, operation_id="balance_retrieve")
    def get(self, request):
        return Response(s.BalanceSerializer(selectors.balance_get(tenant=self.tenant)).data)


class UsageApi(TenantMixin, ApiView):
    """Metered usage between `from` and `to`, grouped by instance type, region, day or instance."""

    permission_map = {"get": perms.BILLING_READ}

    @extend_schema(
        parameters=[
            OpenApiParameter("from", datetime, description="ISO 8601; default: the start of this month (UTC)"),
            OpenApiParameter("to", datetime, description="ISO 8601, exclusive; default: now"),
            OpenApiParameter("group_by", str, enum=["instance_type", "region", "day", "instance"]),
        ],
        responses=s.UsageSerializer, operation_id="usage_retrieve",
    )
    def get(self, request):
        q = s.UsageQuerySerializer(data=request.query_params.dict())
        q.is_valid(raise_exception=True)
        now = timezone.now()
        start = q.validated_data.get("from") or services.month_began(now)
        end = q.validated_data.get("to") or now
        rows = selectors.usage(tenant=self.tenant, start=start, end=end, group_by=q.validated_data["group_by"])
        storage = selectors.storage_usage(tenant=self.tenant, start=start, end=end)
        body = {"from": start, "to": end, "group_by": q.validated_data["group_by"],
                "currency": settings.BILLING_CURRENCY, "rows": rows, "storage": storage,
                "total": sum(r.amount for r in rows) + storage.amount}
        return Response(s.UsageSerializer(body).data)


class SpotPriceFilter(django_filters.FilterSet):
    instance_type = django_filters.CharFilter(field_name="instance_type__code", max_length=48)
    region = django_filters.CharFilter(field_name="region__code", max_length=32)
    since = UtcIsoDateTimeFilter(field_name="effective_from", lookup_expr="gte")

    class Meta:
        model = Price
        fields = ["instance_type", "region", "since"]


class SpotPriceViewSet(ApiView, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Spot price history (public): each move of the demand formula, newest first."""

    permission_classes = [permissions.AllowAny]
    serializer_class = s.SpotPriceSerializer
    filterset_class = SpotPriceFilter

    def get_queryset(self):
        return selectors.spot_price_list()




class PaymentWebhookApi(ApiView):
    """The payment provider's webhook (Stripe Checkout: `checkout.session.completed`).

    No key and no session: the provider signs each call (`Stripe-Signature`), and the provider
    verifies it over the raw body before anything is read. A call that does not verify answers
    400 in the error shape and changes nothing; a replay answers 200 and credits nothing."""

    authentication_classes = []  # the signature is the authentication; no cookie, so no CSRF
    permission_classes = [permissions.AllowAny]

    # Not part of the renters' API (the provider calls it): left out of the schema, the SDK and
    # schemathesis' run; tests/billing/test_topups.py drives it with signed, recorded payloads.
    @extend_schema(exclude=True)
    def post(self, request):
        raw = request._request.body  # the bytes that were signed, before any parsing
        try:
            credited = services.topup_webhook(payload=raw, signature=request.headers.get("Stripe-Signature", ""))
        except InvalidEvent as exc:
            raise InvalidInput(f"The webhook does not verify: {exc}.", code="invalid_signature") from None
        return Response({"received": True, "credited": credited})
