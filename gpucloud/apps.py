"""App configs of the project package itself (no models here: imported while apps load)."""
from __future__ import annotations

from django.contrib.admin.apps import AdminConfig as DjangoAdminConfig


class AdminConfig(DjangoAdminConfig):
    """Django's admin, with our site class (second factor for operators: gpucloud/admin_site.py)."""

    default_site = "gpucloud.admin_site.AdminSite"
