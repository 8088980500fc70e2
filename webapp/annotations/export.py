"""Bad cases → training data: SFT and DPO datasets in TRL's formats, versioned per name, and the launch
of an SFT / DPO run on one.

Record shapes (one JSON object per line):
- SFT standard:        {"prompt": str, "completion": str}
- SFT conversational:  {"messages": [..., {"role": "assistant", "content": <the correction>}]}
- DPO standard:        {"prompt": str, "chosen": str, "rejected": str}
- DPO conversational:  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
Every line also carries `source_rollout_id`, `chosen_rollout_id`, `annotation_label`, `note`, `annotator`.
The label key is `annotation_label`, not `label`: TRL reads a `label` key as an unpaired-preference (KTO)
dataset and rejects the record; trainers drop the other extra columns (remove_unused_columns).

Rules:
- a correction (corrected_completion) replaces the transcript from `first_wrong_turn` on (the whole
  completion when unset); the turns before it join the prompt;
- SFT takes corrections only (and, when asked, completions annotated only with good labels): a failed
  trajectory is never a positive example unless someone wrote a correction;
- DPO takes each bad case as `rejected`; `chosen` is its correction, else the best-rewarded completion of
  the same group that nobody marked bad and that parsed and finished;
- messages are reduced to {"role", "content"} strings (tool calls are appended to the content as JSON,
  the `environment` role becomes `user`) so that every line has one schema that `datasets` can load.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, OuterRef
from django.utils.text import slugify

from webapp.annotations.models import ActivityEvent, Annotation, Dataset, DatasetRecord, Label, ReviewQueue
from webapp.annotations.services import AnnotationError, select_rollouts
from webapp.rollouts.models import Rollout
from webapp.runs.models import Run

EXPORT_MAX_ROLLOUTS = 20_000  # an explorer-filter export pages through at most this many rollouts


@dataclass
class Built:
    data: dict[str, Any]
    rollout: Rollout
    annotation: Annotation
    label: Label
    chosen_rollout: Rollout | None = None


# --- messages and text ---------------------------------------------------------------------------------


def _message(m: Any) -> dict[str, str]:
    if not isinstance(m, dict):
        return {"role": "user", "content": str(m)}
    role = m.get("role") or "user"
    content = m.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    if m.get("tool_calls"):
        content = (content + "\n" if content else "") + json.dumps(m["tool_calls"], ensure_ascii=False)
    return {"role": "user" if role == "environment" else role, "content": content}


def _prompt_messages(rollout: Rollout) -> list[dict[str, str]]:
    prompt = rollout.group.prompt
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [_message(m) for m in prompt]


def _text(turns: list[dict[str, str]]) -> str:
    """A list of turns as one string: a lone assistant turn is its content; more turns are 'role: content'."""
    if len(turns) == 1 and turns[0]["role"] == "assistant":
        return turns[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in turns)


def _prompt_text(rollout: Rollout, prefix: list[dict[str, str]]) -> str:
    prompt = rollout.group.prompt
    base = prompt if isinstance(prompt, str) else rollout.group.prompt_text
    return base + ("\n" + _text(prefix) if prefix else "")


def _split(rollout: Rollout, first_wrong_turn: int | None) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    turns = [_message(m) for m in (rollout.transcript or [])]
    k = first_wrong_turn or 0
    return turns[:k], turns[k:]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# --- building records ------------------------------------------------------------------------------------


def sft_record(rollout: Rollout, completion_turns: list[dict[str, str]], prefix: list[dict[str, str]],
               fmt: str) -> dict[str, Any]:
    if fmt == Dataset.Format.CONVERSATIONAL:
        return {"messages": _prompt_messages(rollout) + prefix + completion_turns}
    return {"prompt": _prompt_text(rollout, prefix), "completion": _text(completion_turns)}


def dpo_record(rollout: Rollout, chosen: list[dict[str, str]], rejected: list[dict[str, str]],
               prefix: list[dict[str, str]], fmt: str) -> dict[str, Any]:
    if fmt == Dataset.Format.CONVERSATIONAL:
        return {"prompt": _prompt_messages(rollout) + prefix, "chosen": chosen, "rejected": rejected}
    return {"prompt": _prompt_text(rollout, prefix), "chosen": _text(chosen), "rejected": _text(rejected)}


def best_sibling(rollout: Rollout) -> Rollout | None:
    """The highest-reward completion of the same group that nobody marked bad and that parsed and finished."""
    marked_bad = Exists(Annotation.objects.filter(rollout_id=OuterRef("id"), label__is_bad=True))
    return (Rollout.objects.filter(group_id=rollout.group_id, reward__isnull=False, truncated=False, parse_error="")
            .exclude(id=rollout.id).filter(~marked_bad).order_by("-reward", "id").first())


def build_records(rollout_ids: list[int], kind: str, fmt: str, include_good: bool = False
                  ) -> tuple[list[Built], dict[str, int]]:
    """The records for these rollouts, in their order, and the counts of what was skipped and why."""
    skipped: Counter[str] = Counter()
    anns: dict[int, list[Annotation]] = {}
    for a in (Annotation.objects.filter(rollout_id__in=rollout_ids).select_related("label", "author")
              .order_by("created_at", "id")):
        anns.setdefault(a.rollout_id, []).append(a)
    rollouts = Rollout.objects.select_related("group").in_bulk(rollout_ids)
    out: list[Built] = []
    for rid in rollout_ids:
        rollout, mine = rollouts.get(rid), anns.get(rid, [])
        if rollout is None or not mine:
            skipped["not annotated"] += 1
            continue
        builder = _sft_for if kind == Dataset.Kind.SFT else _dpo_for
        built = builder(rollout, mine, fmt, include_good, skipped)
        out.extend(built)
    return out, dict(skipped)


def _sft_for(rollout: Rollout, anns: list[Annotation], fmt: str, include_good: bool,
             skipped: Counter[str]) -> list[Built]:
    corrections = [a for a in anns if a.has_correction]
    out = []
    for a in corrections:
        prefix, _ = _split(rollout, a.first_wrong_turn)
        out.append(Built(sft_record(rollout, _assistant(a.corrected_completion), prefix, fmt), rollout, a, a.label))
    if corrections:
        return out
    if any(a.label.is_bad for a in anns):
        skipped["bad case without a correction"] += 1
    elif not include_good:
        skipped["good completion (not included)"] += 1
    else:
        _, turns = _split(rollout, None)
        out.append(Built(sft_record(rollout, turns, [], fmt), rollout, anns[0], anns[0].label))
    return out


def _dpo_for(rollout: Rollout, anns: list[Annotation], fmt: str, include_good: bool,
             skipped: Counter[str]) -> list[Built]:
    bad = [a for a in anns if a.label.is_bad]
    if not bad:
        skipped["not marked bad"] += 1
        return []
    out = []
    for a in (a for a in anns if a.has_correction):
        prefix, rejected = _split(rollout, a.first_wrong_turn)
        label = a.label if a.label.is_bad else bad[0].label
        out.append(Built(dpo_record(rollout, _assistant(a.corrected_completion), rejected, prefix, fmt),
                         rollout, a, label))
    if out:
        return out
    sibling = best_sibling(rollout)
    if sibling is None:
        skipped["bad case without a correction or a good sibling"] += 1
        return []
    _, chosen = _split(sibling, None)
    _, rejected = _split(rollout, None)
    return [Built(dpo_record(rollout, chosen, rejected, [], fmt), rollout, bad[0], bad[0].label, sibling)]


# --- sources, datasets, files -----------------------------------------------------------------------------


def source_rollout_ids(source: str, run: Run | None, queue: ReviewQueue | None, label: Label | None,
                       params: dict[str, str]) -> list[int]:
    if source == "queue" and queue is not None:
        return list(queue.items.order_by("position").values_list("rollout_id", flat=True))
    if source == "label" and label is not None and run is not None:
        return list(Annotation.objects.filter(label=label, rollout__run=run).order_by("rollout_id")
                    .values_list("rollout_id", flat=True).distinct())
    if source == "explorer" and run is not None:
        return select_rollouts(run, ReviewQueue.Source.EXPLORER, params, EXPORT_MAX_ROLLOUTS, None)
    raise AnnotationError("source", "must be queue (with a queue), label (with a label and a run) or explorer")


def export_dataset(*, name: str, kind: str, fmt: str, source: str, user: AbstractBaseUser, run: Run | None = None,
                   queue: ReviewQueue | None = None, label: Label | None = None,
                   params: dict[str, str] | None = None, include_good: bool = False) -> Dataset:
    """Build the records and store them as the next version of `name`. Nothing is stored when no record
    results (AnnotationError naming `source`, with the skip counts)."""
    params = params or {}
    run = queue.run if queue is not None else run
    ids = source_rollout_ids(source, run, queue, label, params)
    built, skipped = build_records(ids, kind, fmt, include_good)
    if not built:
        why = "; ".join(f"{n} {reason}" for reason, n in skipped.items()) or "no rollouts selected"
        raise AnnotationError("source", f"nothing to export ({why})")
    description = {"type": source, "run_id": run.id if run else None, "queue_id": queue.id if queue else None,
                   "label": label.slug if label else None, "params": params, "include_good": include_good,
                   "rollouts": len(ids), "records": len(built), "skipped": skipped}
    for attempt in range(3):
        try:
            return _store(name, kind, fmt, user, description, built)
        except IntegrityError:
            # Another export of the same name took this version number first: take the next one.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@transaction.atomic
def _store(name: str, kind: str, fmt: str, user: AbstractBaseUser, description: dict[str, Any],
           built: list[Built]) -> Dataset:
    version = (Dataset.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1
    ds = Dataset.objects.create(name=name, kind=kind, format=fmt, version=version, created_by=user,
                                source=description)
    DatasetRecord.objects.bulk_create(
        [DatasetRecord(dataset=ds, position=i, data=b.data, source_rollout=b.rollout, chosen_rollout=b.chosen_rollout,
                       label=b.label, note=b.annotation.note, annotator=b.annotation.author)
         for i, b in enumerate(built)], batch_size=500)
    ActivityEvent.objects.create(actor=user, action=ActivityEvent.Action.EXPORTED,
                                 detail=f"{ds} with {len(built)} records")
    return ds


def jsonl_lines(dataset: Dataset) -> Any:
    """The dataset as JSON lines (str, each ending in a newline), streamed from the database."""
    records = dataset.records.select_related("label", "annotator").order_by("position")
    for r in records.iterator(chunk_size=500):
        line = dict(r.data)
        line.update({"source_rollout_id": r.source_rollout_id, "chosen_rollout_id": r.chosen_rollout_id,
                     "annotation_label": r.label.slug if r.label else None, "note": r.note,
                     "annotator": r.annotator.get_username() if r.annotator else None})
        yield json.dumps(line, ensure_ascii=False) + "\n"


def jsonl_filename(dataset: Dataset) -> str:
    return f"{slugify(dataset.name) or 'dataset'}-v{dataset.version}-{dataset.kind}.jsonl"


def write_jsonl(dataset: Dataset) -> Path:
    """Write the dataset under RUNS_DIR/datasets/ (atomically: a reader never sees half a file)."""
    folder = Path(settings.RUNS_DIR) / "datasets"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dataset.id}-{jsonl_filename(dataset)}"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(jsonl_lines(dataset))
    os.replace(tmp, path)
    return path


TRAINED_KINDS = ("sft", "grpo", "dpo")  # runs whose output is a model the next round can start from


def default_base_model(source_run: Run | None) -> str:
    """The policy that produced the bad cases: a trained run's own output ("run:<id>", resolved by
    workers.jobs), else the source run's base model."""
    if source_run is None:
        return ""
    if source_run.kind in TRAINED_KINDS and source_run.status == Run.Status.SUCCEEDED:
        return f"run:{source_run.id}"
    return source_run.base_model


def launch_training(dataset: Dataset, kind: str, user: AbstractBaseUser, base_model: str = "") -> tuple[Run, str]:
    """Create an SFT / DPO run on this dataset and hand it to the workers. Returns (run, message).

    The JSONL is written under RUNS_DIR/datasets/; `data` is the job dataclass's field (workers.jobs
    keeps the config keys the job knows), `dataset_*` link the run back to the dataset."""
    from webapp.rollouts.services import create_run

    if kind != dataset.kind:
        raise AnnotationError("kind", f"a {dataset.kind} dataset trains with {dataset.kind}, not {kind}")
    source_run = Run.objects.filter(id=dataset.source.get("run_id")).select_related("environment").first()
    base_model = base_model.strip() or default_base_model(source_run)
    if not base_model:
        raise AnnotationError("base_model", "the source run names no base model: give one")
    path = write_jsonl(dataset)
    config = {"data": str(path), "dataset_id": dataset.id, "dataset_path": str(path), "dataset_name": dataset.name,
              "dataset_version": dataset.version, "dataset_format": dataset.format}
    run = create_run(name=f"{kind} on {dataset.name} v{dataset.version}", kind=kind,
                     environment=source_run.environment if source_run else None, config=config, owner=user,
                     base_model=base_model, parent=source_run)
    try:
        from workers.launch import enqueue_run
    except ImportError:
        return run, f"Run {run.id} is queued; no launcher is installed (workers.launch), so it waits in the queue."
    enqueue_run(run.id)
    return run, f"Run {run.id} is queued and sent to the workers."


def runs_from(dataset: Dataset) -> list[Run]:
    return list(Run.objects.filter(config__dataset_id=dataset.id).order_by("-created_at"))
