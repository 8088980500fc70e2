"""The behaviour forms: a new behaviour's name and options (its query comes from the explorer's
URL), and the gate's limit on an existing one. services.define checks both paths alike."""

from __future__ import annotations

from typing import Any

from django import forms

from webapp.behaviours.models import Behaviour


class BehaviourForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    pattern = forms.CharField(
        max_length=500,
        required=False,
        help_text="optional regular expression checked on the rollouts the query finds",
    )
    critical = forms.BooleanField(
        required=False, help_text="diagnose --fail-on critical fails a run past the rate below"
    )
    max_rate = forms.FloatField(
        required=False, min_value=0, max_value=1, help_text="a fraction of a step's rollouts"
    )


class LimitForm(forms.ModelForm):
    class Meta:
        model = Behaviour
        fields = ["critical", "max_rate"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        rate = data.get("max_rate")
        if rate is not None and not 0 <= rate <= 1:
            self.add_error("max_rate", "must be a fraction from 0 to 1")
        if data.get("critical") and rate is None:
            self.add_error("max_rate", "is required for a critical behaviour")
        return data
