"""The replay form: up to three registered versions, each with optional JSON parameters, and a
selection. It builds the same request dict the API takes, so both go through
services.create_replay's checks."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from training import reward_versions as rv

ROWS = 3
MODES = [("all", "all stored steps"), ("steps", "a step window"), ("sample", "a sample of groups")]


class ReplayForm(forms.Form):
    name = forms.CharField(max_length=200, required=False)
    mode = forms.ChoiceField(choices=MODES, initial="all")
    step_min = forms.IntegerField(min_value=0, required=False)
    step_max = forms.IntegerField(min_value=0, required=False)
    groups = forms.IntegerField(min_value=1, required=False, label="groups to sample")
    seed = forms.IntegerField(min_value=0, required=False, initial=0)

    def __init__(self, *args: Any, environment: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [("", "—")] + [
            (v.label, f"{v.label} ({v.target}{' ' + json.dumps(v.params) if v.params else ''})")
            for v in rv.registered(environment)
        ]
        for i in range(ROWS):
            self.fields[f"version_{i}"] = forms.ChoiceField(
                choices=choices, required=i == 0, label=f"version {i + 1}"
            )
            widget = forms.TextInput(attrs={"placeholder": '{"min_coverage": 0.9}'})
            self.fields[f"params_{i}"] = forms.CharField(
                required=False, label=f"parameters {i + 1} (JSON)", widget=widget
            )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for i in range(ROWS):
            raw = (data.get(f"params_{i}") or "").strip()
            if not raw:
                data[f"params_{i}"] = None
                continue
            try:
                data[f"params_{i}"] = json.loads(raw)
            except ValueError:
                self.add_error(f"params_{i}", 'must be a JSON object, e.g. {"min_coverage": 0.9}')
        return data

    def request_body(self) -> dict[str, Any]:
        d = self.cleaned_data
        versions = [
            {
                "version": d[f"version_{i}"],
                **({"params": d[f"params_{i}"]} if d[f"params_{i}"] is not None else {}),
            }
            for i in range(ROWS)
            if d.get(f"version_{i}")
        ]
        selection: dict[str, Any] = {"mode": d["mode"]}
        if d["mode"] == "steps":
            selection.update(step_min=d.get("step_min"), step_max=d.get("step_max"))
        if d["mode"] == "sample":
            selection.update(groups=d.get("groups"), seed=d.get("seed") or 0)
        return {
            "versions": versions,
            "selection": selection,
            **({"name": d["name"]} if d.get("name") else {}),
        }
