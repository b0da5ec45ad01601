"""The catalogue: regions, GPU models, instance types, prices and quotas.

Money is Decimal, never float. Prices carry `effective_from`, and a change is a
new row: the price in force at time t is the newest row with effective_from <= t,
so billing for the past never changes.
"""
from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpucloud.catalogue.choices import GPU_SHARES_MILLI, PriceKind, Vendor
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet

# Codes appear in URLs and API bodies: lower-case letters, digits, dots and dashes.
code_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9.\-]*$", "Letters, digits, dots and dashes, starting with a letter or digit."
)


class Region(models.Model):
    """A place with GPU hosts. Work is placed within one region."""

    code = models.CharField(max_length=32, unique=True, validators=[code_validator])
    name = models.CharField(max_length=100)
    country = models.CharField(max_length=2, help_text="ISO 3166 country code")
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.code


class GpuModel(models.Model):
    """A GPU product, as the NVML/AMD SMI name maps to it."""

    code = models.CharField(max_length=32, unique=True, validators=[code_validator],
                            help_text="e.g. H100, MI300X")
    name = models.CharField(max_length=100)
    vendor = models.CharField(max_length=10, choices=Vendor.choices)
    memory_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    bf16_tflops = models.DecimalField(
        max_digits=8, decimal_places=1, validators=[MinValueValidator(Decimal("0.1"))],
        help_text="Peak dense BF16 TFLOPS",
    )
    interconnect = models.CharField(max_length=100, help_text="e.g. NVLink 4, 900 GB/s")
    # Tenant isolation: by default a GPU's fractional shares go to one tenant at a time,
    # because shares of one GPU have no memory isolation from each other. An operator may
    # open a model to several tenants per GPU (e.g. a trusted, single-customer fleet).
    # MIG-partitioned GPUs are open regardless: the hardware isolates their slices.
    allow_cross_tenant_sharing = models.BooleanField(
        default=False,
        help_text="Let shares of different tenants run on one GPU of this model at once "
        "(shares are not memory-isolated): only if every tenant trusts every other.",
    )

    class Meta:
        ordering = ["vendor", "code"]
        verbose_name = "GPU model"
        constraints = [
            models.CheckConstraint(condition=Q(bf16_tflops__gt=0), name="gpu_model_tflops_positive")
        ]

    def __str__(self) -> str:
        return self.code


class InstanceType(models.Model):
    """What a user rents: whole GPUs of one model, or a share of one GPU, plus CPU, memory, disk.

    `gpu_count` whole GPUs, each given `gpu_share_milli`/1000 of a GPU: a whole-GPU
    type has share 1000; a fractional type has gpu_count 1 and share 125/250/500.
    """

    code = models.CharField(max_length=48, unique=True, validators=[code_validator],
                            help_text="e.g. h100.8x, l40s.quarter")
    name = models.CharField(max_length=100)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="instance_types")
    gpu_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(64)])
    gpu_share_milli = models.PositiveSmallIntegerField(
        default=1000, choices=[(s, f"{s / 1000:g} GPU") for s in GPU_SHARES_MILLI]
    )
    vcpus = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    memory_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    disk_gib = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["gpu_model__code", "gpu_count", "gpu_share_milli"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_share_milli=1000) | Q(gpu_count=1),
                name="instance_type_fraction_is_single_gpu",
            ),
            models.CheckConstraint(
                condition=Q(gpu_share_milli__in=GPU_SHARES_MILLI), name="instance_type_share_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.code

    @property
    def gpus(self) -> Decimal:
        """GPUs as a number: 8, 1, 0.25."""
        return Decimal(self.gpu_count * self.gpu_share_milli) / 1000

    @property
    def gpu_milli_total(self) -> int:
        return self.gpu_count * self.gpu_share_milli

    @property
    def bf16_tflops(self) -> Decimal:
        return self.gpu_model.bf16_tflops * self.gpus


class Price(models.Model):
    """The hourly price of an instance type in a region, on demand or spot, from a moment on."""

    instance_type = models.ForeignKey(InstanceType, on_delete=models.PROTECT, related_name="prices")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="prices")
    kind = models.CharField(max_length=10, choices=PriceKind.choices)
    currency = models.CharField(max_length=3, default="USD")
    per_hour = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )
    effective_from = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["instance_type", "region", "kind", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["instance_type", "region", "kind", "effective_from"], name="price_unique_start"
            ),
            models.CheckConstraint(condition=Q(per_hour__gte=0), name="price_non_negative"),
        ]
        indexes = [
            models.Index(fields=["instance_type", "region", "kind", "-effective_from"], name="price_lookup")
        ]

    def __str__(self) -> str:
        return f"{self.instance_type} {self.region} {self.kind} {self.per_hour}/h from {self.effective_from:%Y-%m-%d}"


class Quota(models.Model):
    """A tenant's limit, optionally narrowed to one GPU model and/or one region.

    A row with neither narrows nothing: it replaces the plan's default for the
    whole tenant. Empty limits mean "no limit at this level".
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.ForeignKey(GpuModel, null=True, blank=True, on_delete=models.CASCADE)
    region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.CASCADE)
    max_gpus = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(1_000_000)])
    max_instances = models.PositiveIntegerField(null=True, blank=True, validators=[MaxValueValidator(1_000_000)])

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "gpu_model", "region"]
        # One row per (tenant, model, region) including the NULL cases, on SQLite and PostgreSQL.
        constraints = [
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(gpu_model__isnull=True, region__isnull=True),
                name="quota_unique_tenant_wide",
            ),
            models.UniqueConstraint(
                fields=["tenant", "gpu_model"], condition=Q(region__isnull=True),
                name="quota_unique_model",
            ),
            models.UniqueConstraint(
                fields=["tenant", "region"], condition=Q(gpu_model__isnull=True),
                name="quota_unique_region",
            ),
            models.UniqueConstraint(
                fields=["tenant", "gpu_model", "region"], name="quota_unique_model_region"
            ),
        ]

    def __str__(self) -> str:
        scope = " ".join(str(x) for x in (self.gpu_model, self.region) if x) or "all"
        return f"{self.tenant.slug} quota ({scope})"
