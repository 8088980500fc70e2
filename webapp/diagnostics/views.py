"""Diagnostics pages: component health and findings, ablations (preview, save, compare,
launch a twin), and the overlay of a run with its twin. Reading needs any role; saving and
launching need trainer.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from webapp.accounts.roles import has_role, require_role
from webapp.diagnostics import charts, links, report, services
from webapp.diagnostics.forms import AblationForm
from webapp.diagnostics.models import Ablation
from webapp.errors import FieldError
from webapp.runs.access import get_run_for
from webapp.runs.models import Run
from webapp.runs.services import weights_differ

MAX_COMPARE = 8


def _ablation(request: HttpRequest, ablation_id: int, role: str = "viewer") -> Ablation:
    require_role(request, role)
    return get_object_or_404(
        Ablation.objects.select_related("run", "run__environment", "created_by", "twin"),
        id=ablation_id,
    )


def _window(raw: str | None) -> tuple[int | None, str | None]:
    """(window in steps or None for the whole run, error naming the parameter)."""
    try:
        return report.parse_window(raw), None
    except FieldError as e:
        return services.DEFAULT_WINDOW, str(e)


@require_safe
def run_diagnostics(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    window, error = _window(request.GET.get("window"))
    diag = services.diagnose_run(run, window)
    agg = services.step_aggregates(run)
    found = diag["findings"]
    figures = {
        "zero-std": charts.zero_std_figure(agg, found),
        "within-std": charts.within_std_figure(agg),
        "means": charts.component_mean_figure(agg, found),
        "share": charts.share_figure(diag["health"]),
        "corr": charts.corr_figure(diag["health"]),
        "at-max": charts.at_max_figure(diag.get("over_time") or {}, found),
    }
    return render(
        request,
        "diagnostics/run.html",
        {
            "run": run,
            "diag": diag,
            "findings": links.with_links(run.id, diag["findings"]),
            "figures": figures,
            "window": "all" if window is None else window,
            "error": error,
            "has_steps": bool(agg["steps"]),
            "explorer": links.explorer_url(run.id),
        },
        status=400 if error else 200,
    )


def _is_partial(request: HttpRequest) -> bool:
    # A history restore (back button after a cache miss) needs the whole page, not the fragment.
    return bool(request.headers.get("HX-Request")) and not request.headers.get(
        "HX-History-Restore-Request"
    )


def _ablation_page(
    request: HttpRequest, run: Run, form: AblationForm, result: dict | None, invalid: bool = False
):
    ctx = {
        "run": run,
        "form": form,
        "result": result,
        "can_save": has_role(request.user, "trainer"),
        "saved": list(run.ablations.select_related("created_by", "twin")[:100]),
    }
    if _is_partial(request):
        # htmx 2 does not swap a 4xx response: the fragment carrying the field errors comes
        # back as 200.
        return render(request, "diagnostics/_result.html", ctx)
    return render(request, "diagnostics/ablations.html", ctx, status=400 if invalid else 200)


@require_safe
def ablations(request: HttpRequest, run_id: int) -> HttpResponse:
    """The ablation form; with its fields in the query string, a preview of the
    result (not saved)."""
    run = get_run_for(request, run_id)
    bound = "scale_rewards" in request.GET
    form = AblationForm(run, run.components(), request.GET if bound else None)
    result = services.run_ablation(run, form.spec) if bound and form.is_valid() else None
    return _ablation_page(request, run, form, result, invalid=bound and bool(form.errors))


@require_POST
def ablation_save(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id, "trainer")
    form = AblationForm(run, run.components(), request.POST)
    if not form.is_valid():
        return _ablation_page(request, run, form, None, invalid=True)
    ablation = Ablation.objects.create(
        run=run,
        name=form.ablation_name(),
        spec=form.spec.as_dict(),
        results=services.run_ablation(run, form.spec),
        created_by=request.user,
    )
    messages.success(request, f"Saved ablation “{ablation.name}”.")
    url = reverse("diagnostics-ablation", kwargs={"ablation_id": ablation.id})
    if _is_partial(request):
        return HttpResponse(status=204, headers={"HX-Redirect": url})
    return redirect(url)


@require_safe
def ablation_detail(request: HttpRequest, ablation_id: int) -> HttpResponse:
    ablation = _ablation(request, ablation_id)
    return render(
        request,
        "diagnostics/ablation.html",
        {
            "run": ablation.run,
            "ablation": ablation,
            "result": ablation.results,
            "can_launch": has_role(request.user, "trainer")
            and ablation.run.environment_id is not None,
        },
    )


@require_safe
def ablation_compare(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    ids = [int(i) for i in request.GET.getlist("ids") if i.isdigit()][:MAX_COMPARE]
    chosen = (
        list(run.ablations.filter(id__in=ids).order_by("created_at", "id"))
        if ids
        else list(run.ablations.order_by("-created_at", "-id")[:MAX_COMPARE])[::-1]
    )
    rows = [{"name": a.name, "results": a.results} for a in chosen]
    return render(
        request,
        "diagnostics/compare.html",
        {
            "run": run,
            "ablations": chosen,
            "figures": {"compare": charts.ablation_compare_figure(rows)},
            "error": None if chosen else "No saved ablations to compare yet.",
        },
    )


@require_POST
def ablation_launch(request: HttpRequest, ablation_id: int) -> HttpResponse:
    ablation = _ablation(request, ablation_id, "trainer")
    if ablation.twin_id is not None:
        messages.info(request, "This ablation already has a twin run.")
        return redirect("diagnostics-overlay", run_id=ablation.run_id, other_id=ablation.twin_id)
    launch = services.launch_twin(ablation, request.user)
    (messages.success if launch.enqueued else messages.warning)(request, launch.message)
    return redirect("diagnostics-overlay", run_id=ablation.run_id, other_id=launch.twin.id)


@require_safe
def overlay(request: HttpRequest, run_id: int, other_id: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    other = get_run_for(request, other_id)
    series = services.overlay_series([run, other])
    twin = run.id in (
        other.config.get("ablation_of"),
        other.config.get("replay_of"),
    )  # ablation or replay twin
    for s, label in zip(series, ("original", "twin" if twin else "other"), strict=True):
        s["label"] = f"{label}: {s['run'].name}"
    return render(
        request,
        "diagnostics/overlay.html",
        {
            "run": run,
            "other": other,
            "figures": charts.overlay_figures(
                [{k: v for k, v in s.items() if k != "run"} for s in series]
            ),
            "has_steps": any(s["steps"] for s in series),
            "weights": weights_differ([run, other]),
        },
    )
