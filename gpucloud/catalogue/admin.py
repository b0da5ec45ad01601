from __future__ import annotations

from django.contrib import admin

from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Quota, Region
from gpucloud.tenancy.admin import OperatorAdmin


@admin.register(Region)
class RegionAdmin(OperatorAdmin):
    list_display = ["code", "name", "country", "active"]
    list_filter = ["active", "country"]
    search_fields = ["code", "name"]
    actions: list = []  # agents adds "create_bootstrap_token" (agents/admin.py)


@admin.register(GpuModel)
class GpuModelAdmin(OperatorAdmin):
    list_display = ["code", "name", "vendor", "memory_gib", "bf16_tflops", "interconnect",
                    "allow_cross_tenant_sharing"]
    list_filter = ["vendor", "allow_cross_tenant_sharing"]
    search_fields = ["code", "name"]


@admin.register(InstanceType)
class InstanceTypeAdmin(OperatorAdmin):
    list_display = [
        "code",
        "name",
        "gpu_model",
        "gpu_count",
        "gpu_share_milli",
        "vcpus",
        "memory_gib",
        "disk_gib",
        "active",
    ]
    list_filter = ["gpu_model", "active", "gpu_share_milli"]
    search_fields = ["code", "name"]
    list_select_related = ["gpu_model"]


@admin.register(Price)
class PriceAdmin(OperatorAdmin):
    """Prices are history: add a row with a later effective_from to change one; never edit."""

    list_display = ["instance_type", "region", "kind", "per_hour", "currency", "effective_from"]
    list_filter = ["kind", "region", "instance_type__gpu_model"]
    search_fields = ["instance_type__code", "region__code"]
    list_select_related = ["instance_type", "region"]
    date_hierarchy = "effective_from"

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:  # a saved price may have been billed: it never changes
            return [
                "instance_type",
                "region",
                "kind",
                "per_hour",
                "currency",
                "effective_from",
                "created_at",
            ]
        return ["created_at"]

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Quota)
class QuotaAdmin(OperatorAdmin):
    list_display = ["tenant", "gpu_model", "region", "max_gpus", "max_instances"]
    list_filter = ["gpu_model", "region"]
    search_fields = ["tenant__name", "tenant__slug"]
    list_select_related = ["tenant", "gpu_model", "region"]
    autocomplete_fields = ["tenant"]
