"""Roles are Django groups ordered by power: each role can do everything the ones before it can.

viewer     reads every page, changes nothing
annotator  + annotates rollouts, works review queues
trainer    + launches, cancels and ablates runs, ingests rollouts
admin      + edits the label taxonomy, sees activity, manages everything (superusers are admins)
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

ROLES = ("viewer", "annotator", "trainer", "admin")


def ensure_groups() -> None:
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def role_of(user: AbstractBaseUser | AnonymousUser) -> str | None:
    """The user's strongest role, or None (an authenticated user with no role is
    treated as viewer)."""
    if not user.is_authenticated:
        return None
    if user.is_superuser:
        return "admin"
    cached = getattr(user, "_rd_role", None)
    if cached is not None:
        return cached
    names = set(user.groups.values_list("name", flat=True))
    role = next((r for r in reversed(ROLES) if r in names), "viewer")
    user._rd_role = role  # one query per request, not one per permission check
    return role


def remember_role(user: AbstractBaseUser, role: str) -> None:
    """Keep `role`, read in this request with the user (the API's token lookup), as the user's
    role for the rest of the request: role_of then asks no query. A superuser stays admin
    whatever the groups say."""
    user._rd_role = role


def has_role(user: AbstractBaseUser | AnonymousUser, role: str) -> bool:
    current = role_of(user)
    return current is not None and ROLES.index(current) >= ROLES.index(role)


def require_role(request: HttpRequest, role: str) -> None:
    if not has_role(request.user, role):
        raise PermissionDenied(f"this action needs the {role} role")


def set_role(user: AbstractBaseUser, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role: must be one of {', '.join(ROLES)}, got {role!r}")
    ensure_groups()
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get(name=role))
    user._rd_role = None
