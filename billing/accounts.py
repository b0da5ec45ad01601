"""Accounts and the one admission rule of billing, below the services and the storage metering.

Every posting opens the tenant's account first (`account_for`) and pushes the rule's verdict
down to the tenant row the scheduler reads (`launch_blocks_refresh`). The services post
usage, credits and invoices; billing/storage.py posts the volumes' GiB-seconds: both build on
this module, so neither needs the other.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Case, DecimalField, F, Value, When

from billing.models import MONEY, Account, Budget, LedgerEntry
from gpucloud.tenancy.models import EmailVerification, Tenant
from scheduler.core.blockers import BUDGET_EXCEEDED, EMAIL_UNCONFIRMED, INSUFFICIENT_CREDIT


def account_for(*, tenant_id: Any) -> Account:
    account, created = Account.objects.get_or_create(tenant_id=tenant_id,
                                                     defaults={"currency": settings.BILLING_CURRENCY})
    if created:
        launch_blocks_refresh(tenant_ids=[tenant_id])  # an account opened at zero admits nothing yet
    return account


def ledger_post(*, tenant_id: Any, entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """Append one tenant's entries, move its balance by their sum, and push what the new
    balance means for launches down to the scheduler (`launch_blocks_refresh`), all in the
    caller's transaction: the one way the ledger changes (grants, payments, metering of
    workloads and volumes). Call inside atomic()."""
    return ledger_post_many(entries_by_tenant={tenant_id: entries})


def ledger_post_many(*, entries_by_tenant: dict[Any, list[LedgerEntry]]) -> list[LedgerEntry]:
    """`ledger_post` for many tenants at once, in a fixed number of statements: the accounts
    locked in key order (two runs never wait on each other crosswise) and opened where
    missing, every entry in one insert, every balance moved in one update, one refresh.
    A metering run posts a chunk of workloads this way. Call inside atomic()."""
    if not entries_by_tenant:
        return []
    opened = set(Account.objects.select_for_update().filter(tenant_id__in=list(entries_by_tenant))
                 .order_by("tenant_id").values_list("tenant_id", flat=True))
    for tenant_id in entries_by_tenant:
        if tenant_id not in opened:
            account_for(tenant_id=tenant_id)
    entries = [entry for tenant_entries in entries_by_tenant.values() for entry in tenant_entries]
    LedgerEntry.objects.bulk_create(entries)
    totals = {tenant_id: sum((e.amount for e in tenant_entries), Decimal(0))
              for tenant_id, tenant_entries in entries_by_tenant.items()}
    moves = [When(tenant_id=tenant_id, then=Value(total)) for tenant_id, total in totals.items() if total]
    if moves:
        Account.objects.filter(tenant_id__in=list(totals)).update(
            balance=F("balance") + Case(*moves, default=Value(Decimal(0)), output_field=DecimalField(**MONEY)))
    launch_blocks_refresh(tenant_ids=list(entries_by_tenant))
    return entries


def launch_block(*, balance: Decimal, budget_blocked: bool, email_pending: bool = False) -> str:
    """The one admission rule of billing: why nothing new of the tenant may launch ("" if it may).

    No credit left (and, when the sign-up credit still waits for the owner's e-mail address,
    that is the cause to name), or a hard-stop budget spent this month (`Account.budget_blocked`,
    kept by `budgets_check` and the budget services). The codes are the API's 402 error codes
    (`scheduler.core.blockers`, which has their words).
    """
    if balance <= 0:
        return EMAIL_UNCONFIRMED if email_pending else INSUFFICIENT_CREDIT
    if budget_blocked:
        return BUDGET_EXCEEDED
    return ""


def launch_blocks_refresh(*, tenant_ids: Any) -> None:
    """Push the rule's verdict down to `Tenant.launch_blocked` (the row the launch service and
    the scheduler read), for these tenants, with the spent budget's name. Writes only the rows
    whose verdict changed.

    A tenant without an account was made outside `tenant_create` (fixtures, benchmarks, or
    before billing existed): nothing is metered for it yet, so nothing gates it.
    """
    rows = list(Account.objects.filter(tenant_id__in=list(tenant_ids)).order_by("tenant_id")
                .values_list("tenant_id", "balance", "budget_blocked"))
    broke = [tenant_id for tenant_id, balance, _ in rows if balance <= 0]
    # a sign-up whose credit waits for its address (tenancy.EmailVerification): only asked of
    # tenants with nothing left, so a posting of a funded tenant costs no query more
    pending = set(EmailVerification.objects.filter(tenant_id__in=broke, verified_at__isnull=True)
                  .values_list("tenant_id", flat=True)) if broke else set()
    spent = [tenant_id for tenant_id, balance, blocked in rows if blocked and balance > 0]
    budgets: dict[Any, str] = {}
    # Every hard-stop budget counts the same month's spend, so the smallest one is spent
    # whenever any is: that is the one to name.
    for tenant_id, name in (Budget.objects.filter(tenant_id__in=spent, hard_stop=True)
                            .order_by("tenant_id", "-monthly_amount", "-name").values_list("tenant_id", "name")
                            if spent else ()):
        budgets[tenant_id] = name
    for tenant_id, balance, budget_blocked in rows:
        reason = launch_block(balance=balance, budget_blocked=budget_blocked, email_pending=tenant_id in pending)
        budget = budgets.get(tenant_id, "") if reason == BUDGET_EXCEEDED else ""
        (Tenant.objects.filter(pk=tenant_id)
         .exclude(launch_blocked=bool(reason), launch_blocked_reason=reason, launch_blocked_budget=budget)
         .update(launch_blocked=bool(reason), launch_blocked_reason=reason, launch_blocked_budget=budget))
