"""Requests no view should see."""
from __future__ import annotations

import io

from django.conf import settings
from django.core.exceptions import BadRequest
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpResponse, JsonResponse

from gpucloud.api.errors import error_body, handler400


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
                name = key.replace("\x00", "")
                # answered here, not raised: with DEBUG on, Django would show its debug page even
                # to an API client; the handler gives the API's JSON error or the 400 page
                return handler400(request, BadRequest(f"The query parameter '{name}' contains a NUL character."))
        return self.get_response(request)


class RequestBodyLimitMiddleware:
    """A request body over MAX_REQUEST_BODY_BYTES is answered 413 before anything reads it.

    rest_framework's parsers read the body as a stream, past Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE check (which only `request.body` makes): a 60 MB anonymous
    body was read and parsed whole. This runs first, for every path (API, agents, console
    forms), and needs nothing but the Content-Length header. A body without one (chunked
    transfer encoding, where the server marks the input as terminated) is read here up to one
    byte past the limit and handed on from memory; Django itself reads no more than
    Content-Length, so nothing else can read an unbounded body.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.MAX_REQUEST_BODY_BYTES
        meta = request.META
        try:
            length = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0  # Django reads no body then
        if length > limit:
            return _too_large(request, limit)
        if not meta.get("CONTENT_LENGTH") and _chunked(meta):
            data = meta["wsgi.input"].read(limit + 1)
            if len(data) > limit:
                return _too_large(request, limit)
            meta["CONTENT_LENGTH"] = str(len(data))
            request._stream = LimitedStream(io.BytesIO(data), len(data))
        return self.get_response(request)


def _chunked(meta) -> bool:
    return bool(meta.get("wsgi.input_terminated")) and "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()


def _too_large(request, limit: int) -> HttpResponse:
    message = f"The request body is larger than this server accepts ({limit} bytes)."
    if request.path.startswith(("/api/", "/agent/")):
        return JsonResponse(error_body("request_too_large", message), status=413)
    return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
