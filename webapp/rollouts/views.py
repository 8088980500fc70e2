"""Rollout pages: explorer, group, no-signal groups, transcript. All read-only (viewer and up).

Everything a model wrote is rendered through auto-escaping templates; the diagram state is
re-rendered by our own Canvas from the completion and shown as an <img> (scripts in an SVG image
never run). The SVG stored in Rollout.state came from a client and is never echoed.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from typing import Any
from urllib.parse import urlencode

from django.apps import apps
from django.db.models import Exists, OuterRef, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_safe

from training.environments import get_environment
from training.environments.base import Prompt
from training.stats import ZERO_STD_ATOL
from webapp.accounts.roles import require_role
from webapp.errors import FieldError
from webapp.explorer.paging import decode_cursor, encode_cursor
from webapp.explorer.params import TOKEN_SORTS, ExplorerQuery
from webapp.explorer.query import UNSORTED, explore, sort_value
from webapp.rollouts.ingest_stats import run_weights
from webapp.rollouts.models import Group, GroupComponentStat, RewardComponent, RewardScore, Rollout
from webapp.rollouts.templatetags.rollout_tags import bar, preview, search_snippet
from webapp.runs.access import get_run_for
from webapp.runs.models import Run
from webapp.tokens import pages as token_pages
from webapp.tokens.services import has_tokens

NO_SIGNAL_PAGE = 50
FOLD_CHARS, FOLD_HEAD = (
    3000,
    1200,
)  # messages longer than FOLD_CHARS show FOLD_HEAD characters, then unfold


def _is_partial(request: HttpRequest) -> bool:
    # A history restore (back button after a cache miss) needs the whole page, not the fragment.
    return bool(request.headers.get("HX-Request")) and not request.headers.get(
        "HX-History-Restore-Request"
    )


def _labels() -> list[Any]:
    """Annotation labels, once the annotations app defines them (the explorer shows
    a select then)."""
    try:
        model = apps.get_model("annotations", "Label")
    except LookupError:
        return []
    return list(model.objects.all()[:200])


@require_safe
def explorer(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    components = run.components()
    error, page, q = None, None, ExplorerQuery()
    try:
        q = ExplorerQuery.from_params(request.GET, [c.name for c in components])
        page = explore(run, q, components)
    except FieldError as exc:
        error = exc
    qs = urlencode(q.params())
    ctx = {
        "run": run,
        "components": components,
        "q": q,
        "page": page,
        "error": error,
        "rows": _table_rows(page, components, q, qs) if page else [],
        "base_url": request.path,
        "qs": qs,
        "next_qs": urlencode(q.params(cursor=page.next_cursor))
        if page and page.next_cursor
        else "",
        "sort_links": _sort_links(q, components),
        # the Sort menu offers the token sorts where the run has tokens (or one is in use)
        "token_sorts": TOKEN_SORTS if q.sort in TOKEN_SORTS or has_tokens(run.id) else (),
        "token_sorted": q.sort in TOKEN_SORTS,  # a column shows the summary sorted by
        "sorted_component": next((c for c in components if c.name == q.sort), None),
        "labels": _labels(),
        "ranges": {c.name: q.ranges.get(c.name, (None, None)) for c in components},
    }
    template = "rollouts/_table.html" if _is_partial(request) else "rollouts/explorer.html"
    response = render(request, template, ctx, status=400 if error else 200)
    response["Vary"] = "HX-Request"  # the same URL answers a fragment or a page
    return response


def _table_rows(
    page: Any, components: list[RewardComponent], q: ExplorerQuery, qs: str
) -> list[dict[str, Any]]:
    """Rows with their links and bars prepared here: per-cell template lookups and URL reversals
    were most of the page's render time at 50 rows x K components."""
    transcript_url = reverse("rollouts-transcript", args=[0]).replace("/0/", "/{}/") + (
        "?" + qs if qs else ""
    )
    group_url = reverse("rollouts-group", args=[0]).replace("/0/", "/{}/")
    rows = []
    for row in page.rows:
        r = row.rollout
        rows.append(
            {
                "id": r.id,
                "step": r.step,
                "holdout": r.split == "holdout",
                "preview": _preview(r),
                "snippet": search_snippet(r, q.search),
                "turns": r.n_turns,
                "tool_calls": r.n_tool_calls,
                "reward": r.reward,
                "advantage": r.advantage,
                "length": r.length,
                "group_std": row.group_std,
                "zero_group": row.group_std is not None and row.group_std <= ZERO_STD_ATOL,
                "sort_value": "" if row.sort_value is None else row.sort_value,
                "href": transcript_url.format(r.id),
                "group_href": group_url.format(r.group_id),
                "bars": [(c.name == q.sort, bar(row.values.get(c.name), c)) for c in components],
            }
        )
    return rows


def _preview(r: Rollout) -> str:
    """Head … tail of the stored preview (plain text: the template escapes it)."""
    if r.preview_tail:
        head, tail = r.preview_head[:101].rsplit(" ", 1)[0], r.preview_tail[-101:].split(" ", 1)[-1]
        return f"{head} … {tail}"  # whole words; stored as one line already
    return preview(r.preview_head or r.completion)


def _sort_links(q: ExplorerQuery, components: list[RewardComponent]) -> dict[str, dict[str, str]]:
    """Per sortable column: the query string that sorts by it (toggling direction
    when already sorted)."""
    links = {}
    for name in ["reward", "advantage", "length", "step", *(c.name for c in components)]:
        order = ("asc" if q.order == "desc" else "desc") if q.sort == name else "desc"
        p = dataclasses.replace(q, sort=name, order=order, cursor=None).params()
        arrow = ("▼" if q.order == "desc" else "▲") if q.sort == name else ""
        links[name] = {"qs": urlencode(p), "arrow": arrow}
    return links


def _scores_by_rollout(rollout_ids: list[int]) -> dict[int, dict[int, RewardScore]]:
    out: dict[int, dict[int, RewardScore]] = {i: {} for i in rollout_ids}
    for s in RewardScore.objects.filter(rollout_id__in=rollout_ids):
        out[s.rollout_id][s.component_id] = s
    return out


def separating_component(
    best: dict[int, float | None],
    worst: dict[int, float | None],
    components: list[RewardComponent],
    weights: list[float],
) -> RewardComponent | None:
    """The component with the largest |weight x (best - worst)|: what tells the two apart."""
    top, top_gap = None, 0.0
    for comp, w in zip(components, weights, strict=True):
        b, x = best.get(comp.id), worst.get(comp.id)
        if b is None or x is None:
            continue
        gap = abs(w * (b - x))
        if gap > top_gap:
            top, top_gap = comp, gap
    return top


@require_safe
def group_view(request: HttpRequest, group_id: int) -> HttpResponse:
    require_role(request, "viewer")
    group = get_object_or_404(Group.objects.select_related("run", "run__environment"), id=group_id)
    components = group.run.components()
    rollouts = sorted(
        group.rollouts.only(*Rollout.LIST_FIELDS),
        key=lambda r: (r.reward is None, -(r.reward or 0.0), r.index),
    )
    scores = _scores_by_rollout([r.id for r in rollouts])
    values = {r.id: {cid: s.value for cid, s in scores[r.id].items()} for r in rollouts}
    stats = {s.component_id: s for s in GroupComponentStat.objects.filter(group=group)}
    best, worst = (rollouts[0], rollouts[-1]) if rollouts else (None, None)
    separator = None
    if best is not None and best.id != worst.id:
        separator = separating_component(
            values[best.id],
            values[worst.id],
            components,
            run_weights(group.run, components).tolist(),
        )
    cards = [
        {"rollout": r, "rank": i + 1, "scores": [(c, scores[r.id].get(c.id)) for c in components]}
        for i, r in enumerate(rollouts)
    ]
    ctx = {
        "group": group,
        "run": group.run,
        "components": components,
        "cards": cards,
        "separator": separator,
        "stats": [(c, stats.get(c.id)) for c in components],
        "best": best,
        "worst": worst,
    }
    return render(request, "rollouts/group.html", ctx)


def _no_signal_page(run: Run, cond: Q, limit: int) -> list[Group]:
    """Groups that produce no gradient, in (step, id) order: aggregate std 0 (incl. all unscorable),
    or every advantage 0 (a trainer that sent zeros although the rewards differ).

    Two index-backed queries merged here: one OR over "zero_std or no non-zero advantage" made
    Postgres probe every group of the run (1.2 s at 125k groups). A group whose advantages are
    all 0 has a rollout with advantage = 0, found on the (run, advantage, id) index, so only
    those are checked."""
    tied = Group.objects.filter(run=run, zero_std=True).filter(cond)
    nonzero_adv = Rollout.objects.filter(group_id=OuterRef("pk")).filter(
        Q(advantage__gt=0) | Q(advantage__lt=0)
    )
    zero_adv = (
        Group.objects.filter(run=run, zero_std=False)
        .filter(id__in=Rollout.objects.filter(run=run, advantage=0).values("group_id"))
        .filter(cond)
        .exclude(Exists(nonzero_adv))
    )
    groups = []
    for qs in (tied, zero_adv):
        groups += list(qs.order_by("step", "id").defer("prompt")[:limit])
    return sorted(groups, key=lambda g: (g.step, g.id))[:limit]


def no_signal_reason(group: Group) -> str:
    if group.all_unscorable:
        return "all unscorable"
    if group.zero_std:
        return "all equal"
    return "all advantages 0"


@require_safe
def no_signal(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    error = None
    try:
        step_min, step_max = _opt_int(request, "step_min"), _opt_int(request, "step_max")
        after = decode_cursor(request.GET["cursor"]) if request.GET.get("cursor") else None
    except FieldError as exc:
        error, step_min, step_max, after = exc, None, None, None
    cond = Q()
    if step_min is not None:
        cond &= Q(step__gte=step_min)
    if step_max is not None:
        cond &= Q(step__lte=step_max)
    if after is not None:
        cond &= Q(step__gt=after[0]) | Q(step=after[0], id__gt=after[1])
    groups = _no_signal_page(run, cond, NO_SIGNAL_PAGE + 1)
    more = len(groups) > NO_SIGNAL_PAGE
    groups = groups[:NO_SIGNAL_PAGE]
    components = run.components()
    stats: dict[int, dict[int, GroupComponentStat]] = {g.id: {} for g in groups}
    for s in GroupComponentStat.objects.filter(group_id__in=[g.id for g in groups]):
        stats[s.group_id][s.component_id] = s
    rows = [
        {
            "group": g,
            "reason": no_signal_reason(g),
            "stats": [(c, stats[g.id].get(c.id)) for c in components],
        }
        for g in groups
    ]
    keep = {k: v for k, v in (("step_min", step_min), ("step_max", step_max)) if v is not None}
    next_qs = (
        urlencode({**keep, "cursor": encode_cursor(groups[-1].step, groups[-1].id)}) if more else ""
    )
    ctx = {
        "run": run,
        "rows": rows,
        "components": components,
        "error": error,
        "next_qs": next_qs,
        "step_min": step_min,
        "step_max": step_max,
        "paged": after is not None,
    }
    return render(request, "rollouts/no_signal.html", ctx, status=400 if error else 200)


def _opt_int(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "")
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise FieldError(name, f"must be an integer, got {raw[:40]!r}") from None


@functools.lru_cache(maxsize=16)
def _environment(name: str) -> Any:
    return get_environment(name)  # KeyError for environments registered only through the API


def state_image(
    run: Run, group: Group, rollout: Rollout
) -> tuple[str | None, list[str], int | None]:
    """Re-render the environment state with OUR renderer: (data: URI of the SVG,
    canvas errors, shapes)."""
    if run.environment is None:
        return None, [], None
    try:
        env = _environment(run.environment.name)
    except KeyError:
        return None, [], None
    prompt = Prompt(key=group.key, text=group.prompt_text, split=group.split)
    state = env.state(prompt, rollout.transcript)
    svg = state.get("svg") if isinstance(state, dict) else None
    if not isinstance(svg, str):
        return None, [], None
    uri = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
    shapes = state.get("n_shapes")
    return (
        uri,
        [str(e) for e in state.get("errors", [])],
        shapes if isinstance(shapes, int) else None,
    )


def neighbours(
    run: Run, rollout: Rollout, params: Any, components: list[RewardComponent]
) -> tuple[int | None, int | None]:
    """(previous, next) rollout ids in the explorer order described by `params`."""
    try:
        q = ExplorerQuery.from_params(params, [c.name for c in components])
        value = sort_value(run, q, components, rollout)
    except FieldError:
        return None, None  # e.g. a replay that is not this run's: no listing to walk
    if value is UNSORTED:
        return None, None  # no value under that sort: not in that explorer listing
    cursor = encode_cursor(value, rollout.id)
    after = explore(run, dataclasses.replace(q, cursor=cursor, limit=1), components).rows
    # The keyset order is a total order, so the reversed direction from the same
    # cursor is "previous".
    flipped = "asc" if q.order == "desc" else "desc"
    before = explore(
        run, dataclasses.replace(q, cursor=cursor, order=flipped, limit=1), components
    ).rows
    return (before[0].rollout.id if before else None), (after[0].rollout.id if after else None)


def _messages(transcript: Any) -> list[dict[str, Any]]:
    """Normalise stored messages for the template (content as text, tool calls as
    name + arguments)."""
    out = []
    for m in transcript if isinstance(transcript, list) else []:
        if not isinstance(m, dict):
            continue
        calls = []
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            calls.append(
                {
                    "name": str(fn.get("name", "")) if isinstance(fn, dict) else "",
                    "arguments": fn.get("arguments", fn) if isinstance(fn, dict) else call,
                    "id": str(call.get("id", "")) if isinstance(call, dict) else "",
                }
            )
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        # A long message (a tool result of a whole file or log) shows its head; the rest unfolds.
        folded = len(content) > FOLD_CHARS
        out.append(
            {
                "role": str(m.get("role", "")),
                "content": content[:FOLD_HEAD] if folded else content,
                "rest": content[FOLD_HEAD:] if folded else "",
                "rest_chars": len(content) - FOLD_HEAD,
                "name": str(m.get("name") or m.get("tool_call_id") or ""),
                "tool_calls": calls,
            }
        )
    return out


@require_safe
def transcript(request: HttpRequest, rollout_id: int) -> HttpResponse:
    require_role(request, "viewer")
    rollout = get_object_or_404(
        Rollout.objects.select_related("group", "run", "run__environment").defer(
            "search_text", "search_words"
        ),
        id=rollout_id,
    )
    run, group = rollout.run, rollout.group
    components = run.components()
    scores = _scores_by_rollout([rollout.id])[rollout.id]
    svg_uri, canvas_errors, n_shapes = state_image(run, group, rollout)
    prev_id, next_id = neighbours(run, rollout, request.GET, components)
    chat = _messages(
        rollout.transcript
    )  # not "messages": base.html shows django.contrib.messages under that name
    ctx = {
        "rollout": rollout,
        "run": run,
        "group": group,
        "chat": chat,
        "show_prompt": not any(m["role"] in ("system", "user") for m in chat),
        "scores": [(c, scores.get(c.id)) for c in components],
        "svg_uri": svg_uri,
        "canvas_errors": canvas_errors,
        "n_shapes": n_shapes,
        "prev_id": prev_id,
        "next_id": next_id,
        "qs": request.GET.urlencode(),
        **token_pages.transcript_context(request, rollout),
    }
    return render(request, "rollouts/transcript.html", ctx)
