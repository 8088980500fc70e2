"""PRIME-RL rollouts: the episode files its orchestrator's FileMonitor writes under
`<run_dir>/rollouts/step_N/<train|eval>/<all|effective>/traces.jsonl`. Give the run folder, its
`rollouts/` folder, a step folder or one file; the run's resolved orchestrator config is read
when it is there.

Episodes are read with importers/episodes.py; what the `all` and `effective` files hold, which
steps and advantages are exact and which are flagged: docs/integrations.md, "Module notes".
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from .base import (
    BadRecord,
    GroupingJsonlReader,
    GroupItem,
    Item,
    Progress,
    ReaderError,
    RecordError,
    RolloutRow,
    completion_fields,
    fill_advantages,
    group_key,
    group_record,
    int_field,
    jsonl_lines,
    number_field,
    parse_json_object,
    prompt_value,
    split_numbers,
)
from .episodes import (
    TOKENS_DROPPED,
    TOKENS_GAP,
    attach_tokens,
    episode_rollout,
    first_trace,
    has_sampled_tokens,
    record_key,
    task_prompt,
    token_advantage,
    trace_rewards,
    trace_weights,
)

LEGACY_KNOWN = (
    "step",
    "problem_id",
    "example_id",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "rewards",
    "task_rewards",
)
_STEP_DIR = re.compile(r"^step_(\d+)$")
SUBSETS = ("all", "effective")
KINDS = ("train", "eval")
MATCH = 1e-5  # |recorded - (reward - mean)| under which PRIME-RL's advantage is GRPO's (float32)
MAX_LISTED = 20


@dataclass
class _Loc:
    """Where one episode record is: file index, byte offset, line, the step folder."""

    file: int
    offset: int
    line: int
    step: int


@dataclass
class _Group:
    kind: str
    key: str
    env: str
    order: int
    all: dict[str, _Loc] = field(default_factory=dict)  # episode id -> its `all` record
    effective: dict[str, list[_Loc]] = field(default_factory=dict)  # episode id -> shipped


@dataclass
class SpreadGroupItem(GroupItem):
    """A group whose rollouts come from several files (PRIME-RL's `all` and `effective`)."""

    rollout_files: list[str] | None = None

    def where(self, rollout: int | None = None) -> str:
        if rollout is not None and self.rollout_files and 0 <= rollout < len(self.rollout_files):
            return f"{self.rollout_files[rollout]}:{self.rollout_lines[rollout]}"  # type: ignore[index]
        return super().where(rollout)


@dataclass
class PrimeRLReader(GroupingJsonlReader):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.format = "prime-rl"
        self.grouping = (
            "PRIME-RL group.id across the whole import (all + effective); step: the step that "
            "trained the group, else the batch window in which it finished"
        )
        self.advantage = (
            "the advantage each trained trace shipped with (effective files); for the untrained "
            "scored traces, GRPO's reward minus the group mean of the scored traces"
        )
        self.duplicates: list[str] = []
        self.gaps: list[str] = []
        self.counts: dict[str, int] = {}
        self._weights: dict[str, float] = {}
        self._config: dict[str, Any] | None = None
        self._config_path: Path | None = None
        self._episodes_mode: bool | None = None

    # ---- files and settings

    def files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        found = sorted(self.path.rglob("traces.jsonl"), key=_path_key)
        return found or super().files()  # a folder of flat *.jsonl records

    def settings(self) -> dict[str, Any] | None:
        """The reward weights every trace states, read from the first records; PRIME-RL's GRPO
        credit (reward minus group mean: scale_rewards none); the group size and the algorithm
        from the run's configs/orchestrator.json when it is there."""
        for path in self.files()[:20]:
            for n, (_, _, raw) in enumerate(jsonl_lines(path)):
                if n >= 200:
                    break
                with contextlib.suppress(RecordError):
                    obj = parse_json_object(raw)
                    if "traces" in obj:
                        trace_weights(first_trace(obj), self._weights)
        own = super().settings() or {}
        found: dict[str, Any] = {}
        if self._weights:
            found = {"weights": dict(self._weights), "scale_rewards": "none"}
        cfg = self.orchestrator_config()
        if cfg is not None:
            sizes = {s for (kind, _), s in cfg["group_size"].items() if kind == "train"}
            if len(sizes) == 1:
                found["group_size"] = sizes.pop()
            found["trainer"] = {k: v for k, v in cfg["trainer"].items() if v is not None}
            found.setdefault("scale_rewards", "none")
        return {**found, **own} or None

    def orchestrator_config(self) -> dict[str, Any] | None:
        """What this reader uses of `<run_dir>/configs/orchestrator.json` (written by the rl
        entrypoint's write_subconfigs): group sizes by (kind, env name), each train env's
        algorithm, filter_zero_advantages. None when no such file is above the path."""
        if self._config is not None or self._config_path is not None:
            return self._config
        for folder in [self.path, *self.path.parents][:6]:
            candidate = folder / "configs" / "orchestrator.json"
            if candidate.is_file():
                self._config_path = candidate
                break
        else:
            self._config_path = Path()
            return None
        try:
            raw = json.loads(self._config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ReaderError(f"{self._config_path}: not readable as JSON ({e})") from None
        self._config = _read_config(raw if isinstance(raw, dict) else {})
        return self._config

    def notes(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().notes())
        if self.gaps:
            out["gaps"] = list(self.gaps)
        if self.counts:
            out["counts"] = dict(self.counts)
        if self._config_path and self._config_path != Path():
            out["config"] = str(self._config_path)
        return out

    def sample_components(self, limit: int = 200) -> list[str]:
        if not self._is_episodes():
            return super().sample_components(limit)
        names: dict[str, None] = {}
        seen = 0
        for path in self.files():
            for _, _, raw in jsonl_lines(path):
                with contextlib.suppress(RecordError):
                    trace = first_trace(parse_json_object(raw))
                    if trace is not None:
                        names.update(dict.fromkeys(trace_rewards(trace)[0]))
                seen += 1
                if seen >= limit:
                    return list(names)
        return list(names)

    # ---- reading

    def read(self, progress: Progress | None = None) -> Iterator[Item]:
        if not self._is_episodes():
            yield from super().read(progress)
            return
        files = self.files()
        self.gaps, self.counts, self.duplicates = [], {}, []  # what this read found
        groups: dict[tuple[str, str], _Group] = {}
        yield from self._index(files, groups, progress)
        yield from self._emit(files, groups)

    def _is_episodes(self) -> bool:
        if self._episodes_mode is None:
            self._episodes_mode = False
            for path in self.files()[:1]:
                if path.name == "traces.jsonl":
                    self._episodes_mode = True
                for _, _, raw in jsonl_lines(path):
                    with contextlib.suppress(RecordError):
                        self._episodes_mode = "traces" in parse_json_object(raw)
                    break
        return self._episodes_mode

    def _index(
        self,
        files: list[Path],
        groups: dict[tuple[str, str], _Group],
        progress: Progress | None,
    ) -> Iterator[Item]:
        """First pass: where every episode is, by group; bad lines reported as they come."""
        self._subsets: dict[str, set[str]] = {k: set() for k in KINDS}
        for fi, path in enumerate(files):
            folder_step, folder_kind, subset = _folder_facts(path)
            for lineno, offset, raw in jsonl_lines(path, progress):
                try:
                    obj = parse_json_object(raw)
                    key = record_key(obj)
                    kind = folder_kind or _record_kind(obj)
                    step = folder_step if folder_step is not None else _work_step(obj)
                except RecordError as e:
                    yield BadRecord(str(path), lineno, str(e))
                    continue
                self._subsets[kind].add(subset or "all")
                eid = obj.get("id") if isinstance(obj.get("id"), str) else f"{fi}:{lineno}"
                env = obj.get("env") if isinstance(obj.get("env"), dict) else {}
                g = groups.get((kind, key))
                if g is None:
                    g = _Group(kind, key, str(env.get("name") or env.get("id") or ""), len(groups))
                    groups[(kind, key)] = g
                loc = _Loc(fi, offset, lineno, step)
                if subset == "effective" or (subset is None and _carries_advantages(obj)):
                    g.effective.setdefault(eid, []).append(loc)  # shipped: scored and trained
                if subset == "effective":
                    continue
                if eid in g.all:
                    self.duplicates.append(f"{path}:{lineno} (episode {eid} again)")
                else:
                    g.all[eid] = loc

    def _emit(self, files: list[Path], groups: dict[tuple[str, str], _Group]) -> Iterator[Item]:
        """Second pass: each complete group, built from its records, in step order."""
        self._note_subsets()
        expected = self._expected_sizes(groups)
        plan: list[tuple[int, int, _Group, list[str]]] = []
        incomplete = [0, 0]
        for g in groups.values():
            ids = self._members(g)
            want = expected.get((g.kind, g.env))
            if want is not None and "all" in self._subsets[g.kind] and len(ids) < want:
                incomplete[0] += 1
                incomplete[1] += len(ids)
                continue
            if want is not None and len(ids) > want:
                self._count("groups larger than the group size")
            plan.append((_group_step(g, ids), g.order, g, ids))
        if incomplete[0]:
            self._gap(
                f"{incomplete[0]} groups ({incomplete[1]} episodes) not stored: fewer episodes "
                "than the group size in the files given (the rest are in step folders not given, "
                "were cancelled, or had not arrived); import the steps around them together"
            )
            self.counts["incomplete_groups_not_stored"] = incomplete[0]
        plan.sort(key=lambda p: (p[0], p[1]))
        handles: dict[int, BinaryIO] = {}
        try:
            for step, _, g, ids in plan:
                yield self._group_item(files, handles, g, ids, step)
        finally:
            for f in handles.values():
                f.close()
        self._note_counts()

    def _members(self, g: _Group) -> list[str]:
        if "all" not in self._subsets[g.kind]:
            return list(g.effective)
        extra = [e for e in g.effective if e not in g.all]
        if extra:
            self._count("episodes found only in effective files", len(extra))
        return [*g.all, *extra]

    def _group_item(
        self,
        files: list[Path],
        handles: dict[int, BinaryIO],
        g: _Group,
        ids: list[str],
        step: int,
    ) -> Item:
        built: list[tuple[_Loc, dict[str, Any]]] = []
        loc = _first_loc(g, ids[0])
        try:
            for eid in ids:
                trained = g.effective.get(eid, [])
                loc = g.all.get(eid) or trained[0]
                obj = _read_at(files, handles, loc)
                shipped = [_read_at(files, handles, t) for t in trained]
                built.append((loc, self._episode(g.kind, obj, g.all.get(eid), trained, shipped)))
            record = self._group_record(g, step, [b for _, b in built])
        except RecordError as e:
            return BadRecord(
                str(files[loc.file]),
                loc.line,
                f"{e} (group {g.key!r} of step {step}: its {len(ids)} episodes are not stored)",
                records=len(ids),
            )
        locs = [loc for loc, _ in built]
        return SpreadGroupItem(
            record,
            str(files[locs[0].file]),
            locs[0].line,
            [loc.line for loc in locs],
            rollout_files=[str(files[loc.file]) for loc in locs],
        )

    def _episode(
        self,
        kind: str,
        obj: dict[str, Any],
        arrived: _Loc | None,
        trained: list[_Loc],
        shipped_objs: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """One episode: its rollout, whether PRIME-RL scored it, the scores of every scored trace
        (the GRPO mean covers all of them), and the advantage it shipped with (the effective
        copy of the same trace, by trace id)."""
        trace = first_trace(obj)
        prompt, rollout = episode_rollout(obj, trace)
        scored = [
            t
            for t in obj.get("traces") or []
            if isinstance(t, dict) and _scored(t, train=kind == "train")
        ]
        state = rollout["state"]
        if arrived is not None and kind == "train":
            state["arrived_step"] = arrived.step
        work = (obj.get("run") or {}).get("work") if isinstance(obj.get("run"), dict) else None
        if isinstance(work, dict) and "step" in work:
            state["dispatch_step"] = work["step"]
        is_scored = trace is not None and any(t is trace for t in scored)
        if not is_scored:
            if any(v is not None for v in rollout["rewards"].values()):
                state["rewards_not_scored"] = rollout["rewards"]
            rollout["rewards"], rollout["reward"] = {}, None
        elif rollout["reward"] is None:
            rollout["reward"] = 0.0  # verifiers' Trace.reward: the sum over no scored rewards
        shipped, steps = None, []
        for loc, copy in zip(trained, shipped_objs, strict=True):
            same = _same_trace(copy, trace)
            if same is not None:
                steps.append(loc.step)
                if shipped is None:
                    shipped = token_advantage(same)
                    attach_tokens(rollout, same)  # the shipped copy adds per-token advantages
        if kind == "train":
            state["trained"] = bool(steps)
            if steps:
                state["trained_step"] = min(steps)
        return {
            "prompt": prompt,
            "obj_task": obj,
            "rollout": rollout,
            "scored": is_scored,
            "scores": [trace_rewards(t)[1] or 0.0 for t in scored],
            "shipped": shipped,
            "trained_steps": sorted(set(steps)),
            "kind": kind,
        }

    def _group_record(self, g: _Group, step: int, eps: list[dict[str, Any]]) -> dict[str, Any]:
        scores = [s for e in eps for s in e["scores"]]
        mean = sum(scores) / len(scores) if scores else 0.0
        checked = [e for e in eps if e["shipped"] is not None and e["scored"]]
        grpo = all(abs(e["shipped"] - (e["rollout"]["reward"] - mean)) <= MATCH for e in checked)
        if not grpo:
            self._count("groups whose shipped advantages are not reward - group mean")
        rollouts = []
        for i, e in enumerate(eps):
            r = {"index": i, **e["rollout"]}
            self._tally(e, r)
            if e["shipped"] is not None:
                r["advantage"] = e["shipped"]
            elif not e["scored"]:
                r["advantage"] = 0.0  # PRIME-RL assigned nothing and trained nothing on it
            elif g.kind == "train" and not grpo:
                r["advantage"] = 0.0
                self._count("untrained rollouts whose advantage is unknown (stored 0)")
            else:
                r["advantage"] = r["reward"] - mean
                if g.kind == "train" and not checked and not self._grpo_known(g.env):
                    self._count("untrained rollouts with GRPO credit assumed")
            if len(e["trained_steps"]) > 1:
                r["state"]["trained_steps"] = e["trained_steps"]
            rollouts.append(r)
        if len({s for e in eps for s in e["trained_steps"]}) > 1:
            self._count("groups trained across two or more steps")
        prompt = next((e["prompt"] for e in eps if e["prompt"] is not None), None)
        if prompt is None:
            prompt = task_prompt(eps[0]["obj_task"])
        split = "holdout" if g.kind == "eval" else "train"
        return group_record(step, g.key, prompt, rollouts, split)

    # ---- gaps and counts

    def _tally(self, e: dict[str, Any], r: dict[str, Any]) -> None:
        if r["state"].get("no_trace"):
            self._count("episodes without a trace (stored: empty completion, no reward)")
        elif not e["scored"]:
            self._count("traces PRIME-RL did not score (error or no sampled tokens): no reward")
        if e["kind"] == "train" and e["scored"] and e["shipped"] is None:
            self._count("scored train rollouts not trained (advantage: reward - group mean)")
        if r["state"].get("tokens_not_stored"):
            self._count(TOKENS_DROPPED)
            self._gap(TOKENS_GAP)

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def _gap(self, text: str) -> None:
        if text not in self.gaps:
            self.gaps.append(text)

    def _grpo_known(self, env: str) -> bool:
        cfg = self.orchestrator_config()
        return cfg is not None and cfg["grpo"].get(env, False)

    def _expected_sizes(self, groups: dict[tuple[str, str], _Group]) -> dict[tuple[str, str], int]:
        cfg = self.orchestrator_config()
        known = dict(cfg["group_size"]) if cfg is not None else {}
        inferred: dict[tuple[str, str], int] = {}
        for g in groups.values():
            k = (g.kind, g.env)
            if k in known:
                continue
            n = len(g.all) if "all" in self._subsets[g.kind] else len(g.effective)
            inferred[k] = max(inferred.get(k, 0), n)
        if self.group_size is not None:
            inferred = dict.fromkeys(inferred, self.group_size)
        elif inferred and any(k[0] == "train" for k in inferred):
            sizes = ", ".join(f"{k[0]}/{k[1] or '?'}: {n}" for k, n in sorted(inferred.items()))
            self._gap(
                "group size not in the files (no configs/orchestrator.json above the path, no "
                f"--group-size): taken as the largest group seen ({sizes}); a smaller group is "
                "treated as incomplete"
            )
        return {**inferred, **known}

    def _note_subsets(self) -> None:
        have = self._subsets["train"]
        if have == {"effective"}:
            self._gap(
                "train: only `effective` files were given: the episodes PRIME-RL did not ship "
                "(with filter_zero_advantages, every zero-std group and the zero-advantage members "
                "of the others) are missing, so group sizes, std and the zero-std fraction are "
                "those of the trained subset; import the `all` files with them"
            )
        elif have == {"all"}:
            self._gap(
                "train: no `effective` files were given: no advantage was read (reward - group "
                "mean is computed), and each group's step is the batch window in which it "
                "finished, not the step that trained it"
            )
        if have and self.orchestrator_config() is None:
            self._gap(
                "no configs/orchestrator.json above the path: the algorithm and "
                "filter_zero_advantages are not known; untrained rollouts of a group with no "
                "trained member are given GRPO's reward - group mean"
            )

    def _note_counts(self) -> None:
        unknown = self.counts.get("untrained rollouts whose advantage is unknown (stored 0)", 0)
        if unknown:
            self._gap(
                f"{unknown} untrained rollouts in groups whose shipped advantages are not reward - "
                "group mean (a length penalty or another algorithm): their advantage cannot be "
                "known from the files and is stored as 0"
            )
        assumed = self.counts.get("untrained rollouts with GRPO credit assumed", 0)
        if assumed:
            self._gap(
                f"{assumed} untrained rollouts in groups with no trained member: advantage "
                "reward - group mean assumes PRIME-RL's default GRPO (no length penalty)"
            )

    # ---- the flat records of earlier versions

    def parse_row(self, obj: dict[str, Any]) -> RolloutRow:
        step = int_field(obj, "step", default=0)
        ex = obj.get("problem_id", obj.get("example_id"))
        if ex is None or isinstance(ex, (dict, list, bool)) or ex == "":
            raise RecordError("problem_id: is required (or example_id), a string or integer")
        key = group_key("ex-", ex)
        self._known_group = (step, key)
        prompt = prompt_value(obj.get("prompt"), "prompt")
        if "completion" not in obj:
            raise RecordError("completion: is required")
        rollout: dict[str, Any] = completion_fields(obj["completion"], "completion")
        if "reward" not in obj:
            raise RecordError("reward: is required (the aggregate reward, or null)")
        rollout["reward"] = number_field(obj, "reward", required=False)
        if obj.get("advantage") is not None:
            rollout["advantage"] = number_field(obj, "advantage")
        breakdown = obj.get("rewards", obj.get("task_rewards")) or {}
        if not isinstance(breakdown, dict):
            raise RecordError("rewards: must be an object of name -> number")
        rewards, rest = split_numbers(breakdown, self.components)
        rollout["rewards"] = rewards
        state = {k: v for k, v in obj.items() if k not in LEGACY_KNOWN}
        if rest:
            state["rewards_extra"] = rest
        if state:
            rollout["state"] = state
        return RolloutRow(step=step, key=key, prompt=prompt, rollout=rollout)

    def _fill(self, rollouts: list[dict[str, Any]]) -> None:
        fill_advantages(rollouts, scale=True)  # flat records: TRL's scaled advantage


# ------------------------------------------------------------------------------------------ helpers


def _scored(trace: dict[str, Any], *, train: bool) -> bool:
    """PRIME-RL's survivors (iter_trainable_traces): clean, of a trainable agent, with sampled
    tokens. An eval's scored traces are its clean ones."""
    if trace.get("ok") is not True:
        return False
    if not train:
        return True
    return (trace.get("agent") or {}).get("trainable", True) is not False and has_sampled_tokens(
        trace
    )


def _group_step(g: _Group, ids: list[str]) -> int:
    trained = [loc.step for e in ids for loc in g.effective.get(e, [])]
    if trained:
        return min(trained)
    return max(g.all[e].step for e in ids if e in g.all)


def _first_loc(g: _Group, eid: str) -> _Loc:
    return g.all.get(eid) or g.effective[eid][0]


def _same_trace(copy: dict[str, Any], trace: dict[str, Any] | None) -> dict[str, Any] | None:
    """The trace of an effective copy that is `trace` (same id); its first trace when the ids
    are absent."""
    if trace is None:
        return None
    traces = [t for t in copy.get("traces") or [] if isinstance(t, dict)]
    if trace.get("id") is None:
        return traces[0] if traces else None
    return next((t for t in traces if t.get("id") == trace.get("id")), None)


def _read_at(files: list[Path], handles: dict[int, BinaryIO], loc: _Loc) -> dict[str, Any]:
    f = handles.get(loc.file)
    if f is None:
        f = handles[loc.file] = open(files[loc.file], "rb")  # noqa: SIM115 (closed by _emit)
    f.seek(loc.offset)
    return parse_json_object(f.readline())


def _carries_advantages(obj: dict[str, Any]) -> bool:
    return any(
        isinstance(t, dict) and token_advantage(t) is not None for t in obj.get("traces") or []
    )


def _record_kind(obj: dict[str, Any]) -> str:
    run = obj.get("run") if isinstance(obj.get("run"), dict) else {}
    work = run.get("work") if isinstance(run.get("work"), dict) else {}
    return "eval" if work.get("type") == "eval" or run.get("type") == "eval" else "train"


def _work_step(obj: dict[str, Any]) -> int:
    run = obj.get("run") if isinstance(obj.get("run"), dict) else {}
    work = run.get("work") if isinstance(run.get("work"), dict) else {}
    return int_field(work, "step") if "step" in work else 0


def _folder_facts(path: Path) -> tuple[int | None, str | None, str | None]:
    """(step, kind, subset) from .../step_N/<train|eval>/<all|effective>/traces.jsonl. A file
    elsewhere (subset None) is read as an `all` file of the kind its records say, at their
    dispatch step; its records that carry token advantages were shipped (PRIME-RL writes `all`
    before scoring, so only a shipped copy has them)."""
    step = None
    for part in path.parts:
        m = _STEP_DIR.match(part)
        if m:
            step = int(m.group(1))
    subset = path.parent.name if path.parent.name in SUBSETS else None
    kind_dir = path.parent.parent.name if path.parent.name in SUBSETS else path.parent.name
    return step, (kind_dir if kind_dir in KINDS else None), subset


def _read_config(raw: dict[str, Any]) -> dict[str, Any]:
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    top_algo = raw.get("algo") if isinstance(raw.get("algo"), dict) else {}
    sizes: dict[tuple[str, str], int] = {}
    grpo: dict[str, bool] = {}
    algos: set[str] = set()
    for kind, section in (("train", train), ("eval", raw.get("eval") or {})):
        for src in section.get("source") or [] if isinstance(section, dict) else []:
            if not isinstance(src, dict):
                continue
            name = src.get("name") or _env_id(src.get("env"))
            if isinstance(src.get("group_size"), int):
                sizes[(kind, name)] = src["group_size"]
            if kind == "train":
                algo = src.get("algo") if isinstance(src.get("algo"), dict) else top_algo
                algos.add(str(algo.get("type", "grpo")))
                grpo[name] = algo.get("type", "grpo") == "grpo" and not algo.get("length_penalty")
    return {
        "group_size": sizes,
        "grpo": grpo,
        "trainer": {
            "algo": ",".join(sorted(algos)) or None,
            "filter_zero_advantages": train.get("filter_zero_advantages"),
            "batch_size": raw.get("batch_size"),
            "max_off_policy_steps": raw.get("max_off_policy_steps"),
        },
    }


def _env_id(env: Any) -> str:
    """verifiers EnvConfig.env_id: the taskset id, prefixed by the paired env id."""
    if not isinstance(env, dict):
        return ""
    taskset = env.get("taskset") if isinstance(env.get("taskset"), dict) else {}
    tid, eid = taskset.get("id") or "", env.get("id") or ""
    return f"{eid}+{tid}" if tid and eid else tid or eid


def _path_key(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(p)))


__all__ = ["PrimeRLReader", "ReaderError", "SpreadGroupItem"]
