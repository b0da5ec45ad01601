"""Filters shared by the API's lists, strict about their query parameters as the schema is."""
from __future__ import annotations

from datetime import UTC

import django_filters
from django.core.exceptions import ValidationError as DjangoValidationError
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError

# How the schema writes a boolean in a query string; Django's NullBooleanField would also
# read "1", "yes" or "null" (the last as "no filter"), none of which the schema allows.
_BOOLEANS = ("true", "false")


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, handed on in UTC.

    PostgreSQL refuses a UTC offset beyond ±15:59 (`time zone displacement out of range`),
    which ISO 8601 and Python allow: `?since=2030-01-01T00:00-16:01` was a 500. In UTC the
    offset is gone; a time that UTC cannot hold (year 9999 west of Greenwich) is a 400.
    """

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise DjangoValidationError("This time is out of range.", code="overflow") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter, refusing the values it would quietly read as "no filter".

    django-filter skips a filter whose value is empty (`?since=`, `?billing=`) and reads a
    boolean it does not know (`?fractional=null`) as unset: the list came back unfiltered
    with a 200 for a value the schema does not allow. Here they are a 400 naming the
    parameter. Text filters keep "" (an empty string is a string).
    """

    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is not None:
            errors: dict[str, list[str]] = {}
            for name, filter_ in filterset.filters.items():
                for value in request.query_params.getlist(name):
                    if isinstance(filter_, django_filters.BooleanFilter) and value not in _BOOLEANS:
                        errors[name] = ["Must be true or false."]
                    elif value == "" and not isinstance(filter_, django_filters.CharFilter):
                        errors[name] = ["May not be empty; leave the parameter out instead."]
            if errors:
                raise ValidationError(errors)
        return filterset
