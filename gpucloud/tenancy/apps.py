from __future__ import annotations

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "gpucloud.tenancy"
    label = "tenancy"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        # Connects the receiver that audits sign-in lockouts (django-axes' signal).
        from gpucloud.tenancy import lockout  # noqa: F401
