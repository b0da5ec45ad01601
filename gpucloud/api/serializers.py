"""Serializer base: unknown input fields are an error, not silently dropped.

A typo like `{"scope": ["read"]}` for `scopes` must answer 400, or the user
gets a key with defaults they never asked for. For the same reason a value of
another JSON type than the schema gives its field is an error: DRF would read
`{"name": 0}` as "0", `"nodes": "2"` as 2 and `"hard_stop": "yes"` as true.
"""
from __future__ import annotations

import threading
from typing import Any, ClassVar

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from rest_framework import serializers

from gpucloud.lib import paths

# The JSON types the schema gives each kind of field (bool is an int in Python, so it is named).
# With DRF's own words for a wrong value where they fit (None: the field's "invalid" message).
_JSON_TYPES: list[tuple[tuple[type[serializers.Field], ...], tuple[type, ...], str | None]] = [
    ((serializers.CharField,), (str,), "Not a valid string."),
    ((serializers.DecimalField,), (str,), 'A decimal is written as a string, e.g. "12.50".'),
    ((serializers.BooleanField,), (bool,), None),
    ((serializers.IntegerField,), (int,), None),
    ((serializers.FloatField,), (int, float), None),
]


def _json_type_errors(field: serializers.Field, value: Any) -> Any:
    """The problems of a value whose JSON type is not its field's, shaped as DRF's errors; None if fine."""
    if value is None:
        return None  # the field's allow_null decides
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        items = {i: e for i, item in enumerate(value) if (e := _json_type_errors(field.child, item))}
        return items or None
    if isinstance(field, serializers.DictField) and isinstance(value, dict):
        entries = {k: e for k, item in value.items() if (e := _json_type_errors(field.child, item))}
        return entries or None
    for fields, types, message in _JSON_TYPES:
        if isinstance(field, fields):
            if isinstance(value, types) and (bool in types or not isinstance(value, bool)):
                return None
            return [message or str(field.error_messages["invalid"])]
    return None


def choices_said(field: serializers.Field) -> None:
    """A wrong choice answers with the valid ones (`group_by`: "one of instance_type, region, …"):
    DRF's own message names only the wrong value, leaving the caller to guess."""
    if isinstance(field, serializers.ChoiceField) and field.choices:
        valid = ", ".join(str(c) for c in field.choices)
        field.error_messages["invalid_choice"] = f'"{{input}}" is not a valid choice: one of {valid}.'


class StrictMixin:
    # False on serializers that read a query string (StrictQuerySerializer): every value is a string
    json_body: ClassVar[bool] = True

    def get_fields(self):
        fields = super().get_fields()  # type: ignore[misc]
        for field in fields.values():
            choices_said(field)
            choices_said(getattr(field, "child", None))  # a list of choices: each item
        return fields

    def to_internal_value(self, data):
        if isinstance(data, dict):
            writable = {name: f for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(set(data) - set(writable))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            if self.json_body:
                wrong = {name: e for name, value in data.items()
                         if (e := _json_type_errors(writable[name], value))}
                if wrong:
                    raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


class StrictSerializer(StrictMixin, serializers.Serializer):
    pass


# --- serializers built once per thread, for hot paths (the launch: docs/benchmarks.md)

_per_thread = threading.local()


def _reused(cls: type[serializers.BaseSerializer]) -> Any:
    """This thread's instance of `cls`, made once. DRF builds (deep-copies) every field of a
    serializer each time one is made, which was a third of a launch's CPU: a thread renders and
    validates with one instance per class instead. Nothing of one call survives into the next
    (`validated` resets what `is_valid` keeps; rendering keeps nothing), and no other thread
    sees the instance."""
    made: dict[type, Any] = _per_thread.__dict__.setdefault("serializers", {})
    ser = made.get(cls)
    if ser is None:
        ser = made[cls] = cls()
    return ser


def rendered(cls: type[serializers.BaseSerializer], obj: Any, **attrs: Any) -> dict:
    """`cls(obj).data` without building the fields again; `attrs` are set on the serializer
    first (for example precomputed values its methods read)."""
    ser = _reused(cls)
    for name, value in attrs.items():
        setattr(ser, name, value)
    return ser.to_representation(obj)


def validated(cls: type[serializers.BaseSerializer], data: Any) -> dict:
    """`cls(data=data)`'s validated data (raising ValidationError as `is_valid(raise_exception=True)`)
    without building the fields again. A fresh dict per call."""
    ser = _reused(cls)
    for name in ("_validated_data", "_errors", "_data"):
        ser.__dict__.pop(name, None)
    ser.initial_data = data
    try:
        ser.is_valid(raise_exception=True)
        return ser.validated_data
    finally:
        del ser.initial_data


class ContainerPathField(serializers.CharField):
    """A path inside a container that a tenant gives (a volume's mount path): normal first, then
    outside the system trees (`gpucloud.lib.paths.container_path`, the one rule for every such
    field; tests/api/test_container_paths.py walks every serializer and form for one without it)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", paths.MAX_LENGTH)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            return paths.container_path(value)
        except paths.PathError as e:
            raise serializers.ValidationError(str(e)) from None


class StrictModelSerializer(StrictMixin, serializers.ModelSerializer):
    pass


class StrictQuerySerializer(StrictSerializer):
    """Reads `request.query_params.dict()`: unknown parameters are refused, and "10" is a number."""

    json_body = False


class StrictSerializerScheme(OpenApiSerializerExtension):
    """The schema says what StrictMixin does: a request body takes no property it does not list.

    Lives here so it loads with the mixin; without it a client (or schemathesis) reads the
    bodies as open objects and the API's 400 for an unknown field contradicts the schema.
    """

    target_class = "gpucloud.api.serializers.StrictMixin"
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class BlankableFormatScheme(OpenApiSerializerFieldExtension):
    """A string field with a format (uri, email) that may also be "" says so.

    drf-spectacular writes `format: uri` alone, and "" is no URI: a budget without a webhook
    (`"webhook_url": ""`) contradicted its own schema, in requests and in answers.
    """

    target_class = "rest_framework.fields.CharField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        if not getattr(self.target, "allow_blank", False) or "format" not in schema:
            return schema
        schema = dict(schema)
        formatted = {"type": schema.pop("type"), "format": schema.pop("format")}
        if getattr(self.target, "max_length", None):
            formatted["maxLength"] = self.target.max_length
        # no top-level type: drf-spectacular would put the format back beside it from the validators
        return {**schema, "anyOf": [formatted, {"type": "string", "maxLength": 0}]}
