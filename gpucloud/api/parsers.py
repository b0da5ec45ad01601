"""The JSON parser of the API and the agent API: bounded nesting, Unicode text only.

rest_framework's JSONParser turns a body nested ~1,000 deep into a RecursionError (a 500,
anonymous too), and passes a lone surrogate (`"\\ud800"`, valid JSON, not valid Unicode) on
to PostgreSQL, which cannot encode it (a 500 again). Here both are a 400 in the error shape:
nesting past MAX_JSON_DEPTH is a `parse_error`; a lone surrogate is a `validation_error`
naming the top-level field it is in. The agent API keeps surrogates for its protocol, which
names the field or replaces them in free text (agents.protocol).
"""
from __future__ import annotations

from typing import Any, Final

from rest_framework import exceptions, parsers

# Deeper than any body of ours (the deepest, a heartbeat, is 4 levels) and far from
# Python's recursion limit, which every recursive walk over the data (serializers, the
# renderer, our own code) must stay under.
MAX_JSON_DEPTH: Final = 64


class JSONParser(parsers.JSONParser):
    check_unicode = True

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(_too_deep()) from None
        check_json(data, unicode=self.check_unicode)
        return data


class AgentJSONParser(JSONParser):
    check_unicode = False


def _too_deep() -> str:
    return f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."


def json_depth_ok(data: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON nests at most `limit` arrays/objects deep (level by level: no
    recursion, and only containers are visited, so a heartbeat costs a few microseconds)."""
    level = [data] if isinstance(data, dict | list) else []
    for _ in range(limit):
        if not level:
            return True
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if isinstance(v, dict | list)]
    return not level


def check_json(data: Any, *, unicode: bool = True) -> None:
    """Raise the 400 for parsed JSON nested past MAX_JSON_DEPTH or holding a lone surrogate."""
    bad = _walk(data, MAX_JSON_DEPTH, unicode=unicode)
    if bad is None:
        return
    if bad == "":
        raise exceptions.ParseError(_too_deep())
    raise exceptions.ValidationError(
        {bad: ["Contains a lone UTF-16 surrogate (such as \\ud800): not valid Unicode text."]}
    )


def _walk(data: Any, limit: int, *, unicode: bool) -> str | None:
    """None if fine; "" if too deep; else the top-level field holding a lone surrogate."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "$")]
    while stack:
        value, depth, top = stack.pop()
        if isinstance(value, str):
            if unicode and not _is_unicode(value):
                return top
        elif isinstance(value, dict):
            if depth >= limit:
                return ""
            for k, v in value.items():
                field = _printable(k) if depth == 0 else top
                if unicode and not _is_unicode(k):
                    return field
                stack.append((v, depth + 1, field))
        elif isinstance(value, list):
            if depth >= limit:
                return ""
            stack.extend((v, depth + 1, top) for v in value)
    return None


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("utf-8")
