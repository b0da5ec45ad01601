"""The docs that describe rules must match the code that enforces them."""
from __future__ import annotations

from pathlib import Path

from gpucloud.tenancy import permissions as p
from gpucloud.tenancy.choices import Role, Scope

ROOT = Path(__file__).resolve().parent.parent


def test_permission_matrix_in_docs_matches_code():
    text = (ROOT / "docs/architecture.md").read_text()
    table = text.split("<!-- permission-matrix:start -->")[1].split("<!-- permission-matrix:end -->")[0]
    rows = [line for line in table.strip().splitlines()[2:]]
    documented = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented[cells[0].strip("`")] = (cells[1:5], cells[5])
    assert set(documented) == set(p.ALL_PERMISSIONS)
    roles = [Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER]
    for perm, (marks, scope) in documented.items():
        assert [m == "✓" for m in marks] == [perm in p.ROLE_PERMISSIONS[r] for r in roles], perm
        needed = next(s for s in (Scope.READ, Scope.WRITE, Scope.ADMIN) if perm in p.SCOPE_PERMISSIONS[s])
        assert scope == needed, perm
