from __future__ import annotations

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "gpucloud.tenancy"
    label = "tenancy"
    verbose_name = "Tenancy"
