"""Requests no view should see."""
from __future__ import annotations

from django.core.exceptions import BadRequest


class RejectNulMiddleware:
    """A NUL character in a query parameter is refused with a 400 before any view runs.

    PostgreSQL can neither store nor compare it in text, so a filter such as
    `?region=%00` reached the database and failed there as a 500. Form fields and JSON
    bodies are checked by their forms and serializers; the query string is checked here,
    once for every page and endpoint.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in v for v in values):
                from gpucloud.api.errors import handler400

                name = key.replace("\x00", "")
                # answered here, not raised: with DEBUG on, Django would show its debug page even
                # to an API client; the handler gives the API's JSON error or the 400 page
                return handler400(request, BadRequest(f"The query parameter '{name}' contains a NUL character."))
        return self.get_response(request)
