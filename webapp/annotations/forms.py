"""Forms: each `clean_*` returns a typed value; errors name the field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.http import QueryDict

from webapp.accounts.roles import has_role
from webapp.annotations.export import DEFAULT_EPOCHS, DEFAULT_MIN_MARGIN
from webapp.annotations.models import Dataset, Label, ReviewQueue
from webapp.rollouts.models import Rollout
from webapp.rollouts.text import normalize_newlines
from webapp.runs.models import Run

MAX_QUEUE_ITEMS = 5000  # a queue is read by people: thousands is already weeks of work


class AnnotationForm(forms.Form):
    label = forms.ModelChoiceField(
        queryset=Label.objects.all(),
        to_field_name="slug",
        error_messages={"required": "choose a label", "invalid_choice": "unknown label"},
    )
    note = forms.CharField(
        required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2})
    )
    corrected_completion = forms.CharField(
        required=False, max_length=100_000, strip=False, widget=forms.Textarea(attrs={"rows": 4})
    )
    first_wrong_turn = forms.IntegerField(required=False, min_value=0)
    error_category = forms.CharField(required=False, max_length=100)

    def __init__(self, *args: Any, rollout: Rollout, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rollout = rollout

    def clean_first_wrong_turn(self) -> int | None:
        k = self.cleaned_data.get("first_wrong_turn")
        if k is None:
            return None
        transcript = self.rollout.transcript or []
        if k >= len(transcript):
            raise forms.ValidationError(f"this transcript has turns 0 to {len(transcript) - 1}")
        if not isinstance(transcript[k], dict) or transcript[k].get("role") != "assistant":
            raise forms.ValidationError(f"turn {k} is not an assistant turn")
        return k

    def clean_corrected_completion(self) -> str:
        text = normalize_newlines(self.cleaned_data.get("corrected_completion") or "")
        return text if text.strip() else ""

    def clean_note(self) -> str:
        return normalize_newlines(self.cleaned_data.get("note") or "")


def check_assignees(form: forms.Form, data: dict[str, Any]) -> None:
    """Assignees must be able to annotate; overlap cannot exceed their number."""
    users = list(data.get("assignees") or [])
    cannot = [u.get_username() for u in users if not has_role(u, "annotator")]
    if cannot:
        form.add_error("assignees", f"cannot annotate (viewer role): {', '.join(cannot)}")
    if users and data.get("overlap") and data["overlap"] > len(users):
        form.add_error("overlap", f"cannot exceed the number of assignees ({len(users)})")


class QueueForm(forms.Form):
    name = forms.CharField(max_length=200)
    run = forms.ModelChoiceField(queryset=Run.objects.live())
    source = forms.ChoiceField(choices=ReviewQueue.Source.choices)
    params = forms.CharField(
        required=False,
        max_length=2000,
        help_text="explorer query string, e.g. sort=correct&order=desc&step_min=50",
    )
    limit = forms.IntegerField(min_value=1, max_value=MAX_QUEUE_ITEMS, initial=200)
    seed = forms.IntegerField(required=False, initial=0)
    overlap = forms.IntegerField(min_value=1, initial=1)
    assignees = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.all(), required=False
    )

    def clean_params(self) -> dict[str, str]:
        raw = (self.cleaned_data.get("params") or "").strip().lstrip("?")
        if "?" in raw:  # a whole explorer URL pasted: keep its query string
            raw = raw.split("?", 1)[1]
        qd = QueryDict(raw)
        return {k: qd.get(k) for k in qd if k not in ("cursor", "limit")}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_assignees(self, data)
        return data


class AssignForm(forms.Form):
    assignees = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.all(), required=False
    )
    overlap = forms.IntegerField(min_value=1)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_assignees(self, data)
        return data


class LabelForm(forms.ModelForm):
    class Meta:
        model = Label
        fields = ["slug", "name", "description", "color", "key", "is_bad", "position"]

    def clean_color(self) -> str:
        return self.cleaned_data["color"].lower()  # the model's validator checks #rrggbb

    def clean_key(self) -> str:
        key = self.cleaned_data.get("key") or ""
        if key and key in "ns/":  # the focus view's own keys
            raise forms.ValidationError(
                f"{key!r} is taken by the focus view (n next, s skip, / note)"
            )
        clash = Label.objects.filter(key=key).exclude(pk=self.instance.pk).first() if key else None
        if clash:
            raise forms.ValidationError(f"{key!r} is already the key of {clash.name}")
        return key


class ExportForm(forms.Form):
    SOURCES = [
        ("queue", "a review queue"),
        ("label", "a label"),
        ("explorer", "an explorer filter"),
    ]

    name = forms.SlugField(
        max_length=200, help_text="letters, digits, - and _; versions count per name"
    )
    kind = forms.ChoiceField(choices=Dataset.Kind.choices)
    format = forms.ChoiceField(
        choices=Dataset.Format.choices,
        initial=Dataset.Format.CONVERSATIONAL,
        help_text="conversational: chat messages, templated by the trainer (as GRPO's prompts)",
    )
    model = forms.CharField(
        required=False,
        max_length=500,
        help_text="standard format: render prompts with this model's chat template "
        "(tiny:<env>, run:<id> or a local folder)",
    )
    min_margin = forms.FloatField(
        required=False,
        initial=DEFAULT_MIN_MARGIN,
        min_value=0,
        help_text="DPO without a correction: the chosen sibling's reward must beat the "
        "rejected one's by this much (blank: any unflagged sibling)",
    )
    source = forms.ChoiceField(choices=SOURCES)
    run = forms.ModelChoiceField(queryset=Run.objects.live(), required=False)
    queue = forms.ModelChoiceField(queryset=ReviewQueue.objects.all(), required=False)
    label = forms.ModelChoiceField(
        queryset=Label.objects.all(), to_field_name="slug", required=False
    )
    params = forms.CharField(required=False, max_length=2000)
    include_good = forms.BooleanField(
        required=False, help_text="SFT: also take completions annotated with a good label"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        source = data.get("source")
        if source == "queue":
            if not data.get("queue"):
                self.add_error("queue", "choose the queue to export")
            else:
                data["run"] = data["queue"].run
        elif source == "label" and not data.get("label"):
            self.add_error("label", "choose the label to export")
        if source in ("label", "explorer") and not data.get("run"):
            self.add_error("run", "choose the run whose rollouts to export")
        raw = (data.get("params") or "").strip().lstrip("?")
        qd = QueryDict(raw.split("?", 1)[1] if "?" in raw else raw)
        data["params"] = {k: qd.get(k) for k in qd if k not in ("cursor", "limit")}
        return data


class LaunchForm(forms.Form):
    kind = forms.ChoiceField(choices=Dataset.Kind.choices)
    base_model = forms.CharField(required=False, max_length=500)
    epochs = forms.FloatField(
        required=False, min_value=0.01, max_value=1000, initial=DEFAULT_EPOCHS
    )
    max_steps = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1_000_000,
        help_text="blank: computed from the epochs and the dataset size",
    )
