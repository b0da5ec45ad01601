from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render

from gpucloud.catalogue.selectors import instance_type_list, prices_in_force


def home(request):
    """The landing page: what this installation offers, with links to the API and admin."""
    types = list(instance_type_list())
    prices = prices_in_force(instance_types=types)
    rows = []
    for it in types:
        on_demand = [p for p in prices[it.pk] if p.kind == "on_demand"]
        cheapest = min(on_demand, key=lambda p: p.per_hour, default=None)
        rows.append({"type": it, "price": cheapest})
    return render(request, "frontend/home.html", {"rows": rows})


def healthz(request):
    """Liveness for load balancers and compose: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
