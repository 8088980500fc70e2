"""Bad cases -> training data: SFT / DPO records, the never-a-positive rule, versioning, the JSONL
loaded back by `datasets` and accepted by TRL and our own trainers, and the SFT / DPO launch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.test_annotations import annotate, make_queue, rollouts  # noqa: F401 - fixture
from webapp.annotations import export
from webapp.annotations.models import Dataset, DatasetRecord
from webapp.errors import FieldError
from webapp.rollouts.models import Rollout
from webapp.runs.models import Run


@pytest.fixture
def cases(run, rollouts, personas):  # noqa: F811
    """Group p0 at step 0: r0 corrected hack, r1 bad without correction, r2 untouched, r3 annotated
    good. Rewards: r0 0.5, r1 1.48, r2 0.46, r3 1.44 (correct + 0.5 format + 0.2 penalty)."""
    r = rollouts[:4]
    annotate(
        r[0],
        personas["annotator"],
        "reward-hacking",
        note="keyword stuffing",
        corrected_completion="the right answer",
    )
    annotate(r[1], personas["trainer"], "false-positive-reward", note="rewarded but wrong")
    annotate(r[3], personas["annotator"], "good")
    return r


def export_(kind: str, fmt: str = "standard", **kw) -> Dataset:
    args = {
        "name": "bad-cases",
        "kind": kind,
        "fmt": fmt,
        "source": "explorer",
        "params": {"sort": "reward"},
    }
    args.update(kw)
    return export.export_dataset(**args)


def lines(ds: Dataset) -> list[dict]:
    return [json.loads(x) for x in export.jsonl_lines(ds)]


# --- record rules ---------------------------------------------------------------------------------


def test_it_exports_corrections_as_sft_and_never_a_bad_case_as_positive(run, cases, personas):
    ds = export_("sft", user=personas["trainer"], run=run)
    [rec] = lines(ds)
    assert rec == {
        "prompt": "Prompt 0",
        "completion": "the right answer",
        "source_rollout_id": cases[0].id,
        "chosen_rollout_id": None,
        "annotation_label": "reward-hacking",
        "note": "keyword stuffing",
        "annotator": "annotator",
    }
    assert ds.source["skipped"] == {
        "bad case without a correction": 1,
        "good completion (not included)": 1,
        "not annotated": 13,
    }
    bad_texts = {r.completion for r in Rollout.objects.filter(annotations__label__is_bad=True)}
    assert not bad_texts & {rec["completion"]}


def test_it_adds_good_completions_to_sft_only_when_asked(run, cases, personas):
    ds = export_("sft", user=personas["trainer"], run=run, include_good=True)
    got = {(r["source_rollout_id"], r["completion"]) for r in lines(ds)}
    assert got == {(cases[0].id, "the right answer"), (cases[3].id, cases[3].completion)}
    assert cases[1].completion not in {
        c for _, c in got
    }  # the flagged one never becomes a positive


def test_it_pairs_bad_cases_with_their_correction_or_the_best_unflagged_sibling(
    run, cases, personas
):
    ds = export_(
        "dpo", user=personas["trainer"], run=run, min_margin=None
    )  # r3 (1.44) is below r1 (1.48)
    by_source = {r["source_rollout_id"]: r for r in lines(ds)}
    assert set(by_source) == {cases[0].id, cases[1].id}
    corrected = by_source[cases[0].id]
    assert (corrected["prompt"], corrected["chosen"], corrected["rejected"]) == (
        "Prompt 0",
        "the right answer",
        cases[0].completion,
    )
    sibling = by_source[cases[1].id]
    # r3 (1.44) is the best completion nobody marked bad; r0 is flagged, r1 is the case itself.
    assert (sibling["chosen"], sibling["rejected"], sibling["chosen_rollout_id"]) == (
        cases[3].completion,
        cases[1].completion,
        cases[3].id,
    )
    assert (sibling["annotation_label"], sibling["annotator"], sibling["note"]) == (
        "false-positive-reward",
        "trainer",
        "rewarded but wrong",
    )
    rec = DatasetRecord.objects.get(dataset=ds, source_rollout=cases[1])
    assert rec.chosen_rollout_id == cases[3].id and rec.label.slug == "false-positive-reward"


def test_it_never_picks_an_unparsable_or_truncated_sibling_as_chosen(run, cases, personas):
    Rollout.objects.filter(id=cases[3].id).update(parse_error="unclosed tag")
    Rollout.objects.filter(id=cases[2].id).update(truncated=True)
    ds = export_("dpo", user=personas["trainer"], run=run)
    assert {r["source_rollout_id"] for r in lines(ds)} == {cases[0].id}
    assert ds.source["skipped"]["bad case without a correction or a good sibling"] == 1


def test_it_replaces_the_transcript_from_the_first_wrong_turn_in_conversational_records(
    run, rollouts, personas
):  # noqa: F811
    r = rollouts[0]
    Rollout.objects.filter(id=r.id).update(
        transcript=[
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "search", "arguments": {"q": "x"}}],
            },
            {"role": "tool", "content": "3 hits"},
            {"role": "assistant", "content": "done (wrong)"},
        ]
    )
    annotate(
        Rollout.objects.get(id=r.id),
        personas["annotator"],
        "premature-completion",
        corrected_completion="read the hits first",
        first_wrong_turn=2,
    )
    sft = lines(export_("sft", "conversational", user=personas["trainer"], run=run))[0]
    call = {"role": "assistant", "content": '[{"name": "search", "arguments": {"q": "x"}}]'}
    assert sft["messages"] == [
        {"role": "user", "content": "Prompt 0"},
        call,
        {"role": "tool", "content": "3 hits"},
        {"role": "assistant", "content": "read the hits first"},
    ]
    dpo = lines(export_("dpo", "conversational", user=personas["trainer"], run=run))[0]
    assert dpo["prompt"] == sft["messages"][:3]
    assert dpo["chosen"] == [{"role": "assistant", "content": "read the hits first"}]
    assert dpo["rejected"] == [{"role": "assistant", "content": "done (wrong)"}]
    std = lines(export_("dpo", "standard", user=personas["trainer"], run=run))[0]
    assert std["prompt"].startswith("Prompt 0\nassistant: [") and std["prompt"].endswith(
        "tool: 3 hits"
    )
    assert (std["chosen"], std["rejected"]) == ("read the hits first", "done (wrong)")


def test_it_exports_from_a_queue_and_from_a_label(run, cases, personas):
    q = make_queue(
        run, personas, params={"sort": "reward", "order": "desc", "step_max": "0"}, limit=2
    )  # r1, r3
    from_queue = export.export_dataset(
        name="q",
        kind="dpo",
        fmt="standard",
        source="queue",
        queue=q,
        user=personas["trainer"],
        min_margin=None,
    )
    assert [r["source_rollout_id"] for r in lines(from_queue)] == [cases[1].id]
    assert from_queue.source["run_id"] == run.id and from_queue.source["queue_id"] == q.id
    from webapp.annotations.models import Label

    by_label = export.export_dataset(
        name="l",
        kind="sft",
        fmt="standard",
        source="label",
        run=run,
        label=Label.objects.get(slug="reward-hacking"),
        user=personas["trainer"],
    )
    assert [r["source_rollout_id"] for r in lines(by_label)] == [cases[0].id]


def test_it_exports_from_an_explorer_filter_with_the_label_hook(run, cases, personas):
    ds = export_(
        "dpo",
        user=personas["trainer"],
        run=run,
        params={"sort": "reward", "label": "false-positive-reward"},
        min_margin=None,
    )
    assert [r["source_rollout_id"] for r in lines(ds)] == [cases[1].id] and ds.source[
        "rollouts"
    ] == 1


def test_it_counts_versions_per_name(run, cases, personas):
    a = export_("sft", user=personas["trainer"], run=run)
    b = export_("dpo", user=personas["trainer"], run=run)
    c = export_("sft", user=personas["trainer"], run=run, name="other")
    assert (a.version, b.version, c.version) == (1, 2, 1)


def test_it_stores_nothing_when_nothing_qualifies(run, rollouts, personas):  # noqa: F811
    annotate(rollouts[0], personas["annotator"], "loop-repetition")  # bad, but no correction
    with pytest.raises(FieldError) as e:
        export_("sft", user=personas["trainer"], run=run)
    assert e.value.field == "source" and "1 bad case without a correction" in e.value.message
    assert not Dataset.objects.exists() and not DatasetRecord.objects.exists()


# --- loading back: datasets, TRL, our trainers ----------------------------------------------------


def _download(client, ds: Dataset, tmp_path: Path) -> Path:
    resp = client.get(reverse("annotations-dataset-download", args=[ds.id]))
    assert resp.status_code == 200 and resp["Content-Type"].startswith("application/jsonl")
    assert f'filename="bad-cases-v{ds.version}-{ds.kind}.jsonl"' in resp["Content-Disposition"]
    path = tmp_path / f"{ds.kind}-{ds.format}-{ds.id}.jsonl"
    path.write_bytes(b"".join(resp.streaming_content))
    return path


@pytest.fixture(scope="module")
def tokenizer():
    from training.tiny import _train_tokenizer

    return _train_tokenizer(
        ["Prompt 0 the right answer answer p0 1 read the hits first"] * 20, vocab_size=300
    )


# The first import of datasets + trl + transformers takes ~20 s on a shared machine
@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,fmt",
    [
        ("sft", "standard"),
        ("sft", "conversational"),
        ("dpo", "standard"),
        ("dpo", "conversational"),
    ],
)
def test_it_downloads_jsonl_that_datasets_and_trl_load(
    client_as, run, cases, personas, tmp_path, tokenizer, kind, fmt
):
    import datasets
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    ds = export_(kind, fmt, user=personas["trainer"], run=run)
    path = _download(client_as("viewer"), ds, tmp_path)
    loaded = datasets.load_dataset(
        "json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert len(loaded) == ds.records.count() > 0
    train_keys = {
        "sft": {"standard": {"prompt", "completion"}, "conversational": {"messages"}},
        "dpo": {
            "standard": {"prompt", "chosen", "rejected"},
            "conversational": {"prompt", "chosen", "rejected"},
        },
    }[kind][fmt]
    assert train_keys <= set(loaded.column_names) and "label" not in loaded.column_names
    for row in loaded:
        assert is_conversational(row) is (fmt == "conversational")
        out = maybe_apply_chat_template(row, tokenizer)
        if (
            fmt == "conversational"
        ):  # templated into strings: text (from messages) or prompt/chosen/rejected
            assert set(out) == ({"text"} if kind == "sft" else train_keys)
        else:  # already strings: passed through as they are
            assert out == row
        assert all(isinstance(out[k], str) for k in set(out) & (train_keys | {"text"}))
    if kind == "sft":
        from training.sft import to_sft_records

        assert to_sft_records([dict(r) for r in loaded])[0].keys() == train_keys
    else:
        from training.dpo import to_dpo_records

        assert to_dpo_records([dict(r) for r in loaded])[0].keys() == train_keys


def test_it_puts_the_correction_in_the_last_assistant_message(
    client_as, run, cases, personas, tmp_path
):
    ds = export_("sft", "conversational", user=personas["trainer"], run=run)
    [rec] = lines(ds)
    assert rec["messages"][-1] == {"role": "assistant", "content": "the right answer"}
    assert rec["messages"][0] == {"role": "user", "content": "Prompt 0"}


# --- views: permissions, export, launch -----------------------------------------------------------


def test_it_lets_only_trainers_export(client_as, run, cases):
    data = {
        "name": "x",
        "kind": "sft",
        "format": "standard",
        "source": "explorer",
        "run": run.id,
        "params": "sort=reward",
    }
    for role in ("viewer", "annotator"):
        assert client_as(role).post(reverse("annotations-export"), data).status_code == 403
    resp = client_as("trainer").post(reverse("annotations-export"), data)
    ds = Dataset.objects.get()
    assert resp.status_code == 302 and resp["Location"] == reverse(
        "annotations-dataset", args=[ds.id]
    )


@pytest.mark.parametrize(
    "data,message",
    [
        ({"source": "queue"}, "queue: choose the queue to export"),
        ({"source": "label", "run": None}, "label: choose the label to export"),
        ({"source": "explorer", "run": None}, "run: choose the run whose rollouts to export"),
        ({"params": "sort=nope"}, "sort: must be one of"),
        ({"kind": "ppo"}, "kind: Select a valid choice"),
        ({"name": "has spaces"}, "name: Enter a valid"),
    ],
)
def test_it_rejects_a_bad_export_naming_the_field(client_as, run, cases, data, message):
    form = {
        "name": "x",
        "kind": "sft",
        "format": "standard",
        "source": "explorer",
        "run": run.id,
        "params": "sort=reward",
    }
    form.update({k: v for k, v in data.items() if v is not None})
    for k in [k for k, v in data.items() if v is None]:
        form.pop(k)
    resp = client_as("trainer").post(reverse("annotations-export"), form)
    assert resp.status_code == 400
    assert message in resp.content.decode().replace("&#x27;", "'") or message in str(
        resp.context["form"].errors
    )
    assert not Dataset.objects.exists()


def test_it_launches_dpo_on_a_dataset_and_links_the_run_back(
    client_as, run, cases, personas, settings, tmp_path, monkeypatch
):
    from webapp.runs import launch

    sent = []
    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: sent.append(run_id) or "gpu")
    settings.RUNS_DIR = tmp_path / "runs"
    Run.objects.filter(id=run.id).update(base_model="tiny:toy")
    ds = export_("dpo", user=personas["trainer"], run=run)
    resp = client_as("trainer").post(
        reverse("annotations-dataset-launch", args=[ds.id]), {"kind": "dpo"}
    )
    assert resp.status_code == 302
    new = Run.objects.get(kind="dpo")
    assert sent == [new.id]
    assert (new.status, new.environment_id, new.parent_id, new.owner, new.base_model) == (
        "queued",
        run.environment_id,
        run.id,
        personas["trainer"],
        "tiny:toy",
    )
    cfg = new.config
    assert cfg["dataset_id"] == ds.id and cfg["data"] == cfg["dataset_path"]
    path = Path(cfg["dataset_path"])
    assert path.parent == tmp_path / "runs" / "datasets"
    assert [json.loads(x)["source_rollout_id"] for x in path.read_text().splitlines()] == [
        r["source_rollout_id"] for r in lines(ds)
    ]
    page = client_as("viewer").get(reverse("annotations-dataset", args=[ds.id])).content.decode()
    assert f"run {new.id}" in page and "DPO on this dataset" not in page  # viewers get no button
    trainer_page = (
        client_as("trainer").get(reverse("annotations-dataset", args=[ds.id])).content.decode()
    )
    assert "DPO on this dataset" in trainer_page


def test_it_starts_from_a_trained_source_runs_output_by_default(run, personas):
    Run.objects.filter(id=run.id).update(kind="grpo", status="succeeded")
    run.refresh_from_db()
    assert export.default_base_model(run) == f"run:{run.id}"


def test_it_refuses_to_launch_the_wrong_kind_or_for_non_trainers(
    client_as, run, cases, personas, settings, tmp_path
):
    settings.RUNS_DIR = tmp_path
    ds = export_("sft", user=personas["trainer"], run=run)
    url = reverse("annotations-dataset-launch", args=[ds.id])
    assert client_as("annotator").post(url, {"kind": "sft", "base_model": "m"}).status_code == 403
    resp = client_as("trainer").post(url, {"kind": "dpo", "base_model": "m"}, follow=True)
    assert "kind: a sft dataset trains with sft, not dpo" in resp.content.decode()
    assert not Run.objects.exclude(id=run.id).exists()


def test_it_asks_for_a_base_model_when_the_source_run_has_none(
    client_as, run, cases, personas, settings, tmp_path
):
    settings.RUNS_DIR = tmp_path
    ds = export_("sft", user=personas["trainer"], run=run)
    resp = client_as("trainer").post(
        reverse("annotations-dataset-launch", args=[ds.id]), {"kind": "sft"}, follow=True
    )
    assert "base_model: the source run names no base model" in resp.content.decode()
    assert not Run.objects.exclude(id=run.id).exists()


# --- issue 19: pairs that teach something, one line ending, the trainer's prompt format, run length


def test_it_skips_a_fallback_sibling_that_is_not_better_by_the_margin(run, cases, personas):
    ds = export_(
        "dpo", user=personas["trainer"], run=run
    )  # default margin 0.1: r3 (1.44) does not beat r1 (1.48)
    assert {r["source_rollout_id"] for r in lines(ds)} == {cases[0].id}
    assert ds.source["skipped"]["bad case without a correction or a good sibling"] == 1
    assert "at least 0.1 above the rejected one" in ds.source["chosen_rule"]
    Rollout.objects.filter(id=cases[1].id).update(reward=1.0)  # now r3 is 0.44 better: a clear pair
    by_source = {
        r["source_rollout_id"]: r for r in lines(export_("dpo", user=personas["trainer"], run=run))
    }
    assert by_source[cases[1].id]["chosen_rollout_id"] == cases[3].id


def test_it_never_exports_a_pair_whose_chosen_equals_rejected(client_as, run, cases, personas):
    # The best sibling has the bad case's text (a duplicate sample): the next distinct
    # sibling is chosen.
    Rollout.objects.filter(id=cases[1].id).update(reward=0.0)
    Rollout.objects.filter(id=cases[3].id).update(
        transcript=cases[1].transcript, completion=cases[1].completion
    )
    annotate(
        cases[0],
        personas["annotator"],
        "reward-hacking",
        corrected_completion=cases[0].completion + "  ",
    )
    ds = export_("dpo", user=personas["trainer"], run=run, min_margin=None)
    recs = lines(ds)
    assert recs and all(r["chosen"] != r["rejected"] for r in recs)
    assert cases[0].id not in {
        r["source_rollout_id"] for r in recs
    }  # its correction repeats the completion
    assert ds.source["skipped"]["correction identical to the rejected completion"] == 1
    assert {r["chosen_rollout_id"] for r in recs} == {cases[2].id}
    # a pair stored before the rule is not written either
    DatasetRecord.objects.filter(dataset=ds).update(
        data={"prompt": "p", "chosen": "same", "rejected": "same"}
    )
    assert lines(ds) == []


def test_it_stores_and_exports_browser_corrections_with_unix_newlines(
    client_as, run, rollouts, personas
):  # noqa: F811
    q = make_queue(run, personas, params={"sort": "reward"}, limit=1)
    item = q.items.get(position=0)
    resp = client_as("annotator").post(
        reverse("annotations-focus-save", args=[q.id, 0]),
        {
            "label": "reward-hacking",
            "note": "line one\r\nline two",
            "corrected_completion": "a\r\nb\rc",
        },
    )
    assert resp.status_code == 302
    ann = item.rollout.annotations.get()
    assert (ann.note, ann.corrected_completion) == ("line one\nline two", "a\nb\nc")
    ds = export_("sft", "conversational", user=personas["trainer"], run=run)
    raw = "".join(export.jsonl_lines(ds))
    assert "\\r" not in raw and lines(ds)[0]["messages"][-1]["content"] == "a\nb\nc"


def test_it_exports_conversational_prompts_by_default_and_plain_standard_prompts(
    client_as, run, cases
):
    form = client_as("trainer").get(reverse("annotations-datasets")).content.decode()
    assert '<option value="conversational" selected>' in form
    std = lines(export_("sft", "standard", user=cases[0].run.owner, run=run))[0]
    assert std["prompt"] == "Prompt 0"  # no "user: " prefix the model never sees


def test_it_refuses_a_multi_message_standard_prompt_without_a_model(run, cases, personas):
    from webapp.rollouts.models import Group

    Group.objects.filter(id=cases[0].group_id).update(
        prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Prompt 0"}]
    )
    with pytest.raises(FieldError) as e:
        export_("sft", "standard", user=personas["trainer"], run=run)
    assert e.value.field == "model" and "chat template" in e.value.message
    assert not Dataset.objects.exists()


@pytest.mark.slow  # imports transformers
def test_it_renders_standard_prompts_with_the_named_models_chat_template(
    run, cases, personas, tokenizer, tmp_path
):
    from training.tiny import CHAT_TEMPLATE

    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tok")
    ds = export_("dpo", "standard", user=personas["trainer"], run=run, model=str(tmp_path / "tok"))
    rec = lines(ds)[0]
    assert (
        rec["prompt"] == "<|user|>\nPrompt 0<|end|>\n<|assistant|>\n"
    )  # ends where the answer starts
    assert rec["chosen"] == "the right answer"
    assert ds.source["prompt_format"] == f"chat template of {tmp_path / 'tok'}"
    with pytest.raises(FieldError) as e:
        export_(
            "dpo", "standard", user=personas["trainer"], run=run, model=str(tmp_path / "missing")
        )
    assert e.value.field == "model"


def test_it_sizes_a_dataset_run_from_the_records_and_epochs(
    client_as, run, cases, personas, settings, tmp_path, monkeypatch
):
    from webapp.runs import launch

    monkeypatch.setattr(launch, "enqueue_run", lambda run_id: "gpu")
    settings.RUNS_DIR = tmp_path
    ds = export_("sft", user=personas["trainer"], run=run, include_good=True)  # 2 records
    url = reverse("annotations-dataset-launch", args=[ds.id])
    page = client_as("trainer").get(reverse("annotations-dataset", args=[ds.id])).content.decode()
    assert "3.0 epochs over 2 records at batch 8 = 1 step" in page
    client_as("trainer").post(url, {"kind": "sft", "base_model": "m", "epochs": "8"})
    client_as("trainer").post(url, {"kind": "sft", "base_model": "m", "max_steps": "40"})
    by_epochs, by_steps = Run.objects.filter(kind="sft").order_by("id")
    assert (by_epochs.config["max_steps"], by_epochs.config["epochs"]) == (
        2,
        8.0,
    )  # ceil(2 * 8 / 8)
    assert (by_steps.config["max_steps"], by_steps.config["epochs"]) == (40, None)
    page = client_as("viewer").get(reverse("annotations-dataset", args=[ds.id])).content.decode()
    assert reverse("runs-dashboard", args=[by_epochs.id]) in page  # dataset -> run
    run_page = client_as("viewer").get(reverse("jobs-detail", args=[by_epochs.id])).content.decode()
    assert reverse("annotations-dataset", args=[ds.id]) in run_page  # run -> dataset


@pytest.mark.slow  # builds the offline tiny model (~20 s on a shared machine)
def test_it_renders_standard_prompts_with_the_tiny_models_own_template(
    run, cases, personas, settings, tmp_path
):
    settings.MODELS_DIR = tmp_path / "models"
    ds = export_("sft", "standard", user=personas["trainer"], run=run, model="tiny:diagram")
    assert lines(ds)[0]["prompt"] == "<|user|>\nPrompt 0<|end|>\n<|assistant|>\n"
    assert ds.source["prompt_format"] == "chat template of tiny:diagram"
