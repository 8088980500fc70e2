"""`{% rollout_annotations rollout form as slot %}`: what the rollout slot needs, on any page
that includes it."""

from __future__ import annotations

import json
from typing import Any

from django import template

from webapp.accounts.roles import has_role
from webapp.annotations import services
from webapp.annotations.forms import AnnotationForm
from webapp.annotations.models import Annotation, Label

register = template.Library()


def initial_from(ann: Annotation | None) -> dict[str, Any]:
    if ann is None:
        return {}
    return {
        "label": ann.label.slug,
        "note": ann.note,
        "corrected_completion": ann.corrected_completion,
        "first_wrong_turn": ann.first_wrong_turn,
        "error_category": ann.error_category,
    }


@register.simple_tag(takes_context=True)
def rollout_annotations(
    context: template.Context, rollout: Any, form: AnnotationForm | None = None
) -> dict:
    request = context["request"]
    user = request.user
    # Once per request (a group page holds one slot per rollout): the label list and
    # the stylesheet link.
    first = not hasattr(request, "_ann_labels")
    if first:
        request._ann_labels = list(Label.objects.all())
    anns = services.rollout_annotations(rollout)
    mine = next((a for a in anns if a.author_id == user.pk), None)
    can_annotate = has_role(user, "annotator")
    if not isinstance(form, AnnotationForm) and can_annotate:
        form = AnnotationForm(rollout=rollout, initial=initial_from(mine))
    return {
        "annotations": [(a, services.can_delete(user, a)) for a in anns],
        "mine": mine,
        "can_annotate": can_annotate,
        "form": form if can_annotate else None,
        "labels": request._ann_labels,
        "link_css": first,
    }


@register.filter
def field_value(form: AnnotationForm | None, name: str) -> Any:
    """The bound or initial value of a form field ("" when unset), for hand-written inputs."""
    if form is None:
        return ""
    value = form[name].value()
    return "" if value is None else value


@register.filter
def is_text(value: Any) -> bool:
    return isinstance(value, str)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON as plain text (autoescaped by the template like any other model output)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def fmt_stat(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


@register.filter
def counted(n: int, reason: str) -> str:
    """A dataset's skip count in words: "5 bad cases without a correction"."""
    from webapp.annotations.export import counted as words

    return words(int(n), str(reason))
