from __future__ import annotations

from django.db import models


class EntryKind(models.TextChoices):
    USAGE = "usage", "Usage"  # a charge for metered seconds (negative)
    STORAGE = "storage", "Storage"  # a charge for a volume's GiB-seconds (negative)
    SIGNUP_CREDIT = "signup_credit", "Sign-up credit"
    CREDIT = "credit", "Credit"  # granted by an operator
    PAYMENT = "payment", "Payment"  # collected by the payment provider or recorded by an operator
    ADJUSTMENT = "adjustment", "Adjustment"  # an operator's correction, either sign


CREDITS = frozenset({EntryKind.SIGNUP_CREDIT, EntryKind.CREDIT, EntryKind.PAYMENT})


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft", "Draft"  # the month is still open: lines change as usage is metered
    ISSUED = "issued", "Issued"  # the month closed; the amount is owed
    PAID = "paid", "Paid"  # covered by prepaid credit or collected


class UsageGroup(models.TextChoices):
    INSTANCE_TYPE = "instance_type", "Instance type"
    REGION = "region", "Region"
    DAY = "day", "Day"
    INSTANCE = "instance", "Instance"


class TopUpStatus(models.TextChoices):
    REQUESTED = "requested", "Requested"  # filed: waits for an operator (or the renter's checkout)
    PAID = "paid", "Paid"  # the credit is on the ledger (exactly once)
    REJECTED = "rejected", "Rejected"  # an operator declined it: nothing was credited
