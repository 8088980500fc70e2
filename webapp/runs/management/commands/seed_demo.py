"""Create the demo logins, a scripted-policy run of the diagram environment, and the failure stories
of the ask-before-coding environment (training/demo_stories.py): a run whose verifier never runs the
code and its fixed twin, each with a saved ablation dropping 'correctness'; a second user
(annotator), a review queue both users annotated, and a DPO dataset exported from it. Safe to
re-run: what exists is kept, nothing is duplicated, and stored runs are not generated again."""

from __future__ import annotations

import logging

import numpy as np
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from tqdm import tqdm

from training.demo import generate_groups, linear_schedule
from training.demo_stories import story_groups
from training.demo_tokens import add_tokens
from training.environments import get_environment
from webapp.accounts.roles import set_role
from webapp.behaviours import demo as behaviour_demo
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Group, RewardScore
from webapp.rollouts.services import environment_from_training, get_or_create_run
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run

log = logging.getLogger(__name__)
DEMO_USER, DEMO_PASSWORD = "demo", "demo-password"
ANNOTATOR, ANNOTATOR_PASSWORD = "annotator", "annotator-password"
RUN_NAME = "diagram · scripted policy (demo)"
BROKEN_RUN = "ask_to_code · verifier never runs the code (demo)"
FIXED_RUN = "ask_to_code · verifier fixed (demo)"
DRIFT_RUN = "ask_to_code · sampler drifts from the trainer (demo)"
DRIFT_STEP = 18  # the planted mismatch: the sampler's log-probs drift from this step on
STORY = {"steps": 30, "groups_per_step": 4, "G": 6, "saturate_at": 5}
ABLATION_NAME = "drop correctness"
QUEUE_NAME = "ask_to_code · first review (demo)"
DATASET_NAME = "ask_to_code-dpo-demo"
REPLAY_NAME = "semantic_coverage: extras cost more (demo)"
REPLAY_VERSION = "semantic_coverage@no_extras"
HACK_NOTE = "draws an extra shape and still scores best in its group"
# What each annotator calls a transcript, by the scripted policy's style (the rollout's state); the
# annotator differs on every fourth item so the queue shows real (dis)agreement.
LABEL_BY_STYLE = {
    "loop": "loop-repetition",
    "guess": "premature-completion",
    "irrelevant": "premature-completion",
    "ask_late": "good",
    "solve": "good",
}
# What an annotator writes beside each label: why, in the reviewer's words (a note that only
# repeats the label reads as a second label under the annotator's name on the agreement page).
NOTE_BY_LABEL = {
    "loop-repetition": "repeats its previous turn instead of answering the reply",
    "premature-completion": "submits code before asking what the input looks like",
    "ignores-prompt": "asked first, but the code does not do what the task asks",
    "good": "asks a relevant question, then code that passes the tests",
    "false-negative-reward": "looks like a fine episode that the reward scores too low",
}
SECOND_OPINION = {
    "loop-repetition": "premature-completion",
    "premature-completion": "ignores-prompt",
    "ignores-prompt": "premature-completion",
    "good": "false-negative-reward",
}


def trl_style_metrics(
    groups: list[dict], names: list[str], weights: dict[str, float]
) -> list[dict]:
    """Per-step metrics under TRL's keys, computed as GRPOTrainer logs them (batch mean/std)."""
    by_step: dict[int, list[dict]] = {}
    for g in groups:
        by_step.setdefault(g["step"], []).extend(g["rollouts"])
    out = []
    for step, rollouts in sorted(by_step.items()):
        m = np.array(
            [
                [
                    np.nan if r["rewards"][n]["value"] is None else r["rewards"][n]["value"]
                    for n in names
                ]
                for r in rollouts
            ]
        )
        reward = np.nansum(m * np.array([weights[n] for n in names]), axis=1)
        values = {
            "reward": float(reward.mean()),
            "reward_std": float(reward.std(ddof=1)),
            "completion_length": float(np.mean([r["length"] for r in rollouts])),
        }
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
        user = _user(DEMO_USER, DEMO_PASSWORD, "admin")
        env = get_environment("diagram")
        db_env = environment_from_training(env)
        run, _ = get_or_create_run(
            name=RUN_NAME,
            kind=Run.Kind.IMPORT,
            environment=db_env,
            owner=user,
            status=Run.Status.RUNNING,
            config={
                "policy": "ScriptedDiagramPolicy",
                "skill": "0.2 -> 0.9",
                "steps": steps,
                "G": G,
                "groups_per_step": groups_per_step,
                "scale_rewards": "group",
            },
        )
        holdout = 4
        if Group.objects.filter(run=run).count() >= steps * (groups_per_step + holdout):
            self.stdout.write(
                f"demo run {run.id}: already stored"
            )  # a re-run of make demo generates nothing
        else:
            groups = generate_groups(
                env,
                env.scripted_policy(seed=0, skill=0.2),
                steps,
                groups_per_step,
                G=G,
                seed=0,
                skill_schedule=linear_schedule(0.2, 0.9, steps),
                holdout_groups=holdout,
            )
            stored = 0
            for i in tqdm(range(0, len(groups), 50), desc="ingesting demo groups", unit="batch"):
                stored += ingest_groups(run, {"groups": groups[i : i + 50]}).groups
            names = [c.name for c in env.components]
            weights = {c.name: c.weight for c in env.components}
            record_metrics(run, {"metrics": trl_style_metrics(groups, names, weights)})
            run.set_progress(steps, steps)
            run.mark_succeeded()
            self.stdout.write(f"demo run {run.id}: {stored} new groups ({len(groups)} in all)")
        self._stories(user)
        replay = _replay_story(run, user)
        if replay is not None:
            self.stdout.write(f"reward replay {replay.id}: /replays/{replay.id}/  {replay.summary}")
        behaviour = behaviour_demo.seed(run, user)
        if behaviour is not None:
            self.stdout.write(
                f"behaviour {behaviour.id} ({behaviour.name}): /behaviours/{behaviour.id}/"
            )
        self.stdout.write(
            f"demo logins: {DEMO_USER} / {DEMO_PASSWORD} (admin), {ANNOTATOR} / "
            f"{ANNOTATOR_PASSWORD}"
        )

    def _stories(self, user) -> None:
        annotator = _user(ANNOTATOR, ANNOTATOR_PASSWORD, "annotator")
        db_env = environment_from_training(get_environment("ask_to_code"))
        broken = _story_run(BROKEN_RUN, db_env, user, broken=True)
        fixed = _story_run(FIXED_RUN, db_env, user, broken=False, parent=broken)
        for run in (broken, fixed):
            ablation = _drop_correctness(run, user)
            verdict = (ablation.results.get("verdict") or {}).get("text", "")
            self.stdout.write(
                f"story run {run.id} ({run.name}): /diagnostics/runs/{run.id}/  ablation: {verdict}"
            )
        self.stdout.write(f"side by side: /diagnostics/runs/{broken.id}/overlay/{fixed.id}/")
        drift = _story_run(DRIFT_RUN, db_env, user, broken=False, parent=fixed, drift=DRIFT_STEP)
        self.stdout.write(
            f"token story run {drift.id}: sampler/trainer mismatch planted at step {DRIFT_STEP} "
            f"(/runs/{drift.id}/ token charts, /diagnostics/runs/{drift.id}/ findings)"
        )
        queue = _review_queue(fixed, user, annotator)
        self.stdout.write(
            f"review queue {queue.id} ({queue.name}), annotated by {DEMO_USER} and {ANNOTATOR}"
        )
        dataset = _dpo_dataset(queue, user)
        if dataset is not None:
            self.stdout.write(
                f"DPO dataset {dataset.name} v{dataset.version}: {dataset.records.count()} records"
            )


def _user(username: str, password: str, role: str):
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_password(password)
        user.is_staff = user.is_superuser = role == "admin"
        user.save()
        set_role(user, role)
    return user


def _story_run(
    name: str, db_env, user, broken: bool, parent: Run | None = None, drift: int | None = None
) -> Run:
    """The story's run, generated and ingested once (a re-run finds every group stored
    and skips it). With `drift`, every rollout carries token arrays whose sampler log-probs drift
    from the trainer's from that step on (training/demo_tokens.py)."""
    run, _ = get_or_create_run(
        name=name,
        kind=Run.Kind.IMPORT,
        environment=db_env,
        owner=user,
        status=Run.Status.RUNNING,
        parent=parent,
        config={
            "policy": "ScriptedAskPolicy",
            "story": "broken verifier" if broken else "fixed verifier",
            "scale_rewards": "group",
            **({"planted_mismatch_step": drift} if drift is not None else {}),
            **STORY,
        },
    )
    expected = STORY["steps"] * STORY["groups_per_step"]
    if Group.objects.filter(run=run).count() < expected:
        groups = story_groups(broken, **STORY)
        env = get_environment("ask_to_code")
        if drift is not None:
            add_tokens(groups, {c.name: c.weight for c in env.components}, drift_step=drift)
        ingest_groups(run, {"groups": groups})
        names = [c.name for c in env.components]
        record_metrics(
            run,
            {
                "metrics": trl_style_metrics(
                    groups, names, {c.name: c.weight for c in env.components}
                )
            },
        )
        run.set_progress(STORY["steps"], STORY["steps"])
        run.mark_succeeded()
    return run


def _drop_correctness(run: Run, user):
    from webapp.diagnostics import services
    from webapp.diagnostics.models import Ablation

    found = Ablation.objects.filter(run=run, name=ABLATION_NAME).first()
    if found is not None:
        return found
    spec = services.parse_spec({"drop": ["correctness"]}, run)
    return Ablation.objects.create(
        run=run,
        name=ABLATION_NAME,
        spec=spec.as_dict(),
        results=services.run_ablation(run, spec),
        created_by=user,
    )


def _label_for(rollout, position: int, second: bool) -> str:
    state = rollout.state or {}
    style = state.get("policy_style", "")
    tests = state.get("tests") or {}
    if style == "ask_first":
        label = (
            "good"
            if tests.get("total") and tests.get("passed") == tests.get("total")
            else "ignores-prompt"
        )
    else:
        label = LABEL_BY_STYLE.get(style, "good")
    return SECOND_OPINION.get(label, label) if second and position % 4 == 3 else label


def _review_queue(run: Run, user, annotator):
    from webapp.annotations import services as annotations
    from webapp.annotations.models import Annotation, Label, ReviewQueue

    queue = ReviewQueue.objects.filter(
        run=run, name=QUEUE_NAME
    ).first() or annotations.create_queue(
        name=QUEUE_NAME,
        run=run,
        source=ReviewQueue.Source.RANDOM,
        params={},
        limit=16,
        seed=0,
        overlap=2,
        created_by=user,
        assignees=[user, annotator],
    )
    labels = {lab.slug: lab for lab in Label.objects.all()}
    done = set(
        Annotation.objects.filter(rollout__queue_items__queue=queue).values_list(
            "rollout_id", "author_id"
        )
    )
    for item in queue.items.select_related("rollout").order_by("position"):
        for author, second in ((user, False), (annotator, True)):
            slug = _label_for(item.rollout, item.position, second)
            if (
                slug in labels and (item.rollout_id, author.id) not in done
            ):  # a re-run annotates nothing again
                annotations.save_annotation(
                    item.rollout, author, label=labels[slug], note=NOTE_BY_LABEL.get(slug, "")
                )
    return queue


def _replay_story(run: Run, user):
    """The replay loop on the diagram run: the annotator labels as reward hacks the rollouts that
    drew an extra shape and still scored best in their group, then a replay re-scores the run with
    `semantic_coverage@no_extras` (extras cost 4x more) so the replay page's regression table shows
    which hacks the new version fixes and which still outrank their group's median. Run here,
    synchronously (a few seconds); nothing is replayed again on a re-run."""
    from webapp.annotations import services as annotations
    from webapp.annotations.models import Label
    from webapp.replays import services as replays
    from webapp.replays.models import Replay

    found = Replay.objects.filter(run=run, name=REPLAY_NAME).first()
    if found is not None:
        return found
    hack = Label.objects.filter(slug="reward-hacking").first()
    annotator = get_user_model().objects.filter(username=ANNOTATOR).first()
    if hack is None or annotator is None:
        return None
    for rollout in _extra_shape_winners(run):
        annotations.save_annotation(rollout, annotator, label=hack, note=HACK_NOTE)
    replay = replays.create_replay(
        run, {"versions": [{"version": REPLAY_VERSION}], "name": REPLAY_NAME}, user
    )
    replays.work(replay.id, "seed_demo")
    replay.refresh_from_db()
    return replay


def _extra_shape_winners(run: Run, limit: int = 8) -> list:
    """Rollouts whose semantic_coverage reason counts extra shapes and that have the highest reward
    of their group, above the group's median: what a reviewer would call a reward hack."""
    from webapp.rollouts.models import Rollout

    rows = Rollout.objects.filter(run=run).values_list("id", "group_id", "reward")
    groups: dict[int, list[tuple[float, int]]] = {}
    for rid, gid, reward in rows:
        groups.setdefault(gid, []).append((reward, rid))
    extra = set(
        RewardScore.objects.filter(
            rollout__run=run, component__name="semantic_coverage", reason__contains="extra"
        ).values_list("rollout_id", flat=True)
    )
    winners = []
    for members in groups.values():
        members.sort(reverse=True)
        best, median = members[0], float(np.median([r for r, _ in members]))
        if best[1] in extra and best[0] > median and best[0] > members[1][0]:
            winners.append(best[1])
    return list(Rollout.objects.filter(id__in=sorted(winners)[:limit]).order_by("id"))


def _dpo_dataset(queue, user):
    from webapp.annotations.export import export_dataset
    from webapp.annotations.models import Dataset

    found = Dataset.objects.filter(name=DATASET_NAME).order_by("-version").first()
    if found is not None:
        return found
    try:
        return export_dataset(
            name=DATASET_NAME,
            kind=Dataset.Kind.DPO,
            fmt=Dataset.Format.CONVERSATIONAL,
            source="queue",
            user=user,
            queue=queue,
        )
    except FieldError as e:  # the demo still works without it; say why
        log.warning("demo DPO dataset not exported: %s", e)
        return None
