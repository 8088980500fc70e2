"""The ablation form: one drop checkbox and one weight per component, the scaling
and the aggregation.

The form only turns fields into the API's spec dict; `services.parse_spec` validates both paths, so
the page and the API accept and refuse exactly the same specs.
"""

from __future__ import annotations

from typing import Any

from django import forms

from training import ablation as abl
from webapp.diagnostics import services
from webapp.errors import FieldError
from webapp.rollouts.models import RewardComponent
from webapp.runs.models import Run


class AblationForm(forms.Form):
    name = forms.CharField(
        max_length=200, required=False, help_text="defaults to a description of the change"
    )
    drop = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    scale_rewards = forms.ChoiceField(choices=[(s, s) for s in services.SCALES])
    aggregation = forms.ChoiceField(choices=[(a, a) for a in services.AGGREGATIONS])

    def __init__(
        self, run: Run, components: list[RewardComponent], *args: Any, **kwargs: Any
    ) -> None:
        base = services.run_settings(run)
        self.run = run
        self.components = components
        self.base_weights = {c.name: c.weight for c in services.component_infos(run, components)}
        kwargs.setdefault(
            "initial",
            {
                "scale_rewards": base.scale_rewards,
                "aggregation": base.aggregation,
                **{f"weight_{n}": w for n, w in self.base_weights.items()},
            },
        )
        super().__init__(*args, **kwargs)
        self.fields["drop"].choices = [(c.name, c.name) for c in components]
        for c in components:
            self.fields[f"weight_{c.name}"] = forms.FloatField(
                required=False, label=f"{c.name} weight"
            )
        self.spec: abl.AblationSpec | None = None

    def weight_fields(self) -> list[tuple[RewardComponent, forms.BoundField, float]]:
        return [(c, self[f"weight_{c.name}"], self.base_weights[c.name]) for c in self.components]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        weights = {}
        for c in self.components:
            w = data.get(f"weight_{c.name}")
            if w is not None and w != self.base_weights[c.name]:
                weights[c.name] = w
        raw = {
            "drop": list(data.get("drop") or []),
            "weights": weights,
            "scale_rewards": data.get("scale_rewards"),
            "aggregation": data.get("aggregation"),
        }
        try:
            self.spec = services.parse_spec(raw, self.run, self.components)
        except FieldError as e:
            field = e.field.removeprefix("spec.")
            field = f"weight_{field.split('.', 1)[1]}" if field.startswith("weights.") else field
            self.add_error(field if field in self.fields else None, f"{e.field}: {e.message}")
        return data

    def ablation_name(self) -> str:
        assert self.spec is not None
        return (self.cleaned_data.get("name") or "").strip() or services.default_name(
            self.spec, self.run
        )
