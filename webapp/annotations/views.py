"""Thin function views: a permission helper first, then a service call. Login is
enforced by middleware."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from webapp.accounts.roles import require_role
from webapp.annotations import export, services
from webapp.annotations.forms import (
    AnnotationForm,
    AssignForm,
    ExportForm,
    LabelForm,
    LaunchForm,
    QueueForm,
)
from webapp.annotations.models import (
    ActivityEvent,
    Annotation,
    Dataset,
    Label,
    QueueItem,
    ReviewQueue,
)
from webapp.annotations.templatetags.annotation_tags import initial_from
from webapp.errors import FieldError
from webapp.rollouts.models import Rollout
from webapp.runs.models import Run


def _safe_next(request: HttpRequest, default: str) -> str:
    nxt = request.POST.get("next") or request.GET.get("next") or ""
    ok = url_has_allowed_host_and_scheme(
        nxt, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return nxt if ok else default


def _queue_for(request: HttpRequest, queue_id: int, role: str = "viewer") -> ReviewQueue:
    require_role(request, role)
    return get_object_or_404(ReviewQueue.objects.select_related("run"), id=queue_id)


# --- annotating a rollout (the transcript / group page slot) --------------------------------------


def _slot_next(request: HttpRequest, rollout: Rollout) -> str:
    # The fragment's own URL (or the POST's) is no page to come back to: links go to the page
    # that holds it.
    return _safe_next(request, reverse("annotations-rollout", args=[rollout.id]))


@require_safe
def rollout_slot(request: HttpRequest, rollout_id: int) -> HttpResponse:
    rollout = get_object_or_404(Rollout, id=rollout_id)
    return render(
        request,
        "annotations/_rollout_slot.html",
        {"rollout": rollout, "next_url": _slot_next(request, rollout)},
    )


@require_POST
def annotate(request: HttpRequest, rollout_id: int) -> HttpResponse:
    require_role(request, "annotator")
    rollout = get_object_or_404(Rollout, id=rollout_id)
    form = AnnotationForm(request.POST, rollout=rollout)
    ctx = {"rollout": rollout, "next_url": _slot_next(request, rollout)}
    if not form.is_valid():
        return render(request, "annotations/_rollout_slot.html", {**ctx, "form": form}, status=400)
    services.save_annotation(rollout, request.user, **form.cleaned_data)
    if request.headers.get("HX-Request"):
        return render(request, "annotations/_rollout_slot.html", {**ctx, "saved": True})
    messages.success(request, "Annotation saved.")
    return redirect(ctx["next_url"])


@require_POST
def delete(request: HttpRequest, annotation_id: int) -> HttpResponse:
    require_role(request, "annotator")
    ann = get_object_or_404(Annotation.objects.select_related("label", "author"), id=annotation_id)
    if not services.can_delete(request.user, ann):
        raise PermissionDenied("only the author or an admin may delete an annotation")
    services.delete_annotation(ann, request.user)
    messages.success(request, "Annotation deleted.")
    return redirect(_safe_next(request, reverse("annotations-rollout", args=[ann.rollout_id])))


# --- review queues --------------------------------------------------------------------------------


@require_safe
def home(request: HttpRequest) -> HttpResponse:
    queues = ReviewQueue.objects.select_related("run", "created_by").annotate(
        n_items=Count("items")
    )[:200]
    return render(
        request, "annotations/home.html", {"queues": queues, "labels": Label.objects.all()}
    )


def queue_new(request: HttpRequest) -> HttpResponse:
    require_role(request, "trainer")
    run_id, params = request.GET.get("run"), request.GET.get("params")
    source = (
        request.GET.get("source")
        if request.GET.get("source") in ReviewQueue.Source.values
        else None
    )
    name = f"run {run_id} explorer view" if source == "explorer" and run_id else None
    form = QueueForm(
        request.POST or None,
        initial={"run": run_id, "params": params, "source": source, "name": name},
    )
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            queue = services.create_queue(
                name=d["name"],
                run=d["run"],
                source=d["source"],
                params=d["params"],
                limit=d["limit"],
                seed=d["seed"],
                overlap=d["overlap"],
                created_by=request.user,
                assignees=list(d["assignees"]),
            )
        except FieldError as e:
            form.add_error("params", f"{e.field}: {e.message}")
        else:
            return redirect("annotations-queue", queue.id)
    return render(
        request, "annotations/queue_new.html", {"form": form}, status=400 if form.errors else 200
    )


@require_safe
def queue_detail(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = _queue_for(request, queue_id)
    # A listing: never the rollouts' transcripts, states or search text (10-200 KB each, up
    # to 1,000 rows).
    items = (
        queue.items.select_related("rollout")
        .defer(
            "rollout__transcript", "rollout__state", "rollout__search_text", "rollout__search_words"
        )
        .prefetch_related(
            "assignments__user", "rollout__annotations__label", "rollout__annotations__author"
        )[:1000]
    )
    assign_form = AssignForm(
        initial={"assignees": [a.user_id for a in queue.assignees.all()], "overlap": queue.overlap}
    )
    return render(
        request,
        "annotations/queue.html",
        {
            "queue": queue,
            "items": items,
            "progress": services.progress(queue),
            "summary": services.queue_summary(queue),
            "assign_form": assign_form,
            "export_form": ExportForm(
                initial={"source": "queue", "queue": queue.id, "name": f"queue-{queue.id}"}
            ),
        },
    )


@require_POST
def queue_assign(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = _queue_for(request, queue_id, "trainer")
    form = AssignForm(request.POST)
    if not form.is_valid():
        for name, errs in form.errors.items():
            messages.error(request, f"{name}: {' '.join(errs)}")
        return redirect("annotations-queue", queue.id)
    services.assign(queue, list(form.cleaned_data["assignees"]), form.cleaned_data["overlap"])
    messages.success(request, "Assignments updated.")
    return redirect("annotations-queue", queue.id)


@require_safe
def focus_next(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = _queue_for(request, queue_id, "annotator")
    after = request.GET.get("after")
    item = services.next_item(
        queue, request.user, int(after) if after and after.isdigit() else None
    )
    if item is None:
        messages.success(request, "Nothing left for you in this queue.")
        return redirect("annotations-queue", queue.id)
    return redirect("annotations-focus", queue.id, item.position)


@require_safe
def focus(request: HttpRequest, queue_id: int, position: int) -> HttpResponse:
    queue = _queue_for(request, queue_id, "annotator")
    item = get_object_or_404(
        QueueItem.objects.select_related("rollout__group", "rollout__run__environment"),
        queue=queue,
        position=position,
    )
    mine = (
        Annotation.objects.filter(rollout=item.rollout, author=request.user)
        .select_related("label")
        .first()
    )
    form = AnnotationForm(rollout=item.rollout, initial=initial_from(mine))
    return _render_focus(request, queue, item, form)


def _render_focus(
    request: HttpRequest,
    queue: ReviewQueue,
    item: QueueItem,
    form: AnnotationForm,
    status: int = 200,
) -> HttpResponse:
    from webapp.rollouts.views import state_image

    mine = [p for p in services.progress(queue) if p.user.pk == request.user.pk]
    rollout = item.rollout
    svg_uri, canvas_errors, _ = state_image(
        rollout.run, rollout.group, rollout
    )  # re-rendered, never stored SVG
    return render(
        request,
        "annotations/focus.html",
        {
            "svg_uri": svg_uri,
            "canvas_errors": canvas_errors,
            "queue": queue,
            "item": item,
            "rollout": item.rollout,
            "form": form,
            "labels": Label.objects.all(),
            "total": queue.items.count(),
            "my_progress": mine[0] if mine else None,
            "scores": item.rollout.scores.select_related("component").order_by(
                "component__position", "component_id"
            ),
        },
        status=status,
    )


@require_POST
def focus_save(request: HttpRequest, queue_id: int, position: int) -> HttpResponse:
    queue = _queue_for(request, queue_id, "annotator")
    item = get_object_or_404(
        QueueItem.objects.select_related("rollout__group"), queue=queue, position=position
    )
    form = AnnotationForm(request.POST, rollout=item.rollout)
    if not form.is_valid():
        return _render_focus(request, queue, item, form, status=400)
    services.save_annotation(item.rollout, request.user, **form.cleaned_data)
    return HttpResponseRedirect(
        f"{reverse('annotations-focus-next', args=[queue.id])}?after={position}"
    )


@require_POST
def focus_skip(request: HttpRequest, queue_id: int, position: int) -> HttpResponse:
    queue = _queue_for(request, queue_id, "annotator")
    item = get_object_or_404(QueueItem, queue=queue, position=position)
    services.skip_item(item, request.user)
    return HttpResponseRedirect(
        f"{reverse('annotations-focus-next', args=[queue.id])}?after={position}"
    )


@require_safe
def queue_agreement(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = _queue_for(request, queue_id)
    return render(
        request, "annotations/agreement.html", {"queue": queue, **services.queue_agreement(queue)}
    )


# --- taxonomy and activity ------------------------------------------------------------------------


@require_safe
def labels(request: HttpRequest) -> HttpResponse:
    return render(
        request, "annotations/labels.html", {"labels": Label.objects.all(), "form": LabelForm()}
    )


def label_edit(request: HttpRequest, label_id: int | None = None) -> HttpResponse:
    require_role(request, "admin")
    label = get_object_or_404(Label, id=label_id) if label_id else None
    form = LabelForm(request.POST or None, instance=label)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, f"Label {form.instance.name} saved.")
        return redirect("annotations-labels")
    return render(
        request,
        "annotations/label_edit.html",
        {"form": form, "label": label},
        status=400 if form.errors else 200,
    )


@require_safe
def activity(request: HttpRequest) -> HttpResponse:
    require_role(request, "admin")
    events = ActivityEvent.objects.select_related("actor")
    if request.GET.get("user"):
        events = events.filter(actor__username=request.GET["user"])
    return render(request, "annotations/activity.html", {"events": events[:500]})


# --- datasets -------------------------------------------------------------------------------------


@require_safe
def datasets(request: HttpRequest) -> HttpResponse:
    rows = Dataset.objects.select_related("created_by")[:500]
    return render(request, "annotations/datasets.html", {"datasets": rows, "form": ExportForm()})


@require_POST
def export_view(request: HttpRequest) -> HttpResponse:
    require_role(request, "trainer")
    form = ExportForm(request.POST)
    if form.is_valid():
        d = form.cleaned_data
        try:
            ds = export.export_dataset(
                name=d["name"],
                kind=d["kind"],
                fmt=d["format"],
                source=d["source"],
                user=request.user,
                run=d.get("run"),
                queue=d.get("queue"),
                label=d.get("label"),
                params=d["params"],
                include_good=d["include_good"],
                model=d.get("model") or "",
                min_margin=d.get("min_margin"),
            )
        except FieldError as e:
            form.add_error(None, f"{e.field}: {e.message}")
        else:
            messages.success(request, f"Exported {ds} with {ds.source['records']} records.")
            return redirect("annotations-dataset", ds.id)
    return render(request, "annotations/export.html", {"form": form}, status=400)


@require_safe
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    ds = get_object_or_404(Dataset.objects.select_related("created_by"), id=dataset_id)
    records = ds.records.select_related("label", "annotator")[:50]
    source_run = Run.objects.filter(id=ds.source.get("run_id")).first()
    total = ds.records.count()
    batch = export.batch_size(ds.kind)
    return render(
        request,
        "annotations/dataset.html",
        {
            "dataset": ds,
            "records": records,
            "runs": export.runs_from(ds),
            "total": total,
            "source_run": source_run,
            "default_base_model": export.default_base_model(source_run),
            "epochs": export.DEFAULT_EPOCHS,
            "batch": batch,
            "default_steps": export.steps_for(total, export.DEFAULT_EPOCHS, batch),
        },
    )


@require_safe
def dataset_download(request: HttpRequest, dataset_id: int) -> StreamingHttpResponse:
    ds = get_object_or_404(Dataset, id=dataset_id)
    response = StreamingHttpResponse(
        export.jsonl_lines(ds), content_type="application/jsonl; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{export.jsonl_filename(ds)}"'
    return response


@require_POST
def dataset_launch(request: HttpRequest, dataset_id: int) -> HttpResponse:
    require_role(request, "trainer")
    ds = get_object_or_404(Dataset, id=dataset_id)
    form = LaunchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
        return redirect("annotations-dataset", ds.id)
    try:
        d = form.cleaned_data
        run, note = export.launch_training(
            ds,
            d["kind"],
            request.user,
            d["base_model"],
            epochs=d.get("epochs"),
            max_steps=d.get("max_steps"),
        )
    except FieldError as e:
        messages.error(request, f"{e.field}: {e.message}")
        return redirect("annotations-dataset", ds.id)
    messages.success(request, note)
    return redirect("annotations-dataset", ds.id)


@require_safe
def rollout_page(request: HttpRequest, rollout_id: int) -> HttpResponse:
    """A minimal page for one rollout's annotations (the transcript page embeds the same slot)."""
    rollout = get_object_or_404(Rollout.objects.select_related("group", "run"), id=rollout_id)
    return render(request, "annotations/rollout.html", {"rollout": rollout})
