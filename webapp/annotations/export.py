"""Bad cases -> training data: SFT and DPO datasets in TRL's formats (standard or conversational),
versioned per name, and the launch of an SFT / DPO run on one (through launch_run).

SFT takes corrections only; DPO takes each bad case as `rejected` and its correction, or the
best sibling nobody marked bad that beats it by `min_margin`, as `chosen`. A pair whose texts
are equal is never written. The record shapes, the prompt rules and the multi-turn cut are in
docs/using.md, "Module notes".
"""

from __future__ import annotations

import json
import math
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

from training.jobs import RUN_KINDS
from webapp.annotations.models import (
    ActivityEvent,
    Annotation,
    Dataset,
    DatasetRecord,
    Label,
    ReviewQueue,
)
from webapp.annotations.services import select_rollouts
from webapp.errors import FieldError
from webapp.rollouts.models import Rollout
from webapp.rollouts.text import normalize_newlines
from webapp.runs import launch
from webapp.runs.models import Run

EXPORT_MAX_ROLLOUTS = 20_000  # an explorer-filter export pages through at most this many rollouts
DEFAULT_MIN_MARGIN = (
    0.1  # a fallback "chosen" sibling must out-reward the rejected case by this much
)
NO_ASSISTANT_DIFFERENCE = "pair whose first difference is not an assistant turn"


@dataclass
class Built:
    data: dict[str, Any]
    rollout: Rollout
    annotation: Annotation
    label: Label
    chosen_rollout: Rollout | None = None


# --- messages and text ----------------------------------------------------------------------------


def _message(m: Any) -> dict[str, str]:
    if not isinstance(m, dict):
        return {"role": "user", "content": normalize_newlines(str(m))}
    role = m.get("role") or "user"
    content = m.get("content") or ""
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    if m.get("tool_calls"):
        content = (content + "\n" if content else "") + json.dumps(
            m["tool_calls"], ensure_ascii=False
        )
    return {
        "role": "user" if role == "environment" else role,
        "content": normalize_newlines(content),
    }


def _prompt_messages(rollout: Rollout) -> list[dict[str, str]]:
    prompt = rollout.group.prompt
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [_message(m) for m in prompt]


def _text(turns: list[dict[str, str]]) -> str:
    """A list of turns as one string: a lone assistant turn is its content; more turns
    are 'role: content'."""
    if len(turns) == 1 and turns[0]["role"] == "assistant":
        return turns[0]["content"]
    return "\n".join(f"{m['role']}: {m['content']}" for m in turns)


class PromptRenderer:
    """Standard-format prompt strings: the chat template of `model`'s tokenizer, or (no model)
    the text of a one-message prompt. Tokenizers load from local files only (tiny:<env>,
    run:<id>, a folder)."""

    def __init__(self, model: str = "") -> None:
        self.model = model.strip()
        self.tokenizer = _load_tokenizer(self.model) if self.model else None

    def __call__(self, messages: list[dict[str, str]]) -> str:
        """`messages` (the prompt, then any turns that join it) as one string."""
        if self.tokenizer is not None:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        if len(messages) > 1 and messages[1]["role"] != "assistant":
            # The prompt itself is several messages: only a chat template says how to join them.
            raise FieldError(
                "model",
                "these prompts have several chat messages: name a model whose chat "
                "template renders them, or export the conversational format",
            )
        rest = messages[1:]
        return messages[0]["content"] + ("\n" + _text(rest) if rest else "")

    def describe(self) -> str:
        return f"chat template of {self.model}" if self.model else "prompt text (no chat template)"


def _load_tokenizer(model: str) -> Any:
    from webapp.runs.launch import resolve_model

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model), local_files_only=True)
    except Exception as e:  # no such run / folder, or a hub id not on this machine: never download
        raise FieldError(
            "model", f"no tokenizer for {model!r} on this machine ({type(e).__name__})"
        ) from e
    if not getattr(tokenizer, "chat_template", None):
        raise FieldError(
            "model", f"{model!r} has no chat template: export the conversational format"
        )
    return tokenizer


@dataclass
class Conversation:
    """A rollout as the policy lived it: the prompt it saw, then the turns after it."""

    prompt: list[dict[str, str]]
    turns: list[dict[str, str]]
    offset: int  # the transcript index of turns[0] (first_wrong_turn counts transcript turns)

    def at(self, first_wrong_turn: int | None) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """(the turns before `first_wrong_turn`, the turns from it on)."""
        k = max((first_wrong_turn or 0) - self.offset, 0)
        return self.turns[:k], self.turns[k:]


def _key(m: dict[str, str]) -> tuple[str, str]:
    return m["role"], m["content"].strip()


def conversation(rollout: Rollout) -> Conversation:
    """A transcript that starts with the environment's messages (system + user: the episode's
    reset, which holds the group's prompt) has them as its prompt; otherwise the group's prompt is
    the prompt and the whole transcript follows it. Either way the prompt is never repeated."""
    prompt = _prompt_messages(rollout)
    turns = [_message(m) for m in (rollout.transcript or [])]
    lead = next((i for i, m in enumerate(turns) if m["role"] == "assistant"), len(turns))
    if lead and prompt[-1]["content"].strip() in {m["content"].strip() for m in turns[:lead]}:
        return Conversation(turns[:lead], turns[lead:], lead)
    return Conversation(prompt, turns, 0)


def _assistant_run(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """The assistant turns at the start of `turns`, up to the first reply of anyone else."""
    n = next((i for i, m in enumerate(turns) if m["role"] != "assistant"), len(turns))
    return turns[:n]


def preference(
    context: list[dict[str, str]], chosen: list[dict[str, str]], rejected: list[dict[str, str]]
) -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]] | None:
    """(prompt, chosen, rejected) as DPO trains on them: the turns both trajectories share join the
    prompt; each side keeps its assistant turns from the first difference to the next message of
    the environment (tool output is context, never a completion to imitate). None when the first
    difference is not an assistant turn (or one side ends there): nothing for the policy to learn.

    >>> u, t = {"role": "user", "content": "q"}, {"role": "tool", "content": "ok"}
    >>> a, b = {"role": "assistant", "content": "ask"}, {"role": "assistant", "content": "code"}
    >>> preference([u], [a, t], [b, t]) == ([u], [a], [b])
    True
    >>> preference([u], [a, t, a], [a, t, b]) == ([u, a, t], [a], [b])
    True
    """
    n = 0
    while n < min(len(chosen), len(rejected)) and _key(chosen[n]) == _key(rejected[n]):
        n += 1
    c, r = _assistant_run(chosen[n:]), _assistant_run(rejected[n:])
    if not c or not r:
        return None
    return context + chosen[:n], c, r


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# --- building records -----------------------------------------------------------------------------


@dataclass
class Options:
    """How records are built: the format, the prompt renderer (standard format) and
    the DPO margin."""

    fmt: str
    render: PromptRenderer
    include_good: bool = False
    min_margin: float | None = DEFAULT_MIN_MARGIN


def sft_record(
    prompt: list[dict[str, str]], completion_turns: list[dict[str, str]], opts: Options
) -> dict[str, Any]:
    if opts.fmt == Dataset.Format.CONVERSATIONAL:
        return {"messages": prompt + completion_turns}
    return {"prompt": opts.render(prompt), "completion": _text(completion_turns)}


def dpo_record(
    prompt: list[dict[str, str]],
    chosen: list[dict[str, str]],
    rejected: list[dict[str, str]],
    opts: Options,
) -> dict[str, Any]:
    if opts.fmt == Dataset.Format.CONVERSATIONAL:
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}
    return {"prompt": opts.render(prompt), "chosen": _text(chosen), "rejected": _text(rejected)}


def _same_text(a: list[dict[str, str]], b: list[dict[str, str]]) -> bool:
    return [(m["role"], m["content"].strip()) for m in a] == [
        (m["role"], m["content"].strip()) for m in b
    ]


def best_sibling(rollout: Rollout, min_margin: float | None = DEFAULT_MIN_MARGIN) -> Rollout | None:
    """The highest-reward completion of the same group that nobody marked bad, that parsed and
    finished, whose text differs from the bad case and whose reward beats it by `min_margin`
    (None: any reward)."""
    marked_bad = Exists(Annotation.objects.filter(rollout_id=OuterRef("id"), label__is_bad=True))
    siblings = (
        Rollout.objects.filter(
            group_id=rollout.group_id, reward__isnull=False, truncated=False, parse_error=""
        )
        .exclude(id=rollout.id)
        .filter(~marked_bad)
    )
    if min_margin is not None:
        if rollout.reward is None:
            return None  # no reward to be better than: no pair can be called clearly better
        siblings = siblings.filter(reward__gte=rollout.reward + min_margin)
    rejected = conversation(rollout).turns
    for sibling in siblings.order_by("-reward", "id")[:50]:
        if not _same_text(conversation(sibling).turns, rejected):
            return sibling
    return None


def build_records(
    rollout_ids: list[int], kind: str, opts: Options
) -> tuple[list[Built], dict[str, int]]:
    """The records for these rollouts, in their order, and the counts of what was
    skipped and why."""
    skipped: Counter[str] = Counter()
    anns: dict[int, list[Annotation]] = {}
    for a in (
        Annotation.objects.filter(rollout_id__in=rollout_ids)
        .select_related("label", "author")
        .order_by("created_at", "id")
    ):
        anns.setdefault(a.rollout_id, []).append(a)
    rollouts = Rollout.objects.select_related("group").in_bulk(rollout_ids)
    out: list[Built] = []
    for rid in rollout_ids:
        rollout, mine = rollouts.get(rid), anns.get(rid, [])
        if rollout is None or not mine:
            skipped["not annotated"] += 1
            continue
        builder = _sft_for if kind == Dataset.Kind.SFT else _dpo_for
        built = builder(rollout, mine, opts, skipped)
        out.extend(built)
    return out, dict(skipped)


def _correction(a: Annotation) -> list[dict[str, str]]:
    return _assistant(normalize_newlines(a.corrected_completion))


def _sft_for(
    rollout: Rollout, anns: list[Annotation], opts: Options, skipped: Counter[str]
) -> list[Built]:
    corrections = [a for a in anns if a.has_correction]
    conv = conversation(rollout)
    out = []
    for a in corrections:
        prefix, _ = conv.at(a.first_wrong_turn)
        record = sft_record(conv.prompt + prefix, _correction(a), opts)
        out.append(Built(record, rollout, a, a.label))
    if corrections:
        return out
    if any(a.label.is_bad for a in anns):
        skipped["bad case without a correction"] += 1
    elif not opts.include_good:
        skipped["good completion (not included)"] += 1
    else:
        record = sft_record(conv.prompt, conv.turns, opts)
        out.append(Built(record, rollout, anns[0], anns[0].label))
    return out


def _dpo_for(
    rollout: Rollout, anns: list[Annotation], opts: Options, skipped: Counter[str]
) -> list[Built]:
    bad = [a for a in anns if a.label.is_bad]
    if not bad:
        skipped["not marked bad"] += 1
        return []
    conv = conversation(rollout)
    out = []
    for a in (a for a in anns if a.has_correction):
        prefix, rejected = conv.at(a.first_wrong_turn)
        if _same_text(_correction(a), rejected):
            skipped["correction identical to the rejected completion"] += 1
            continue
        pair = preference(conv.prompt, prefix + _correction(a), prefix + rejected)
        if pair is None:
            skipped[NO_ASSISTANT_DIFFERENCE] += 1
            continue
        label = a.label if a.label.is_bad else bad[0].label
        out.append(Built(dpo_record(*pair, opts), rollout, a, label))
    if out or any(a.has_correction for a in anns):
        return out
    sibling = best_sibling(rollout, opts.min_margin)
    if sibling is None:
        skipped["bad case without a correction or a good sibling"] += 1
        return []
    pair = preference(conv.prompt, conversation(sibling).turns, conv.turns)
    if pair is None:
        skipped[NO_ASSISTANT_DIFFERENCE] += 1
        return []
    return [Built(dpo_record(*pair, opts), rollout, bad[0], bad[0].label, sibling)]


# --- sources, datasets, files ---------------------------------------------------------------------


def source_rollout_ids(
    source: str,
    run: Run | None,
    queue: ReviewQueue | None,
    label: Label | None,
    params: dict[str, str],
) -> list[int]:
    if source == "queue" and queue is not None:
        return list(queue.items.order_by("position").values_list("rollout_id", flat=True))
    if source == "label" and label is not None and run is not None:
        return list(
            Annotation.objects.filter(label=label, rollout__run=run)
            .order_by("rollout_id")
            .values_list("rollout_id", flat=True)
            .distinct()
        )
    if source == "explorer" and run is not None:
        return select_rollouts(run, ReviewQueue.Source.EXPLORER, params, EXPORT_MAX_ROLLOUTS, None)
    raise FieldError(
        "source", "must be queue (with a queue), label (with a label and a run) or explorer"
    )


def export_dataset(
    *,
    name: str,
    kind: str,
    fmt: str,
    source: str,
    user: AbstractBaseUser,
    run: Run | None = None,
    queue: ReviewQueue | None = None,
    label: Label | None = None,
    params: dict[str, str] | None = None,
    include_good: bool = False,
    model: str = "",
    min_margin: float | None = DEFAULT_MIN_MARGIN,
) -> Dataset:
    """Build the records and store them as the next version of `name`. Nothing is stored when no
    record results (FieldError naming `source`, with the skip counts)."""
    params = params or {}
    run = queue.run if queue is not None else run
    ids = source_rollout_ids(source, run, queue, label, params)
    render = PromptRenderer(model if fmt == Dataset.Format.STANDARD else "")
    opts = Options(fmt=fmt, render=render, include_good=include_good, min_margin=min_margin)
    built, skipped = build_records(ids, kind, opts)
    if not built:
        why = "; ".join(counted(n, why) for why, n in skipped.items()) or "no rollouts selected"
        raise FieldError("source", f"nothing to export ({why})")
    description = {
        "type": source,
        "run_id": run.id if run else None,
        "queue_id": queue.id if queue else None,
        "label": label.slug if label else None,
        "params": params,
        "include_good": include_good,
        "rollouts": len(ids),
        "records": len(built),
        "skipped": skipped,
        "prompt_format": "chat messages (the trainer applies its chat template)"
        if fmt == Dataset.Format.CONVERSATIONAL
        else render.describe(),
        "chosen_rule": chosen_rule(kind, min_margin),
    }
    for attempt in range(3):
        try:
            return _store(name, kind, fmt, user, description, built)
        except IntegrityError:
            # Another export of the same name took this version number first: take the next one.
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# The first noun of each skip reason, for a count in front of it ("5 bad cases without ...").
_PLURALS = {
    "bad case": "bad cases",
    "good completion": "good completions",
    "correction": "corrections",
    "pair": "pairs",
}


def counted(n: int, reason: str) -> str:
    """A skip count in words.

    >>> counted(5, "bad case without a correction"), counted(1, "not annotated")
    ('5 bad cases without a correction', '1 rollout not annotated')
    >>> counted(2, "not marked bad")
    '2 rollouts not marked bad'
    """
    if reason.startswith("not "):
        return f"{n} {'rollout' if n == 1 else 'rollouts'} {reason}"
    for one, many in _PLURALS.items():
        if reason.startswith(one + " ") and n != 1:
            return f"{n} {many}{reason[len(one) :]}"
    return f"{n} {reason}"


def chosen_rule(kind: str, min_margin: float | None) -> str | None:
    """How DPO's `chosen` was picked, in words, stored with the dataset and shown on its page."""
    if kind != Dataset.Kind.DPO:
        return None
    margin = (
        f"a reward at least {min_margin:g} above the rejected one"
        if min_margin is not None
        else "any reward"
    )
    return (
        "the annotator's correction; else the best sibling in the group that nobody marked bad, "
        f"parsed, finished, differs in text and has {margin}. Pairs with chosen == rejected are "
        "skipped."
    )


@transaction.atomic
def _store(
    name: str,
    kind: str,
    fmt: str,
    user: AbstractBaseUser,
    description: dict[str, Any],
    built: list[Built],
) -> Dataset:
    version = (Dataset.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1
    ds = Dataset.objects.create(
        name=name, kind=kind, format=fmt, version=version, created_by=user, source=description
    )
    DatasetRecord.objects.bulk_create(
        [
            DatasetRecord(
                dataset=ds,
                position=i,
                data=b.data,
                source_rollout=b.rollout,
                chosen_rollout=b.chosen_rollout,
                label=b.label,
                note=b.annotation.note,
                annotator=b.annotation.author,
            )
            for i, b in enumerate(built)
        ],
        batch_size=500,
    )
    ActivityEvent.objects.create(
        actor=user, action=ActivityEvent.Action.EXPORTED, detail=f"{ds} with {len(built)} records"
    )
    return ds


def _normalized(value: Any) -> Any:
    """Every string in a record with \n line endings (records stored before the rule carry \r\n)."""
    if isinstance(value, str):
        return normalize_newlines(value)
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items()}
    return value


def jsonl_lines(dataset: Dataset) -> Any:
    """The dataset as JSON lines (str, each ending in a newline), streamed from the database."""
    records = dataset.records.select_related("label", "annotator").order_by("position")
    for r in records.iterator(chunk_size=500):
        line = _normalized(dict(r.data))
        if "chosen" in line and line["chosen"] == line.get("rejected"):
            continue  # a pair stored before the rule: it teaches nothing, never write it
        line.update(
            {
                "source_rollout_id": r.source_rollout_id,
                "chosen_rollout_id": r.chosen_rollout_id,
                "annotation_label": r.label.slug if r.label else None,
                "note": normalize_newlines(r.note),
                "annotator": r.annotator.get_username() if r.annotator else None,
            }
        )
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


def default_base_model(source_run: Run | None) -> str:
    """The policy that produced the bad cases: a trained run's own output ("run:<id>", resolved by
    training.jobs), else the source run's base model."""
    if source_run is None:
        return ""
    trained = RUN_KINDS[source_run.kind].produces_model
    if trained and source_run.status == Run.Status.SUCCEEDED:
        return f"run:{source_run.id}"
    return source_run.base_model


DEFAULT_EPOCHS = (
    3.0  # a few passes over a small hand-made dataset; 100 steps over 4 rows was 100 epochs
)


def batch_size(kind: str) -> int:
    from training.jobs import config_class

    return int(config_class(kind).__dataclass_fields__["per_device_batch_size"].default)


def steps_for(records: int, epochs: float, batch: int) -> int:
    """Optimizer steps for `epochs` passes over `records` examples at `batch` per step (at least 1).

    >>> steps_for(4, 3.0, 8), steps_for(100, 2.0, 8)
    (3, 25)
    """
    return max(1, math.ceil(records * epochs / max(batch, 1)))


def launch_training(
    dataset: Dataset,
    kind: str,
    user: AbstractBaseUser,
    base_model: str = "",
    epochs: float | None = None,
    max_steps: int | None = None,
) -> tuple[Run, str]:
    """Create an SFT / DPO run on this dataset and hand it to the workers. Returns (run, message).

    Length: `max_steps` when given, else `epochs` (default DEFAULT_EPOCHS) passes over the records
    at the job's default batch size. The JSONL is written under RUNS_DIR/datasets/; `data` is the
    job dataclass's field (workers.jobs keeps the config keys the job knows), `dataset_*` link the
    run back to the dataset."""
    if kind != dataset.kind:
        raise FieldError("kind", f"a {dataset.kind} dataset trains with {dataset.kind}, not {kind}")
    source_run = (
        Run.objects.filter(id=dataset.source.get("run_id")).select_related("environment").first()
    )
    base_model = base_model.strip() or default_base_model(source_run)
    if not base_model:
        raise FieldError("base_model", "the source run names no base model: give one")
    path = write_jsonl(dataset)
    epochs = DEFAULT_EPOCHS if epochs is None else epochs
    steps = max_steps or steps_for(dataset.records.count(), epochs, batch_size(kind))
    config = {
        "data": str(path),
        "dataset_id": dataset.id,
        "dataset_path": str(path),
        "dataset_name": dataset.name,
        "dataset_version": dataset.version,
        "dataset_format": dataset.format,
        "max_steps": steps,
        "epochs": None if max_steps else epochs,
    }  # HF's max_steps overrides num_train_epochs
    run = launch.launch_run(
        name=f"{kind} on {dataset.name} v{dataset.version}",
        kind=kind,
        environment=source_run.environment if source_run else None,
        config=config,
        owner=user,
        base_model=base_model,
        parent=source_run,
    )
    if run.config.get("start_after_parent"):
        return run, f"Run {run.id} is queued: it starts when run {source_run.id} finishes."
    return run, f"Run {run.id} is queued and sent to the workers."


def runs_from(dataset: Dataset) -> list[Run]:
    return list(Run.objects.live().filter(config__dataset_id=dataset.id).order_by("-created_at"))
