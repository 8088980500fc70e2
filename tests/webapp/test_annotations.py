"""Annotations: the taxonomy, one annotation per (rollout, author), permissions, the rollout slot,
review queues (materialisation, round-robin assignment, the focus walk, progress), the explorer
filter hook, activity and the diagnostics hook."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.conftest import make_group
from webapp.annotations import services
from webapp.annotations.models import (
    ActivityEvent,
    Annotation,
    ItemAssignment,
    Label,
    QueueItem,
    ReviewQueue,
)
from webapp.errors import FieldError
from webapp.explorer.params import ExplorerQuery
from webapp.explorer.query import explore
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.models import Rollout


@pytest.fixture
def rollouts(run) -> list[Rollout]:
    """Two steps x two groups x four rollouts; `correct` varies so sorts are meaningful."""
    groups = [
        make_group(
            step,
            f"p{k}",
            [{"correct": (i + k) % 2, "format": 1, "penalty": -0.1 * i} for i in range(4)],
            prompt=f"Prompt {k}",
        )
        for step in (0, 10)
        for k in range(2)
    ]
    ingest_groups(run, {"groups": groups})
    return list(Rollout.objects.filter(run=run).order_by("id"))


def label(slug: str) -> Label:
    return Label.objects.get(slug=slug)


def annotate(rollout: Rollout, user, slug: str, **kw) -> Annotation:
    return services.save_annotation(rollout, user, label=label(slug), **kw)[0]


# --- taxonomy -------------------------------------------------------------------------------------


def test_it_installs_the_default_taxonomy_with_keys(db):
    slugs = list(Label.objects.values_list("slug", flat=True))
    assert slugs[:3] == ["reward-hacking", "format-error", "ignores-prompt"]
    assert {"false-positive-reward", "false-negative-reward", "good", "loop-repetition"} <= set(
        slugs
    )
    assert label("false-positive-reward").is_bad and not label("false-negative-reward").is_bad
    keys = [k for k in Label.objects.values_list("key", flat=True) if k]
    assert len(keys) == len(set(keys)) == Label.objects.count()


def test_it_lets_only_admins_edit_the_taxonomy(client_as):
    hack = label("reward-hacking")
    data = {
        "slug": "reward-hacking",
        "name": "Reward hack",
        "description": "d",
        "color": "#AA0000",
        "key": "1",
        "is_bad": "on",
        "position": 0,
    }
    url = reverse("annotations-label-edit", args=[hack.id])
    assert client_as("trainer").post(url, data).status_code == 403
    assert client_as("admin").post(url, data).status_code == 302
    hack.refresh_from_db()
    assert (hack.name, hack.color) == ("Reward hack", "#aa0000")


def test_it_rejects_a_taken_key_and_a_bad_colour(client_as):
    c = client_as("admin")
    r = c.post(
        reverse("annotations-label-new"),
        {"slug": "new", "name": "New", "color": "red", "key": "2", "position": 20},
    )
    assert r.status_code == 400
    assert (
        "already the key of Format error" in r.content.decode() and "#rrggbb" in r.content.decode()
    )
    assert not Label.objects.filter(slug="new").exists()


# --- annotating -----------------------------------------------------------------------------------


def test_it_keeps_one_row_per_author_and_updates_in_place(rollouts, personas):
    r = rollouts[0]
    a1 = annotate(r, personas["annotator"], "reward-hacking", note="first")
    a2 = annotate(r, personas["annotator"], "format-error", note="second")
    assert a1.id == a2.id and Annotation.objects.count() == 1
    a2.refresh_from_db()
    assert (a2.label.slug, a2.note) == ("format-error", "second") and a2.updated_at >= a2.created_at


def test_it_keeps_both_rows_when_two_people_annotate_the_same_rollout(rollouts, personas):
    r = rollouts[0]
    annotate(r, personas["annotator"], "reward-hacking", note="mine")
    annotate(r, personas["trainer"], "good", note="theirs")
    rows = {a.author.username: (a.label.slug, a.note) for a in Annotation.objects.filter(rollout=r)}
    assert rows == {"annotator": ("reward-hacking", "mine"), "trainer": ("good", "theirs")}


def test_it_refuses_a_second_row_for_the_same_author_at_the_database(rollouts, personas):
    from django.db import IntegrityError, transaction

    annotate(rollouts[0], personas["annotator"], "good")
    with pytest.raises(IntegrityError), transaction.atomic():
        Annotation.objects.create(
            rollout=rollouts[0], author=personas["annotator"], label=label("good")
        )


def test_it_does_not_let_a_viewer_annotate(client_as, rollouts):
    r = client_as("viewer").post(
        reverse("annotations-annotate", args=[rollouts[0].id]), {"label": "good"}
    )
    assert r.status_code == 403 and not Annotation.objects.exists()


def test_it_saves_an_annotation_from_the_slot_form(client_as, rollouts):
    r = rollouts[0]
    resp = client_as("annotator").post(
        reverse("annotations-annotate", args=[r.id]),
        {
            "label": "premature-completion",
            "note": "stopped early",
            "corrected_completion": "the full answer",
            "first_wrong_turn": "0",
            "error_category": "stops",
            "next": "/rollouts/x",
        },
    )
    assert resp.status_code == 302 and resp["Location"] == "/rollouts/x"
    a = Annotation.objects.get()
    assert (a.label.slug, a.note, a.corrected_completion, a.first_wrong_turn, a.error_category) == (
        "premature-completion",
        "stopped early",
        "the full answer",
        0,
        "stops",
    )


def test_it_answers_htmx_with_the_refreshed_slot(client_as, rollouts):
    resp = client_as("annotator").post(
        reverse("annotations-annotate", args=[rollouts[0].id]),
        {"label": "good"},
        HTTP_HX_REQUEST="true",
    )
    assert resp.status_code == 200
    html = resp.content.decode()
    assert f'id="ann-slot-{rollouts[0].id}"' in html and "Good" in html and "saved" in html


def test_it_refuses_an_offsite_next_url(client_as, rollouts):
    resp = client_as("annotator").post(
        reverse("annotations-annotate", args=[rollouts[0].id]),
        {"label": "good", "next": "https://evil.example/"},
    )
    assert resp["Location"] == reverse("annotations-rollout", args=[rollouts[0].id])


@pytest.mark.parametrize(
    "data,field,message",
    [
        ({}, "label", "choose a label"),
        ({"label": "no-such"}, "label", "unknown label"),
        ({"label": "good", "first_wrong_turn": "5"}, "first_wrong_turn", "turns 0 to 0"),
        (
            {"label": "good", "first_wrong_turn": "-1"},
            "first_wrong_turn",
            "greater than or equal to 0",
        ),
        ({"label": "good", "first_wrong_turn": "x"}, "first_wrong_turn", "whole number"),
    ],
)
def test_it_rejects_bad_input_naming_the_field_and_stores_nothing(
    client_as, rollouts, data, field, message
):
    resp = client_as("annotator").post(reverse("annotations-annotate", args=[rollouts[0].id]), data)
    assert resp.status_code == 400
    html = resp.content.decode()
    assert f"{field}: " in html and message in html
    assert not Annotation.objects.exists() and not ActivityEvent.objects.exists()


def test_it_rejects_a_first_wrong_turn_that_is_not_an_assistant_turn(client_as, rollouts):
    r = rollouts[0]
    Rollout.objects.filter(id=r.id).update(
        transcript=[
            {"role": "assistant", "content": "call"},
            {"role": "tool", "content": "result"},
            {"role": "assistant", "content": "done"},
        ]
    )
    c = client_as("annotator")
    bad = c.post(
        reverse("annotations-annotate", args=[r.id]), {"label": "good", "first_wrong_turn": "1"}
    )
    assert bad.status_code == 400 and "turn 1 is not an assistant turn" in bad.content.decode()
    ok = c.post(
        reverse("annotations-annotate", args=[r.id]), {"label": "good", "first_wrong_turn": "2"}
    )
    assert ok.status_code == 302 and Annotation.objects.get().first_wrong_turn == 2


def test_it_never_lets_an_annotator_change_another_persons_annotation(
    client_as, rollouts, personas, make_user
):
    theirs = annotate(rollouts[0], personas["trainer"], "reward-hacking", note="theirs")
    c = client_as("annotator")
    c.post(
        reverse("annotations-annotate", args=[rollouts[0].id]), {"label": "good", "note": "mine"}
    )
    theirs.refresh_from_db()
    assert (theirs.label.slug, theirs.note) == (
        "reward-hacking",
        "theirs",
    )  # the post made the annotator's own row
    assert c.post(reverse("annotations-delete", args=[theirs.id])).status_code == 403
    assert Annotation.objects.filter(id=theirs.id).exists()


def test_it_lets_authors_and_admins_delete(client_as, rollouts, personas):
    mine = annotate(rollouts[0], personas["annotator"], "good")
    theirs = annotate(rollouts[1], personas["trainer"], "good")
    assert (
        client_as("annotator").post(reverse("annotations-delete", args=[mine.id])).status_code
        == 302
    )
    assert (
        client_as("admin").post(reverse("annotations-delete", args=[theirs.id])).status_code == 302
    )
    assert not Annotation.objects.exists()
    assert ActivityEvent.objects.filter(action="deleted").count() == 2


def test_it_requires_post_to_change_anything(client_as, rollouts, personas):
    a = annotate(rollouts[0], personas["annotator"], "good")
    c = client_as("annotator")
    assert c.get(reverse("annotations-annotate", args=[rollouts[0].id])).status_code == 405
    assert c.get(reverse("annotations-delete", args=[a.id])).status_code == 405


def test_it_enforces_csrf_on_annotation_posts(rollouts, personas):
    from django.test import Client

    c = Client(enforce_csrf_checks=True)
    c.force_login(personas["annotator"])
    assert (
        c.post(
            reverse("annotations-annotate", args=[rollouts[0].id]), {"label": "good"}
        ).status_code
        == 403
    )


def test_it_requires_a_login(client, rollouts):
    resp = client.get(reverse("annotations-rollout", args=[rollouts[0].id]))
    assert resp.status_code == 302 and "/accounts/login/" in resp["Location"]


def test_it_renders_the_slot_with_escaped_model_text(client_as, rollouts, personas):
    r = rollouts[0]
    Rollout.objects.filter(id=r.id).update(
        transcript=[{"role": "assistant", "content": "<script>alert(1)</script>"}]
    )
    annotate(
        r,
        personas["trainer"],
        "reward-hacking",
        note="<img src=x onerror=alert(2)>",
        corrected_completion="<b>fixed</b>",
    )
    html = client_as("viewer").get(reverse("annotations-rollout", args=[r.id])).content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html
    assert "<img src=x" not in html and "&lt;img src=x" in html and "&lt;b&gt;fixed" in html
    assert "Save my annotation" not in html  # viewers see annotations, not the form


def test_it_prefills_the_slot_form_with_my_annotation(client_as, rollouts, personas):
    annotate(rollouts[0], personas["annotator"], "loop-repetition", note="again and again")
    html = (
        client_as("annotator")
        .get(reverse("annotations-slot", args=[rollouts[0].id]))
        .content.decode()
    )
    assert 'value="loop-repetition" checked' in html and "again and again</textarea>" in html


# --- explorer hook --------------------------------------------------------------------------------


def test_it_filters_the_explorer_by_label_and_annotated(run, rollouts, personas):
    annotate(rollouts[0], personas["annotator"], "reward-hacking")
    annotate(rollouts[1], personas["annotator"], "good")
    for sort in ("reward", "correct"):  # both query paths: Rollout and RewardScore

        def ids(sort=sort, **p):
            return {
                row.rollout.id
                for row in explore(
                    run,
                    ExplorerQuery.from_params(
                        {"sort": sort, "limit": "100", **p}, ["correct", "format", "penalty"]
                    ),
                ).rows
            }

        assert ids(label="reward-hacking") == {rollouts[0].id}
        assert ids(annotated="1") == {rollouts[0].id, rollouts[1].id}
        assert ids(annotated="0") == {r.id for r in rollouts[2:]}
        assert ids(label="good", annotated="1") == {rollouts[1].id}


def test_it_names_the_label_parameter_when_the_slug_is_unknown(run, rollouts):
    with pytest.raises(FieldError) as e:
        explore(run, ExplorerQuery.from_params({"label": "nope"}, []))
    assert e.value.field == "label" and "reward-hacking" in e.value.message


# --- queues ---------------------------------------------------------------------------------------


def make_queue(run, personas, **kw) -> ReviewQueue:
    args = dict(
        name="q",
        run=run,
        source="explorer",
        params={"sort": "correct", "order": "desc"},
        limit=6,
        seed=None,
        overlap=1,
        created_by=personas["trainer"],
        assignees=[],
    )
    args.update(kw)
    return services.create_queue(**args)


def test_it_materialises_the_top_n_of_an_explorer_view(run, rollouts, personas):
    q = make_queue(
        run, personas, params={"sort": "penalty", "order": "asc", "step_min": "10"}, limit=3
    )
    items = list(q.items.select_related("rollout").order_by("position"))
    assert [i.position for i in items] == [0, 1, 2]
    assert all(i.rollout.step == 10 for i in items)
    expected = [
        row.rollout.id
        for row in explore(
            run,
            ExplorerQuery.from_params(
                {"sort": "penalty", "order": "asc", "step_min": "10", "limit": "3"},
                ["correct", "format", "penalty"],
            ),
        ).rows
    ]
    assert [i.rollout_id for i in items] == expected
    ingest_groups(run, {"groups": [make_group(20, "late", [{"correct": 1}, {"correct": 0}])]})
    assert q.items.count() == 3  # materialised: new rollouts do not join an existing queue


def test_it_pages_through_the_explorer_for_a_queue_past_one_page(
    run, rollouts, personas, monkeypatch
):
    monkeypatch.setattr(services, "MAX_LIMIT", 5)
    q = make_queue(run, personas, limit=12, params={"sort": "reward"})
    assert q.items.count() == 12 and len(set(q.items.values_list("rollout_id", flat=True))) == 12


def test_it_samples_randomly_with_a_seed_reproducibly(run, rollouts, personas):
    a = make_queue(run, personas, source="random", params={}, seed=7, limit=5)
    b = make_queue(run, personas, source="random", params={}, seed=7, limit=5)
    c = make_queue(run, personas, source="random", params={}, seed=8, limit=5)
    ids = lambda q: list(q.items.order_by("position").values_list("rollout_id", flat=True))  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c) and len(set(ids(a))) == 5


def test_it_names_the_explorer_parameter_that_is_wrong_and_creates_no_queue(
    client_as, run, rollouts
):
    resp = client_as("trainer").post(
        reverse("annotations-queue-new"),
        {
            "name": "bad",
            "run": run.id,
            "source": "explorer",
            "params": "sort=nope",
            "limit": 10,
            "overlap": 1,
        },
    )
    assert resp.status_code == 400 and "sort: must be one of" in resp.content.decode()
    assert not ReviewQueue.objects.exists()


def test_it_creates_a_queue_from_the_form_with_a_pasted_explorer_url(
    client_as, run, rollouts, personas
):
    resp = client_as("trainer").post(
        reverse("annotations-queue-new"),
        {
            "name": "late hacks",
            "run": run.id,
            "source": "explorer",
            "limit": 4,
            "overlap": 2,
            "params": "/rollouts/runs/1/?sort=correct&order=desc&step_min=10&cursor=abc",
            "assignees": [personas["annotator"].id, personas["trainer"].id],
        },
    )
    q = ReviewQueue.objects.get()
    assert resp.status_code == 302 and resp["Location"] == reverse("annotations-queue", args=[q.id])
    assert (
        q.params == {"sort": "correct", "order": "desc", "step_min": "10"} and q.items.count() == 4
    )
    assert ItemAssignment.objects.filter(item__queue=q).count() == 8


def test_it_rejects_an_overlap_larger_than_the_assignees(client_as, run, rollouts, personas):
    resp = client_as("trainer").post(
        reverse("annotations-queue-new"),
        {
            "name": "x",
            "run": run.id,
            "source": "random",
            "limit": 4,
            "overlap": 3,
            "seed": 1,
            "assignees": [personas["annotator"].id],
        },
    )
    assert (
        resp.status_code == 400
        and "overlap: cannot exceed the number of assignees (1)" in resp.content.decode()
    )
    assert not ReviewQueue.objects.exists()


def test_it_lets_only_trainers_create_and_assign_queues(client_as, run, rollouts, personas):
    assert client_as("annotator").get(reverse("annotations-queue-new")).status_code == 403
    q = make_queue(run, personas)
    resp = client_as("annotator").post(
        reverse("annotations-queue-assign", args=[q.id]),
        {"assignees": [personas["annotator"].id], "overlap": 1},
    )
    assert resp.status_code == 403 and not q.assignees.exists()


def test_it_assigns_round_robin_with_overlap(run, rollouts, personas, make_user):
    people = [personas["annotator"], make_user("ann2", "annotator"), make_user("ann3", "annotator")]
    q = make_queue(run, personas, limit=4, overlap=2, assignees=people)
    got = {}
    for a in ItemAssignment.objects.filter(item__queue=q).select_related("item", "user"):
        got.setdefault(a.item.position, set()).add(a.user.username)
    assert got == {
        0: {"annotator", "ann2"},
        1: {"ann3", "annotator"},
        2: {"ann2", "ann3"},
        3: {"annotator", "ann2"},
    }
    assert [p.assigned for p in services.progress(q)] == [3, 3, 2]


def test_it_walks_my_items_in_order_skipping_what_i_did_and_skipped(
    run, rollouts, personas, make_user
):
    me, other = personas["annotator"], make_user("ann2", "annotator")
    q = make_queue(
        run, personas, limit=6, overlap=1, assignees=[me, other]
    )  # me: positions 0, 2, 4
    item = lambda pos: QueueItem.objects.get(queue=q, position=pos)  # noqa: E731
    assert services.next_item(q, me).position == 0
    annotate(item(0).rollout, me, "good")
    assert services.next_item(q, me, after=0).position == 2
    services.skip_item(item(2), me)
    assert services.next_item(q, me, after=2).position == 4
    annotate(item(4).rollout, me, "good")
    assert services.next_item(q, me, after=4).position == 2  # only the skipped one is left
    annotate(item(2).rollout, me, "good")
    assert services.next_item(q, me) is None
    [p_me, p_other] = services.progress(q)
    assert (p_me.assigned, p_me.done, p_me.skipped, p_me.percent) == (3, 3, 0, 100)
    assert (p_other.assigned, p_other.done) == (3, 0)


def test_it_counts_annotations_made_outside_the_queue_as_progress(run, rollouts, personas):
    q = make_queue(run, personas, limit=2, assignees=[personas["annotator"]])
    annotate(q.items.get(position=1).rollout, personas["annotator"], "format-error")
    assert services.progress(q)[0].done == 1
    assert services.queue_summary(q) == {"items": 2, "annotated": 1, "complete": 1}


def test_it_walks_the_queue_through_the_focus_views(client_as, run, rollouts, personas):
    q = make_queue(run, personas, limit=3, assignees=[personas["annotator"]])
    c = client_as("annotator")
    first = c.get(reverse("annotations-focus-next", args=[q.id]))
    assert first["Location"] == reverse("annotations-focus", args=[q.id, 0])
    page = c.get(first["Location"])
    assert page.status_code == 200 and "item 1 of 3" in page.content.decode()
    saved = c.post(
        reverse("annotations-focus-save", args=[q.id, 0]),
        {"label": "trivial-output", "note": "empty"},
    )
    assert saved["Location"] == reverse("annotations-focus-next", args=[q.id]) + "?after=0"
    assert c.get(saved["Location"])["Location"] == reverse("annotations-focus", args=[q.id, 1])
    skipped = c.post(reverse("annotations-focus-skip", args=[q.id, 1]))
    assert c.get(skipped["Location"])["Location"] == reverse("annotations-focus", args=[q.id, 2])
    assert Annotation.objects.get().label.slug == "trivial-output"
    assert ItemAssignment.objects.get(item__position=1).skipped_at is not None


def test_it_shows_a_focus_form_error_without_saving(client_as, run, rollouts, personas):
    q = make_queue(run, personas, limit=2)
    resp = client_as("annotator").post(
        reverse("annotations-focus-save", args=[q.id, 0]), {"note": "no label"}
    )
    assert resp.status_code == 400 and "label: choose a label" in resp.content.decode()
    assert not Annotation.objects.exists()


def test_it_keeps_viewers_out_of_the_focus_view(client_as, run, rollouts, personas):
    q = make_queue(run, personas, limit=2)
    c = client_as("viewer")
    assert c.get(reverse("annotations-focus", args=[q.id, 0])).status_code == 403
    assert (
        c.post(reverse("annotations-focus-save", args=[q.id, 0]), {"label": "good"}).status_code
        == 403
    )
    assert c.get(reverse("annotations-queue", args=[q.id])).status_code == 200  # reading is fine


def test_it_shows_progress_per_person_on_the_queue_page(
    client_as, run, rollouts, personas, make_user
):
    q = make_queue(
        run, personas, limit=4, assignees=[personas["annotator"], make_user("ann2", "annotator")]
    )
    annotate(q.items.get(position=0).rollout, personas["annotator"], "good")
    html = client_as("viewer").get(reverse("annotations-queue", args=[q.id])).content.decode()
    assert (
        "annotator</td><td>2</td><td>1</td><td>0</td>" in html
        and "ann2</td><td>2</td><td>0</td>" in html
    )


# --- activity and hooks ---------------------------------------------------------------------------


def test_it_shows_activity_to_admins_only(client_as, rollouts, personas):
    annotate(rollouts[0], personas["annotator"], "reward-hacking")
    annotate(rollouts[0], personas["annotator"], "good")
    assert client_as("trainer").get(reverse("annotations-activity")).status_code == 403
    html = client_as("admin").get(reverse("annotations-activity")).content.decode()
    assert ">annotator</a>" in html
    assert "created" in html and "updated" in html and "reward-hacking" in html


def test_it_reports_bad_case_rollout_ids_for_diagnostics(run, rollouts, personas):
    annotate(rollouts[0], personas["annotator"], "reward-hacking")
    annotate(rollouts[0], personas["trainer"], "good")
    annotate(
        rollouts[1], personas["annotator"], "false-negative-reward"
    )  # good completion: not a bad case
    annotate(rollouts[2], personas["trainer"], "loop-repetition")
    assert services.bad_case_rollout_ids(run) == {rollouts[0].id, rollouts[2].id}
    assert services.bad_case_rollout_ids(run.id) == {rollouts[0].id, rollouts[2].id}


def test_it_clears_a_skip_once_the_item_is_annotated(run, rollouts, personas):
    q = make_queue(run, personas, limit=2, assignees=[personas["annotator"]])
    item = q.items.get(position=0)
    services.skip_item(item, personas["annotator"])
    assert services.progress(q)[0].skipped == 1
    annotate(item.rollout, personas["annotator"], "good")
    assert (
        ItemAssignment.objects.get(item=item).skipped_at is None
        and services.progress(q)[0].skipped == 0
    )


# --- pages ----------------------------------------------------------------------------------------


def test_it_renders_every_annotation_page(client_as, run, rollouts, personas):
    from webapp.annotations import export

    q = make_queue(run, personas, limit=3, assignees=[personas["annotator"]])
    annotate(
        q.items.get(position=0).rollout,
        personas["annotator"],
        "reward-hacking",
        corrected_completion="better",
    )
    ds = export.export_dataset(
        name="d", kind="sft", fmt="standard", source="queue", queue=q, user=personas["trainer"]
    )
    c = client_as("admin")
    for name, args in [
        ("annotations-home", []),
        ("annotations-labels", []),
        ("annotations-label-new", []),
        ("annotations-label-edit", [label("good").id]),
        ("annotations-queue-new", []),
        ("annotations-queue", [q.id]),
        ("annotations-agreement", [q.id]),
        ("annotations-focus", [q.id, 0]),
        ("annotations-activity", []),
        ("annotations-datasets", []),
        ("annotations-dataset", [ds.id]),
        ("annotations-rollout", [rollouts[0].id]),
        ("annotations-slot", [rollouts[0].id]),
    ]:
        resp = c.get(reverse(name, args=args))
        assert resp.status_code == 200, name


def test_it_shows_the_slot_on_the_transcript_and_group_pages(client_as, rollouts, personas):
    annotate(rollouts[0], personas["trainer"], "format-error", note="broken json")
    c = client_as("annotator")
    for url in (
        reverse("rollouts-transcript", args=[rollouts[0].id]),
        reverse("rollouts-group", args=[rollouts[0].group_id]),
    ):
        html = c.get(url).content.decode()
        assert f'id="ann-slot-{rollouts[0].id}"' in html and "broken json" in html, url
        assert "Annotate this rollout" in html and html.count("css/annotations.css") == 1


def test_it_reassigns_a_queue_and_refuses_people_who_cannot_annotate(
    client_as, run, rollouts, personas, make_user
):
    q = make_queue(run, personas, limit=4, assignees=[personas["annotator"]])
    c = client_as("trainer")
    url = reverse("annotations-queue-assign", args=[q.id])
    resp = c.post(url, {"assignees": [personas["viewer"].id], "overlap": 1}, follow=True)
    assert "assignees: cannot annotate (viewer role): viewer" in resp.content.decode()
    assert list(q.assignees.values_list("user__username", flat=True)) == ["annotator"]
    bob = make_user("bob", "annotator")
    c.post(url, {"assignees": [personas["annotator"].id, bob.id], "overlap": 2})
    q.refresh_from_db()
    assert q.overlap == 2 and ItemAssignment.objects.filter(item__queue=q).count() == 8


def test_it_points_the_htmx_slots_links_back_to_the_page_not_the_post(
    client_as, rollouts, personas
):
    c = client_as("annotator")
    resp = c.post(
        reverse("annotations-annotate", args=[rollouts[0].id]),
        {"label": "good", "next": "/rollouts/5/"},
        HTTP_HX_REQUEST="true",
    )
    assert 'name="next" value="/rollouts/5/"' in resp.content.decode()


def test_it_recreates_missing_default_labels_without_touching_edited_ones(db):
    from webapp.annotations.taxonomy import ensure_default_labels

    Label.objects.filter(slug="good").delete()
    Label.objects.filter(slug="format-error").update(name="Format!")
    assert ensure_default_labels() == 1 and ensure_default_labels() == 0
    assert label("format-error").name == "Format!" and label("good").key == "0"
