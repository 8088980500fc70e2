"""The template context every page gets: the user's role and what it may do (annotate, train,
administer), so templates show only the actions the user is allowed."""

from django.http import HttpRequest

from webapp.accounts.roles import has_role, role_of


def roles(request: HttpRequest) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"role": None}
    return {
        "role": role_of(user),
        "can_annotate": has_role(user, "annotator"),
        "can_train": has_role(user, "trainer"),
        "is_admin_role": has_role(user, "admin"),
    }
