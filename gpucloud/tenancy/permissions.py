"""The permission matrix: the one place that says who may do what inside a tenant.

Pure data and functions (no database access), so the API, the console and the
tests all read the same table. docs/architecture.md prints it as a table.

An actor's effective permissions are the intersection of
  * what their role in the tenant allows, and
  * what the API key's scopes allow (a session has every scope),
minus the launch permissions while the tenant is suspended (a suspended tenant
can read, not launch).

Keys are narrowed twice, so that a `read` key can never change anything:
  * here, by permission: every permission that is not a ".read" needs a `write`
    or `admin` scope (SCOPE_PERMISSIONS), and every view action that changes
    something declares such a permission (tests/api/test_scopes.py checks it);
  * per route and method, in gpucloud/api/scopes.py: an unsafe method (POST, PUT,
    PATCH, DELETE) needs at least `write` on every API route, also on routes that
    are not tenant-scoped (accepting an invitation) or whose permission is decided
    per object (leaving a tenant, revoking one's own key).
"""
from __future__ import annotations

from collections.abc import Iterable

from gpucloud.tenancy.choices import Role, Scope

# Permission names: "<area>.<verb>". Reads end in ".read".
TENANT_READ = "tenant.read"
TENANT_MANAGE = "tenant.manage"  # rename, change plan-independent settings
MEMBERS_READ = "members.read"
MEMBERS_MANAGE = "members.manage"  # invite, remove, change roles below one's own
MEMBERS_LEAVE = "members.leave"  # remove oneself from the tenant
API_KEYS_READ = "api_keys.read"
API_KEYS_CREATE = "api_keys.create"  # create keys for oneself
API_KEYS_REVOKE = "api_keys.revoke"  # revoke one's own keys
API_KEYS_MANAGE = "api_keys.manage"  # revoke anybody's key in the tenant
AUDIT_READ = "audit.read"
QUOTAS_READ = "quotas.read"
WORKLOADS_READ = "workloads.read"
WORKLOADS_LAUNCH = "workloads.launch"  # create instances and jobs
WORKLOADS_MANAGE = "workloads.manage"  # stop and delete workloads
WORKLOADS_CONNECT = "workloads.connect"  # SSH, port URLs and the web terminal into running instances
SSH_KEYS_READ = "ssh_keys.read"  # one's own saved SSH public keys
SSH_KEYS_MANAGE = "ssh_keys.manage"  # save and remove one's own SSH public keys
BILLING_READ = "billing.read"
BILLING_MANAGE = "billing.manage"  # budgets, alerts, payment settings
NOTIFICATIONS_READ = "notifications.read"  # one's own inbox and notification settings
NOTIFICATIONS_MANAGE = "notifications.manage"  # mark one's own read, change one's own settings

# Everybody may leave and revoke their own keys (a leaked key must die fast).
_VIEWER = frozenset(
    {TENANT_READ, MEMBERS_READ, QUOTAS_READ, WORKLOADS_READ, BILLING_READ, API_KEYS_READ,
     MEMBERS_LEAVE, API_KEYS_REVOKE, SSH_KEYS_READ, SSH_KEYS_MANAGE, NOTIFICATIONS_READ, NOTIFICATIONS_MANAGE}
)
# A viewer may keep keys (they are personal and harmless alone) but not connect with them.
_MEMBER = _VIEWER | {API_KEYS_CREATE, WORKLOADS_LAUNCH, WORKLOADS_MANAGE, WORKLOADS_CONNECT}
_ADMIN = _MEMBER | {MEMBERS_MANAGE, API_KEYS_MANAGE, AUDIT_READ, BILLING_MANAGE}
_OWNER = _ADMIN | {TENANT_MANAGE}

ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.OWNER: _OWNER,
    Role.ADMIN: _ADMIN,
    Role.MEMBER: _MEMBER,
    Role.VIEWER: _VIEWER,
}

ALL_PERMISSIONS: frozenset[str] = _OWNER

# A `read` key can only read; `write` adds launching and managing workloads,
# creating and revoking one's own keys and leaving; `admin` is everything the role allows.
_READS = frozenset(p for p in ALL_PERMISSIONS if p.endswith(".read"))
SCOPE_PERMISSIONS: dict[str, frozenset[str]] = {
    Scope.READ: _READS,
    Scope.WRITE: _READS
    | {WORKLOADS_LAUNCH, WORKLOADS_MANAGE, WORKLOADS_CONNECT, API_KEYS_CREATE, API_KEYS_REVOKE, MEMBERS_LEAVE,
       SSH_KEYS_MANAGE, NOTIFICATIONS_MANAGE},
    Scope.ADMIN: ALL_PERMISSIONS,
}

# The scopes are nested (read < write < admin): a key holds the widest of its scopes.
SCOPE_RANK: dict[str, int] = {Scope.READ: 0, Scope.WRITE: 1, Scope.ADMIN: 2}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def scope_for_method(method: str) -> str:
    """The least scope a method needs on any route: an unsafe method needs `write`."""
    return Scope.READ if method.upper() in SAFE_METHODS else Scope.WRITE


def scopes_allow(*, scopes: Iterable[str], needed: str) -> bool:
    """Whether a key with `scopes` holds the scope `needed` (or a wider one)."""
    return any(SCOPE_RANK.get(s, -1) >= SCOPE_RANK[needed] for s in scopes)

# What a suspended tenant may no longer do. Stopping work stays allowed, so a
# suspended tenant can still cut its own costs.
SUSPENDED_DENIED: frozenset[str] = frozenset({WORKLOADS_LAUNCH})

# Who may hand out which role: nobody grants a role above their own.
ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def effective_permissions(
    *, role: str, scopes: Iterable[str] | None, suspended: bool
) -> frozenset[str]:
    """Permissions of an actor with `role`; `scopes` is None for a browser session."""
    perms = ROLE_PERMISSIONS.get(role, frozenset())
    if scopes is not None:
        allowed: frozenset[str] = frozenset()
        for scope in scopes:
            allowed |= SCOPE_PERMISSIONS.get(scope, frozenset())
        perms = perms & allowed
    if suspended:
        perms = perms - SUSPENDED_DENIED
    return perms


# The widest scope a role's keys may carry: a viewer's keys read, a member's read or write.
ROLE_KEY_SCOPE: dict[str, str] = {
    Role.VIEWER: Scope.READ, Role.MEMBER: Scope.WRITE, Role.ADMIN: Scope.ADMIN, Role.OWNER: Scope.ADMIN,
}


def held_scope_rank(*, role: str, scopes: Iterable[str] | None) -> int:
    """How wide a scope an actor holds: its role's widest, narrowed to its key's widest scope
    (`scopes` None: a browser session, narrowed by nothing). -1 holds no scope at all."""
    rank = SCOPE_RANK[ROLE_KEY_SCOPE[role]] if role in ROLE_KEY_SCOPE else -1
    if scopes is not None:
        rank = min(rank, max((SCOPE_RANK.get(s, -1) for s in scopes), default=-1))
    return rank


def grant_within(
    *, role: str, scopes: Iterable[str] | None, grant_role: str | None = None, grant_scopes: Iterable[str] = (),
) -> bool:
    """The one rule for every grant (a new API key's scopes, an invitation's role, a member's new
    role): nobody hands on more than they hold, and that is their role AND, when they act through
    an API key, that key's scopes.

    An actor with `role`, acting through a key with `scopes` (None: a browser session), may grant
    `grant_role` up to their own role, and `grant_scopes` up to the widest scope they hold. A
    role counts as the widest scope its keys may carry (ROLE_KEY_SCOPE), so a `write` key can
    neither mint an `admin` key nor make anybody an admin. Whether the actor may grant at all
    (api_keys.create, members.manage) is the route's permission, checked before this.
    """
    held = held_scope_rank(role=role, scopes=scopes)
    wanted = list(grant_scopes)
    if grant_role is not None:
        if role not in ROLE_RANK or ROLE_RANK[grant_role] > ROLE_RANK[role]:
            return False
        wanted.append(ROLE_KEY_SCOPE[grant_role])
    return all(SCOPE_RANK[s] <= held for s in wanted)


def can_grant_role(*, actor_role: str, role: str) -> bool:
    """Whether a member with `actor_role` may manage (grant, change, remove) a member of `role`:
    owners and admins manage members (members.manage), never above their own role."""
    return MEMBERS_MANAGE in ROLE_PERMISSIONS.get(actor_role, ()) and grant_within(
        role=actor_role, scopes=None, grant_role=role)


def to_revoke_key(*, created_by_id: object, user_id: object) -> str:
    """The permission revoking this key needs: your own keys every role may revoke
    (api_keys.revoke; a leaked key must die fast); anybody else's needs api_keys.manage."""
    return API_KEYS_REVOKE if created_by_id == user_id else API_KEYS_MANAGE


def to_remove_member(*, membership_id: object, own_membership_id: object) -> str:
    """The permission removing this member needs: leaving (removing yourself) every role
    may (members.leave); removing anybody else needs members.manage."""
    return MEMBERS_LEAVE if membership_id == own_membership_id else MEMBERS_MANAGE
