"""schemathesis hooks for tests/api/schemathesis.toml (loaded by the `st` process, not by pytest).

GPUCLOUD_API_KEY_ID: the run must not revoke or delete the key it runs on. It lists the keys
  (`GET /api-keys`) and reuses the ids it saw; once it had revoked its own, every later request
  was a 401 and the rest of the run tested nothing. A request aimed at that key is sent to an
  id that does not exist instead (a 404, as documented).
GPUCLOUD_ST_ANONYMOUS=1: only the operations that need no key (the catalogue, signup), for a
  run without one.

`ast.parse` is serialised: with `workers` > 1, hypothesis describes filter lambdas from several
threads at once, and CPython 3.11.7's AST validator keeps its recursion depth in state shared by
threads, so two parses at once can fail with "SystemError: AST constructor recursion depth
mismatch" (CPython gh-106905; a crash of the run, not a finding about the API).
"""
from __future__ import annotations

import ast
import os
import threading

import schemathesis

_parse = ast.parse
_parse_lock = threading.Lock()


def _serialised_parse(*args, **kwargs):
    with _parse_lock:
        return _parse(*args, **kwargs)


ast.parse = _serialised_parse

_NO_SUCH_ID = "00000000-0000-0000-0000-000000000000"


@schemathesis.hook
def before_load_schema(context, raw_schema):
    if os.environ.get("GPUCLOUD_ST_ANONYMOUS") != "1":
        return
    for item in raw_schema.get("paths", {}).values():
        for method in [m for m, op in item.items() if isinstance(op, dict) and "responses" in op]:
            security = item[method].get("security")
            if security and {} not in security:
                del item[method]


@schemathesis.hook
def before_call(context, case, kwargs):
    own = os.environ.get("GPUCLOUD_API_KEY_ID")
    if own and case.path.startswith("/api/v1/api-keys/") and (case.path_parameters or {}).get("id") == own:
        case.path_parameters["id"] = _NO_SUCH_ID
