"""Launch forms, one per job kind, built from the job's config dataclass (its fields
and help texts).

Validation runs the dataclass's own __post_init__, so the form and the CLI refuse the same configs,
and its "field: problem" message lands on the field it names.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from django import forms

from training.environments import available_environments
from webapp.runs.models import Run

CHOICES: dict[str, list[str]] = {
    "scale_rewards": ["group", "batch", "none"],
    "loss_type": ["dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"],
    "multi_objective_aggregation": ["sum_then_normalize", "normalize_then_sum"],
    "split": ["holdout", "train"],
}
HIDDEN = {
    "output_dir",
    "env",
    "base_model",
    "device",
    "reward_weights",
}  # set by the app, not typed in
CHOICE_KINDS = {
    "loss_type": {"grpo"}
}  # DPO's loss_type names TRL's DPO losses: a free text field there

# The launch form's sections, in page order: (title, fields shown, fields folded under "advanced").
# Config fields missing here land in "Algorithm · advanced", so a new dataclass field is never lost.
SECTIONS: list[tuple[str, list[str], list[str]]] = [
    (
        "Model",
        ["name", "environment", "base_model", "launch_anyway", "parent", "init_from"],
        ["num_gpus", "seed"],
    ),
    (
        "Data",
        ["data", "num_prompts", "split", "teacher", "teacher_model", "samples_per_prompt"],
        [
            "max_nodes",
            "max_length",
            "api_key_env",
            "scripted_skill",
            "scripted_faults",
            "min_reward",
            "min_scores",
            "request_timeout",
            "step",
        ],
    ),
    (
        "Optimisation",
        ["max_steps", "learning_rate", "per_device_batch_size"],
        ["gradient_accumulation_steps", "gradient_checkpointing", "num_train_epochs", "batch_size"],
    ),
    (
        "Algorithm",
        [
            "num_generations",
            "beta",
            "loss_type",
            "scale_rewards",
            "temperature",
            "outcome_component",
        ],
        [
            "max_completion_length",
            "epsilon",
            "num_iterations",
            "multi_objective_aggregation",
            "mask_truncated_completions",
            "multi_turn",
            "max_turns",
            "max_turn_tokens",
            "pass_threshold",
            "min_pass_at_k",
        ],
    ),
    ("Reward weights", [], []),
    ("LoRA", ["use_lora", "lora_rank"], ["lora_alpha", "lora_dropout", "full_finetune"]),
    ("Recording", ["record", "logging_steps", "save_steps"], ["record_state", "log_completions"]),
]
WEIGHT_PREFIX = "weight_"


def _types(tp: Any) -> set[Any]:
    """The concrete types a hint admits: `int | None` -> {int}; `str | list[dict]`
    -> {str, list}."""
    args = (
        typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    )
    return {typing.get_origin(a) or a for a in args if a is not type(None)}


def _form_field(f: dataclasses.Field, hints: dict[str, Any], kind: str = "") -> forms.Field:
    kinds = _types(hints.get(f.name, str))
    help_text = f.metadata.get("help", "")
    initial = None if f.default is dataclasses.MISSING else f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        initial = f.default_factory()  # type: ignore[misc]
    if f.name in CHOICES and kind in CHOICE_KINDS.get(f.name, {kind}):
        return forms.ChoiceField(
            choices=[(c, c) for c in CHOICES[f.name]], initial=initial, help_text=help_text
        )
    if kinds == {bool}:
        return forms.BooleanField(required=False, initial=initial, help_text=help_text)
    if kinds == {int}:
        return forms.IntegerField(
            initial=initial, help_text=help_text, required=initial is not None
        )
    if kinds <= {int, float}:
        return forms.FloatField(initial=initial, help_text=help_text, required=initial is not None)
    if kinds & {list, dict}:
        return forms.CharField(
            required=False,
            initial=json.dumps(initial) if initial not in (None, "") else "",
            help_text=help_text + " (JSON)",
        )
    return forms.CharField(required=False, initial=initial or "", help_text=help_text)


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=200)
    environment = forms.ChoiceField(choices=())
    base_model = forms.CharField(
        max_length=500,
        required=False,
        help_text="'tiny:<env>' (offline tiny model), 'run:<id>' (a run's output), "
        "a model folder or a hub id",
    )
    parent = forms.ModelChoiceField(
        queryset=Run.objects.none(),
        required=False,
        help_text="start after this run succeeds (chains: SFT -> GRPO -> eval)",
    )
    num_gpus = forms.IntegerField(
        min_value=1,
        max_value=64,
        initial=1,
        help_text="GPUs on one host; >1 runs under accelerate launch",
    )

    def clean_num_gpus(self) -> int:
        from training.jobs import runs_on_several_gpus

        gpus = self.cleaned_data.get("num_gpus") or 1
        if gpus > 1 and not runs_on_several_gpus(self.kind):
            raise forms.ValidationError(
                "only SFT, GRPO and DPO jobs run on several GPUs; this job uses one"
            )
        return gpus

    def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
        from training.jobs import config_class

        super().__init__(*args, **kwargs)
        self.kind = kind
        self.config_cls = config_class(kind)
        self.fields["environment"].choices = [(e, e) for e in available_environments()]
        self.fields["parent"].queryset = Run.objects.live().exclude(
            status__in=[Run.Status.FAILED, Run.Status.CANCELLED]
        )
        hints = typing.get_type_hints(self.config_cls)
        self.job_fields = []
        for f in dataclasses.fields(self.config_cls):
            if f.name in HIDDEN:
                continue
            self.fields[f"cfg_{f.name}"] = _form_field(f, hints, kind)
            self.fields[f"cfg_{f.name}"].label = f.name
            self.job_fields.append(f.name)
        if self.config_cls.requires_model:
            self.fields["base_model"].required = True
        self.weight_names = self._add_weight_fields(kind)
        if kind == Run.Kind.GRPO:  # an untrained base is queued only when confirmed (base_models)
            self.fields["launch_anyway"] = forms.BooleanField(
                required=False,
                label="launch from an untrained base anyway",
                help_text="the offline tiny model writes no valid answer: expect zero reward and "
                "no signal; run the signal probe first, or start from an SFT output",
            )
        self.base_check = None

    def _add_weight_fields(self, kind: str) -> list[str]:
        """One weight per reward component of the chosen environment (GRPO's reward_weights): the
        environment's default filled in, so leaving them alone trains with the defaults."""
        from training.environments import get_environment

        names = {f.name for f in dataclasses.fields(self.config_cls)}
        if "reward_weights" not in names:
            return []
        env_name = self.data.get("environment") or self.initial.get("environment") or "diagram"
        try:
            components = get_environment(env_name).components
        except KeyError:
            return []  # an unknown environment: the environment field reports it
        for c in components:
            self.fields[f"{WEIGHT_PREFIX}{c.name}"] = forms.FloatField(
                label=c.name, initial=c.weight, help_text=f"{c.kind}: {c.description}"[:200]
            )
        return [c.name for c in components]

    def sections(self) -> list[dict[str, Any]]:
        """The bound fields by section for the template: {"title", "fields", "advanced"}."""
        placed: set[str] = set()
        out = []
        for title, main, advanced in SECTIONS:
            if title == "Reward weights":
                fields = [self[f"{WEIGHT_PREFIX}{n}"] for n in self.weight_names]
                out.append({"title": title, "fields": fields, "advanced": []})
                placed.update(f"{WEIGHT_PREFIX}{n}" for n in self.weight_names)
                continue
            shown = [k for k in map(self._key, main) if k]
            folded = [k for k in map(self._key, advanced) if k]
            out.append(
                {
                    "title": title,
                    "fields": [self[k] for k in shown],
                    "advanced": [self[k] for k in folded],
                }
            )
            placed.update(shown + folded)
        rest = [self[name] for name in self.fields if name not in placed]
        out[3]["advanced"].extend(rest)  # "Algorithm": anything a config class adds later
        return [s for s in out if s["fields"] or s["advanced"]]

    def _key(self, name: str) -> str | None:
        for key in (name, f"cfg_{name}"):
            if key in self.fields:
                return key
        return None

    def reward_weights(self) -> dict[str, float]:
        return {
            n: float(self.cleaned_data[f"{WEIGHT_PREFIX}{n}"])
            for n in self.weight_names
            if self.cleaned_data.get(f"{WEIGHT_PREFIX}{n}") is not None
        }

    def job_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.job_fields:
            value = self.cleaned_data.get(f"cfg_{name}")
            field = self.fields[f"cfg_{name}"]
            if isinstance(field, forms.CharField) and (field.help_text or "").endswith("(JSON)"):
                if value in ("", None):
                    value = None
                else:
                    try:
                        value = json.loads(value)
                    except json.JSONDecodeError as e:
                        self.add_error(f"cfg_{name}", f"not valid JSON: {e.msg}")
                        continue
            if value is None and isinstance(field, (forms.IntegerField, forms.FloatField)):
                continue
            out[name] = value
        return out

    def _check_base(self, data: dict[str, Any]) -> None:
        from webapp.runs.base_models import UNTRAINED_ADVICE, check_base

        self.base_check = check_base(
            self.kind, data.get("environment") or "", data.get("base_model") or ""
        )
        if self.base_check and self.base_check.needs_confirmation and not data.get("launch_anyway"):
            self.add_error(
                "base_model",
                f"{UNTRAINED_ADVICE} (or tick 'launch from an untrained base anyway')",
            )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        config = self.job_config()
        if self.errors:
            return data
        trial = dict(
            config,
            output_dir="/tmp/validate-only",
            base_model=data.get("base_model") or "x",
            env=data.get("environment") or "diagram",
        )
        names = {f.name for f in dataclasses.fields(self.config_cls)}
        try:
            self.config_cls.from_dict({k: v for k, v in trial.items() if k in names})
        except (ValueError, TypeError) as e:
            field, _, message = str(e).partition(": ")
            target = f"cfg_{field}" if f"cfg_{field}" in self.fields else None
            self.add_error(target, message or str(e))
        self._check_base(data)
        if self.weight_names:
            config["reward_weights"] = (
                self.reward_weights()
            )  # by name: workers.jobs orders them per component
        data["config"] = config
        return data
