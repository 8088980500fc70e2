"""Create the demo login and a scripted-policy run of the diagram environment. Safe to re-run."""

from __future__ import annotations

import numpy as np
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from tqdm import tqdm

from training.demo import generate_groups, linear_schedule
from training.environments import get_environment
from training.environments.diagram import ScriptedDiagramPolicy
from webapp.accounts.roles import set_role
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.services import create_run, environment_from_training
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run

DEMO_USER, DEMO_PASSWORD = "demo", "demo-password"
RUN_NAME = "diagram · scripted policy (demo)"


def trl_style_metrics(groups: list[dict], names: list[str], weights: dict[str, float]) -> list[dict]:
    """Per-step metrics under TRL's keys, computed as GRPOTrainer logs them (batch mean/std)."""
    by_step: dict[int, list[dict]] = {}
    for g in groups:
        by_step.setdefault(g["step"], []).extend(g["rollouts"])
    out = []
    for step, rollouts in sorted(by_step.items()):
        m = np.array([[np.nan if r["rewards"][n]["value"] is None else r["rewards"][n]["value"] for n in names]
                      for r in rollouts])
        reward = np.nansum(m * np.array([weights[n] for n in names]), axis=1)
        values = {"reward": float(reward.mean()), "reward_std": float(reward.std(ddof=1)),
                  "completion_length": float(np.mean([r["length"] for r in rollouts]))}
        for j, n in enumerate(names):
            values[f"rewards/{n}/mean"] = float(np.nanmean(m[:, j]))
            values[f"rewards/{n}/std"] = float(np.nanstd(m[:, j], ddof=1))
        out.append({"step": step, "values": values})
    return out


class Command(BaseCommand):
    help = "Create the demo user and a scripted-policy demo run (diagram environment)."

    def add_arguments(self, parser):
        parser.add_argument("--steps", type=int, default=30)
        parser.add_argument("--groups-per-step", type=int, default=12)
        parser.add_argument("--G", type=int, default=8)

    def handle(self, *args, steps: int, groups_per_step: int, G: int, **options):
        user, created = get_user_model().objects.get_or_create(username=DEMO_USER)
        if created:
            user.set_password(DEMO_PASSWORD)
            user.is_staff = user.is_superuser = True
            user.save()
            set_role(user, "admin")
        env = get_environment("diagram")
        db_env = environment_from_training(env)
        run = Run.objects.filter(name=RUN_NAME).first() or create_run(
            name=RUN_NAME, kind=Run.Kind.IMPORT, environment=db_env, owner=user, status=Run.Status.RUNNING,
            config={"policy": "ScriptedDiagramPolicy", "skill": "0.2 -> 0.9", "steps": steps, "G": G,
                    "groups_per_step": groups_per_step, "scale_rewards": "group"},
        )
        groups = generate_groups(env, ScriptedDiagramPolicy(seed=0, skill=0.2), steps, groups_per_step, G=G, seed=0,
                                 skill_schedule=linear_schedule(0.2, 0.9, steps), holdout_groups=4)
        stored = 0
        for i in tqdm(range(0, len(groups), 50), desc="ingesting demo groups", unit="batch"):
            stored += ingest_groups(run, {"groups": groups[i:i + 50]}).groups
        names = [c.name for c in env.components]
        record_metrics(run, {"metrics": trl_style_metrics(groups, names, {c.name: c.weight for c in env.components})})
        run.set_progress(steps, steps)
        run.mark_succeeded()
        self.stdout.write(f"demo run {run.id}: {stored} new groups ({len(groups)} in all)")
        self.stdout.write(f"demo login: {DEMO_USER} / {DEMO_PASSWORD}")
