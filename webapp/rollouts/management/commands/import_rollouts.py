"""`manage.py import_rollouts FILE --run NAME --format jsonl|trl|verl|prime-rl|byoo|verifiers|art`.

Streams a dump through a format reader (training/importers) into `ingest_groups`, in batches of
complete groups. An unreadable record is reported with its file and line; `--on-error skip` goes
on without it, `--on-error stop` keeps what was stored, fails the run and exits non-zero.
Running the same import again resumes it or does nothing (ingestion is idempotent). Details:
docs/recording.md, "Module notes".
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from training.importers import (
    READERS,
    BadRecord,
    GroupItem,
    MetricsItem,
    Reader,
    ReaderError,
    SettingsItem,
    SkippedGroup,
    open_reader,
)
from webapp.errors import FieldError
from webapp.rollouts.ingest import ingest_groups
from webapp.rollouts.services import (
    RunNameConflict,
    ensure_environment,
    get_or_create_run,
    validate_environment_spec,
)
from webapp.runs import reward_settings
from webapp.runs.metrics import record_metrics
from webapp.runs.models import Run

_ERROR_AT = re.compile(r"^(groups|metrics)\[(\d+)\](?:\.rollouts\[(\d+)\])?")
MAX_REPORTED = 100  # errors kept in run.summary; all of them go to stderr


class ImportStopped(Exception):
    """--on-error stop met a bad record; everything read before it is stored."""


@dataclass
class ImportStats:
    groups: int = 0
    rollouts: int = 0
    already_stored: int = 0
    skipped_records: int = 0
    errors: list[str] = field(default_factory=list)
    settings_changed: list[str] = field(
        default_factory=list
    )  # what the trainer's settings replaced
    left_out: list[str] = field(default_factory=list)  # groups left out on purpose, with why
    left_out_records: int = 0

    def line(self) -> str:
        left = f", {self.left_out_records} left out (grouping unknown)" if self.left_out else ""
        return (
            f"imported {self.groups} groups, {self.rollouts} rollouts ({self.skipped_records} "
            f"skipped records{left})"
        )


class Importer:
    """Feeds a reader's items to the ingestion service for one run. Usable outside the command (a
    worker task importing an uploaded file calls the same `run()`)."""

    def __init__(
        self,
        run: Run,
        reader: Reader,
        *,
        on_error: str = "stop",
        batch_groups: int = 200,
        grow_components: bool = True,
        report: Any = None,
    ) -> None:
        self.run = run
        self.reader = reader
        self.on_error = on_error
        self.batch_groups = batch_groups
        self.grow_components = grow_components  # False when the user fixed the components
        self.report = report or (lambda line: None)
        self.stats = ImportStats()
        self._known = {c.name for c in run.components()}

    def run_import(self, progress: Any = None) -> ImportStats:
        groups: list[GroupItem] = []
        metrics: list[MetricsItem] = []
        known = (
            self.reader.settings()
        )  # the trainer's settings found beside the dump, or given by the user
        if known:
            where = getattr(self.reader, "settings_file", None) or "--weights/--group-size"
            self._settings(SettingsItem(known, str(where), None))
        for item in self.reader.read(progress):
            if isinstance(item, BadRecord):
                self._bad(item.where(), item.message, item.records)
                if self.on_error == "stop":
                    self._flush(groups, metrics)
                    raise ImportStopped(f"{item.where()}: {item.message}")
            elif isinstance(item, SkippedGroup):  # not an error: --on-error stop goes on
                self.stats.left_out_records += item.records
                if len(self.stats.left_out) < MAX_REPORTED:
                    self.stats.left_out.append(f"{item.where()}: {item.message}")
                self.report(f"{item.where()}: {item.message}")
            elif isinstance(item, MetricsItem):
                metrics.append(item)
            elif isinstance(item, SettingsItem):
                self._flush(
                    groups, metrics
                )  # settings apply from here on: store what came before first
                groups, metrics = [], []
                self._settings(item)
            else:
                groups.append(item)
            if len(groups) >= self.batch_groups or len(metrics) >= self.batch_groups:
                self._flush(groups, metrics)
                groups, metrics = [], []
        self._flush(groups, metrics)
        return self.stats

    # ---- batches

    def _flush(self, groups: list[GroupItem], metrics: list[MetricsItem]) -> None:
        if groups:
            self._add_components(groups)
            self._ingest(groups)
        if metrics:
            self._metrics(metrics)

    def _ingest(self, batch: list[GroupItem]) -> None:
        while batch:
            try:
                result = ingest_groups(self.run, {"groups": [item.record for item in batch]})
            except FieldError as e:
                bad = self._attribute(e, "groups", batch)
                first = min(bad)
                if self.on_error == "stop":
                    if first:
                        self._ingest(batch[:first])  # every group before the first bad one is valid
                    raise ImportStopped(self._describe(batch[first], bad[first])) from None
                batch = [item for i, item in enumerate(batch) if i not in bad]
                continue
            self.stats.groups += result.groups
            self.stats.rollouts += result.rollouts
            self.stats.already_stored += result.skipped_groups
            return

    def _metrics(self, batch: list[MetricsItem]) -> None:
        while batch:
            try:
                record_metrics(self.run, {"metrics": [item.record for item in batch]})
                return
            except FieldError as e:
                bad = self._attribute(e, "metrics", batch)
                if self.on_error == "stop":
                    first = min(bad)
                    raise ImportStopped(self._describe(batch[first], bad[first])) from None
                batch = [item for i, item in enumerate(batch) if i not in bad]

    def _settings(self, item: SettingsItem) -> None:
        """The trainer's reward settings (the JSONL sink's header) become the run's: they win over
        what the run was created with, and the run's log says what they replaced."""
        weights = item.record.get("weights")
        if self.grow_components and isinstance(weights, dict) and self.run.environment_id:
            new = [str(n) for n in weights if n not in self._known and _valid_component(str(n))]
            if new:  # reward functions that have not scored a group yet are components all the same
                ensure_environment(self.run.environment.name, [_component(n) for n in new])
                self._known.update(new)
        try:
            clean = reward_settings.validate(item.record, sorted(self._known), path="settings")
        except FieldError as e:
            self._bad(item.where(), f"{e.field}: {e.message}", 1)
            if self.on_error == "stop":
                raise ImportStopped(f"{item.where()}: {e.field}: {e.message}") from None
            return
        self.stats.settings_changed += reward_settings.apply(
            self.run, clean, clean.get("source") or "import"
        )

    def _attribute(
        self, e: FieldError, kind: str, batch: list[Any]
    ) -> dict[int, list[tuple[int | None, str]]]:
        """Map the service's field paths (groups[3].rollouts[2].rewards.x) back to batch items,
        report each with its file and line, and count what is skipped."""
        bad: dict[int, list[tuple[int | None, str]]] = {}
        for err in e.errors:
            m = _ERROR_AT.match(err["field"])
            if not m or m.group(1) != kind or int(m.group(2)) >= len(batch):
                raise CommandError(f"ingestion refused the batch: {err['field']}: {err['error']}")
            i = int(m.group(2))
            rollout = int(m.group(3)) if m.group(3) is not None else None
            rest = err["field"][m.end() :].lstrip(".")
            bad.setdefault(i, []).append((rollout, f"{rest + ': ' if rest else ''}{err['error']}"))
        for i, errs in sorted(bad.items()):
            item = batch[i]
            for rollout, message in errs:
                where = (
                    item.where(rollout)
                    if isinstance(item, GroupItem)
                    else f"{item.file}:{item.line}"
                )
                self._bad(where, message, 0)
            self.stats.skipped_records += item.records if isinstance(item, GroupItem) else 1
        return bad

    def _describe(self, item: GroupItem | MetricsItem, errs: list[tuple[int | None, str]]) -> str:
        rollout, message = errs[0]
        where = item.where(rollout) if isinstance(item, GroupItem) else f"{item.file}:{item.line}"
        return f"{where}: {message}"

    def _bad(self, where: str, message: str, records: int) -> None:
        self.stats.skipped_records += records
        line = f"{where}: {message}"
        if len(self.stats.errors) < MAX_REPORTED:
            self.stats.errors.append(line)
        self.report(line)

    def _add_components(self, batch: list[GroupItem]) -> None:
        """Components first seen mid-file join the environment (when the user did not fix them)."""
        if not self.grow_components:
            return
        new: dict[str, None] = {}
        for item in batch:
            rollouts = item.record.get("rollouts")
            for r in (
                rollouts if isinstance(rollouts, list) else []
            ):  # a malformed one fails at its line
                rewards = r.get("rewards") if isinstance(r, dict) else None
                if isinstance(rewards, dict):
                    new.update((str(k), None) for k in rewards if k not in self._known)
        valid = [n for n in new if _valid_component(n)]  # the others fail at their line, as unknown
        if valid and self.run.environment_id:
            ensure_environment(self.run.environment.name, [_component(n) for n in valid])
            self._known.update(valid)


def _reason(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return f"{type(e).__name__}: {e}"[:2000]


def _valid_component(name: str) -> bool:
    try:
        validate_environment_spec({"name": "x", "components": [{"name": name}]})
        return True
    except FieldError:
        return False


def _component(name: str) -> dict[str, Any]:
    _, comps = validate_environment_spec({"name": "x", "components": [{"name": name}]})
    return comps[0]


def _positive(raw: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {raw!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {raw!r}")
    return v


def _names(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one component name, comma-separated")
    return names


def _weights(raw: str) -> dict[str, float]:
    """--weights correct=1,format=0.5 -> {"correct": 1.0, "format": 0.5}."""
    out = {}
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        name, eq, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = float("nan")
        if (
            not eq
            or not name.strip()
            or weight != weight
            or weight in (float("inf"), float("-inf"))
        ):
            raise argparse.ArgumentTypeError(f"expected name=number, comma-separated; got {part!r}")
        out[name.strip()] = weight
    if not out:
        raise argparse.ArgumentTypeError("give at least one name=weight")
    return out


class Command(BaseCommand):
    help = (
        "Import a rollout dump (our JSONL, TRL completion logs, verl, PRIME-RL, BYOO episodes, "
        "verifiers evaluations, ART trajectory groups) "
        "into a run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "file",
            help="the dump: a file, or a folder of them (TRL output_dir, verl rollout_data_dir)",
        )
        parser.add_argument(
            "--run", required=True, help="run name; created (kind import) when no run has it"
        )
        parser.add_argument("--format", required=True, choices=list(READERS))
        parser.add_argument(
            "--environment", help="environment of a new run (default: the run name)"
        )
        parser.add_argument(
            "--components",
            type=_names,
            help="comma-separated reward components (default: inferred from the first records)",
        )
        parser.add_argument(
            "--on-error",
            choices=("stop", "skip"),
            default="stop",
            help="a bad record stops the import (default) or is skipped with its group",
        )
        parser.add_argument(
            "--batch-groups", type=_positive, default=200, help="groups per transaction"
        )
        parser.add_argument(
            "--group-size",
            type=_positive,
            help="rollouts per group (num_generations, rollout.n); a prompt drawn k times in a "
            "step is split only where the file's layout says how (TRL), else left out and counted",
        )
        parser.add_argument(
            "--weights",
            type=_weights,
            help="the trainer's reward weights, name=w comma-separated (TRL: GRPOConfig's "
            "reward_weights; the recorder's reward_settings.json gives them; verl: checked "
            "against score, the rest kept as 'unexplained')",
        )
        parser.add_argument(
            "--scale-rewards",
            choices=("group", "batch", "none"),
            help="the trainer's advantage scaling (verl: none when norm_adv_by_std_in_grpo=False)",
        )
        parser.add_argument("--no-progress", action="store_true", help="no progress bar")

    def handle(self, *args: Any, **o: Any) -> None:
        try:
            reader = open_reader(
                o["format"],
                o["file"],
                components=o["components"],
                group_size=o["group_size"],
                weights=o["weights"],
                scale_rewards=o["scale_rewards"],
            )
            # A folder without files of the format fails here, before a run is created
            reader.files()
        except ReaderError as e:
            raise CommandError(str(e)) from None
        run = self._run(o, reader)
        importer = Importer(
            run,
            reader,
            on_error=o["on_error"],
            batch_groups=o["batch_groups"],
            grow_components=o["components"] is None,
            report=self._report,
        )
        bar = tqdm(
            total=reader.total_bytes(),
            unit="B",
            unit_scale=True,
            desc=f"import {o['format']}",
            disable=True if o["no_progress"] else None,
        )  # None: off when stderr is not a terminal
        stopped = None
        try:
            importer.run_import(bar.update)
        except ImportStopped as e:
            stopped = str(e)
        except BaseException as e:  # a crash or Ctrl-C must not leave a run "running" forever
            self._save(run, reader, importer.stats, o, _reason(e))
            raise
        finally:
            bar.close()
        self._save(run, reader, importer.stats, o, stopped)
        for line in importer.stats.settings_changed:
            self.stdout.write(f"the trainer's reward settings win: {line}")
        if importer.stats.already_stored:
            self.stdout.write(
                f"{importer.stats.already_stored} groups were already stored (not imported twice)"
            )
        for name, line in flag_lines(reader).items():
            self.stdout.write(f"{name}: {line}")
        self.stdout.write(importer.stats.line())
        for gap in reader.notes().get("gaps") or []:  # also in run.summary["import"]["gaps"]
            self.stdout.write(f"not known from the files: {gap}")
        if stopped:
            raise CommandError(f"stopped at the first bad record (--on-error stop): {stopped}")

    def _report(self, line: str) -> None:
        self.stderr.write(line)

    def _run(self, o: dict[str, Any], reader: Reader) -> Run:
        """The run named --run, created when no run has the name. Two imports naming one new run at
        once (two shells, two workers) end in the same run: get_or_create_run is atomic."""
        run = Run.objects.filter(name=o["run"]).select_related("environment").first()
        created = False
        if (
            run is None
        ):  # the common re-import skips sampling components and touching the environment
            names = o["components"] if o["components"] is not None else reader.sample_components()
            env_name = o["environment"] or o["run"]
            env = ensure_environment(
                env_name, self._spec(env_name, names, given=o["components"] is not None)
            )
            config = {
                "import": {
                    **reader.notes(),
                    "source": str(o["file"]),
                    "components": "given" if o["components"] else "inferred from the first records",
                }
            }
            run, created = self._get_or_create(
                name=o["run"], kind=Run.Kind.IMPORT, environment=env, config=config
            )
            if created:
                self.stdout.write(
                    f"created run {run.id} {run.name!r} "
                    f"(environment {env.name!r}: {', '.join(names) or 'none'})"
                )
                return run
        if Run.objects.filter(name=o["run"]).count() > 1:
            raise CommandError(
                f"--run: more than one run is named {o['run']!r}; rename one to import into it"
            )
        if run.environment_id is None:
            raise CommandError(
                f"--run: run {o['run']!r} has no environment, so it cannot hold reward scores"
            )
        if o["environment"] and run.environment.name != o["environment"]:
            raise CommandError(
                f"--environment: run {o['run']!r} already uses environment {run.environment.name!r}"
            )
        if o["components"]:
            ensure_environment(
                run.environment.name, self._spec(run.environment.name, o["components"])
            )
        if _created_by_import(run) and run.status == Run.Status.FAILED:
            resume(run)  # an import that stopped at a bad record goes on from where it stopped
        return run

    def _get_or_create(self, **fields: Any) -> tuple[Run, bool]:
        try:
            return get_or_create_run(**fields)
        except RunNameConflict as e:
            raise CommandError(f"--run: {e.message}") from None

    def _spec(self, env_name: str, names: list[str], given: bool = True) -> list[dict[str, Any]]:
        try:
            return validate_environment_spec(
                {"name": env_name, "components": [{"name": n} for n in names]}
            )[1]
        except FieldError as e:
            source = (
                "--components"
                if given
                else f"components found in the first records ({', '.join(names)})"
            )
            raise CommandError(f"{source}: {e.field}: {e.message}") from None

    def _save(
        self, run: Run, reader: Reader, stats: ImportStats, o: dict[str, Any], stopped: str | None
    ) -> None:
        if not run._refresh():
            return  # the run was deleted during the import: nothing left to record on
        summary = dict(run.summary or {})
        summary["import"] = {
            **reader.notes(),
            "source": str(o["file"]),
            "groups": stats.groups,
            "rollouts": stats.rollouts,
            "already_stored": stats.already_stored,
            "skipped_records": stats.skipped_records,
            "errors": stats.errors,
            "stopped": stopped,
            "duplicate_files": getattr(reader, "duplicates", []),
            "left_out_records": stats.left_out_records,
            "left_out": stats.left_out,
            "flags": dict(reader.flags),  # e.g. nul_cleaned, ungroupable_rows
        }
        Run.objects.filter(id=run.id).update(summary=summary)
        if not _created_by_import(run):
            return  # a job's or an API client's run: its own lifecycle decides when it ends
        if stopped:
            run.mark_failed(f"import stopped at a bad record: {stopped}\n{RESUMABLE}")
        else:
            run.mark_succeeded()


FLAG_TEXT = {
    "nul_cleaned": "{n} strings held a NUL or a lone surrogate, stored as U+FFFD (as the "
    "recorder stores them)",
    "ungroupable_rows": "{n} rows left out: a prompt drawn more than once in a step, whose groups "
    "the file cannot tell apart",
    "rows_beyond_weight_fit": "{n} rows are not explained by the weights: their rest is the "
    "component 'unexplained'",
    "assumed_weights_rows": "{n} aggregate rewards assume weight 1 for every reward function "
    "(the file has no weights: give --weights)",
}


def flag_lines(reader: Reader) -> dict[str, str]:
    """The reader's counts and weight note as the lines the command prints."""
    out = {"weights": reader.weights_note} if reader.weights_note else {}
    for name, n in reader.flags.items():
        out[name] = FLAG_TEXT.get(name, "{n}").format(n=n)
    return out


RESUMABLE = (
    "The groups read before it are stored. Fix or drop the record and run the same import again "
    "(stored groups are skipped), or re-run it with --on-error skip."
)


def _created_by_import(run: Run) -> bool:
    return run.kind == Run.Kind.IMPORT and "import" in (run.config or {})


def resume(run: Run) -> None:
    """A failed import run goes back to running for another import into it (its
    stored groups stay)."""
    Run.objects.filter(id=run.id, status=Run.Status.FAILED).update(
        status=Run.Status.RUNNING, error="", finished_at=None
    )
    run.refresh_from_db()
