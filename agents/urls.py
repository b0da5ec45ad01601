"""The agent API, mounted at /agent/v1/ (paths as in agents/protocol.py, no trailing slash)."""

from __future__ import annotations

from django.urls import path

from agents.api.views import HostRegisterApi, host_heartbeat_view, host_wait_view

urlpatterns = [
    path("register", HostRegisterApi.as_view(), name="agent-register"),
    path("heartbeat", host_heartbeat_view, name="agent-heartbeat"),
    path("wait", host_wait_view, name="agent-wait"),
]
