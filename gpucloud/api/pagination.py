from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination


def _whole_number(name: str, raw: str) -> int:
    """`raw` as a number from 1, else a 400 naming the parameter (ASCII digits only: int() takes '١')."""
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValidationError({name: [f"Must be a whole number from 1, not {raw[:20]!r}."]})
    return int(raw)


class Pagination(PageNumberPagination):
    """Page-number pages, strict about their parameters as the schema says.

    A malformed `page` or `page_size` (0, -1, "abc") is a 400 that names it; a page past the
    last one is a 404 (`Invalid page.`). A `page_size` above the maximum is cut to it.
    """

    page_size_query_param = "page_size"
    max_page_size = 200
    last_page_strings = ()  # `page=last` would be a second, undocumented type of `page`

    def get_page_size(self, request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        return min(_whole_number(self.page_size_query_param, raw), self.max_page_size)

    def paginate_queryset(self, queryset, request, view=None):
        raw = request.query_params.get(self.page_query_param)
        if raw is not None:
            _whole_number(self.page_query_param, raw)
        return super().paginate_queryset(queryset, request, view)

    def get_schema_operation_parameters(self, view) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = (
                    f"Number of results to return per page (default {self.page_size}; "
                    f"above {self.max_page_size} is cut to {self.max_page_size})."
                )
        return parameters
