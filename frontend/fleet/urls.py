"""Included under /admin/fleet/ before the admin's own URLs; `admin_view` refuses non-staff
(a redirect to the admin login) and marks the answers never-cache."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from frontend.fleet import views

urlpatterns = [
    path("", admin.site.admin_view(views.fleet_page), name="admin-fleet"),
    path("live", admin.site.admin_view(views.fleet_live), name="admin-fleet-live"),
    path(
        "allocation", admin.site.admin_view(views.fleet_allocation), name="admin-fleet-allocation"
    ),
]
