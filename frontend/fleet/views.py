"""The fleet page and the two parts it refreshes: staff only (the admin site's own guard).

GET /admin/fleet/                   the page (everything rendered on the server)
GET /admin/fleet/live               the heat map, hosts by state and queue (htmx, every 5 s)
GET /admin/fleet/allocation?window= allocation ratio over time as JSON (uPlot, every 30 s)
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from frontend.fleet import selectors

REFRESH_S = 5  # the live part; the chart asks every 30 s (its points are minutes apart at best)


def _live_context(request: HttpRequest) -> dict:
    now = timezone.now()
    return {
        "now": now,
        "heatmap": selectors.fleet_heatmap(now=now),
        "host_states": selectors.hosts_by_state(now=now),
        "queue": selectors.queue_depth(),
        "refresh_s": REFRESH_S,
    }


def fleet_page(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        **_live_context(request),
        "title": "Fleet",
        "windows": list(selectors.WINDOWS),
    }
    return render(request, "admin/fleet/fleet.html", context)


def fleet_live(request: HttpRequest) -> HttpResponse:
    return render(request, "admin/fleet/_live.html", _live_context(request))


def fleet_allocation(request: HttpRequest) -> JsonResponse:
    key = request.GET.get("window", "1h")
    window = selectors.WINDOWS.get(key)
    if window is None:
        return JsonResponse(
            {
                "error": {
                    "code": "validation_error",
                    "message": f"Unknown window; choose one of {', '.join(selectors.WINDOWS)}.",
                    "fields": {"window": ["Unknown window."]},
                }
            },
            status=400,
        )
    series = selectors.allocation_ratio_series(now=timezone.now(), window=window)
    return JsonResponse(
        {
            "window": key,
            "times": series.times,
            "ratio": series.ratio,
            "booked_gpus": series.booked_gpus,
            "capacity_gpus": series.capacity_gpus,
        }
    )
