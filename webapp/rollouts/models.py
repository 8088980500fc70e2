"""Environments, reward components, groups, rollouts and their per-component scores.

Indexes are chosen for the explorer's access paths at millions of rows: "rollouts of run R sorted by
component C" is an index scan on RewardScore(run, component, value, rollout); "sorted by reward /
advantage / length" scans Rollout(run, <field>, id). Keyset pagination rides on the trailing id.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class Environment(models.Model):
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.name


class RewardComponent(models.Model):
    class Kind(models.TextChoices):
        OUTCOME = "outcome"
        PROCESS = "process"
        BEHAVIOURAL = "behavioural"
        PENALTY = "penalty"

    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="components"
    )
    name = models.CharField(max_length=200)
    weight = models.FloatField(default=1.0)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.OUTCOME)
    min_value = models.FloatField(
        null=True, blank=True
    )  # expected range, for saturation / unreachability
    max_value = models.FloatField(null=True, blank=True)
    description = models.TextField(blank=True)
    source_hash = models.CharField(max_length=64, blank=True)
    position = models.IntegerField(default=0)  # display and reward_funcs order

    class Meta:
        ordering = ["environment_id", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "name"], name="component_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.environment.name}/{self.name}"


class Group(models.Model):
    """The G rollouts of one prompt at one step of one run.

    `packed_scores` holds the group's score matrix, written at ingest in the same transaction as its
    rows, so that reading a whole run into arrays scans one row per group instead of every rollout
    and score row (webapp/rollouts/arrays.py, the one reader of a run's scores as arrays). Layout,
    little-endian, one fixed-width record per rollout in ingestion order (= rollout id order),
    `size` records in all:

        rollout id  int64
        length      float64   NaN: NULL
        values      K x float64, columns in `packed_components` order; NaN: not scored, or NULL

    `packed_components` is the comma-separated RewardComponent ids of the K columns (the run's
    environment components at ingest; "" when K = 0). A component added to the environment later is
    absent from older groups' headers: it reads as NaN there, as it would from the rows.
    Every writer fills it (NOT NULL; migrations 0006 and 0009 backfilled the groups stored before);
    a blob that does not hold the group's `size` records is refused by the reader. See
    webapp/rollouts/packed.py.
    """

    class Split(models.TextChoices):
        TRAIN = "train"
        HOLDOUT = "holdout"

    # FK indexes that a composite index already leads with are dropped (db_index=False): each extra
    # index costs every ingested row.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="groups", db_index=False
    )
    step = models.IntegerField()
    key = models.CharField(max_length=300)
    prompt = models.JSONField()  # str or list of chat messages, as sent
    prompt_text = models.TextField(blank=True)  # flattened, for display and search
    split = models.CharField(max_length=8, choices=Split.choices, default=Split.TRAIN)
    size = models.IntegerField()
    reward_mean = models.FloatField(null=True)
    reward_std = models.FloatField(null=True)
    zero_std = models.BooleanField(
        default=False
    )  # the aggregate reward is constant: no advantage anywhere
    all_unscorable = models.BooleanField(default=False)
    packed_scores = models.BinaryField(editable=False)  # layout in the docstring
    # "12,13,14": the column ids ("" when K = 0, hence the defaults).
    packed_components = models.TextField(blank=True, default="", db_default="", editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "key"], name="group_unique_key")
        ]
        indexes = [
            models.Index(fields=["run", "step", "id"], name="group_run_step"),
            models.Index(fields=["run", "zero_std", "step"], name="group_run_zero"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.key}"


class WordsField(models.TextField):
    """Postgres: tsvector (a document's distinct words, no positions); SQLite: text, left NULL (the
    demo's search scans)."""

    def db_type(self, connection: Any) -> str:
        return "tsvector" if connection.vendor == "postgresql" else "text"


class Rollout(models.Model):
    group = models.ForeignKey(
        Group, on_delete=models.CASCADE, related_name="rollouts", db_index=False
    )
    # Denormalised columns skip the database FK check (db_constraint=False): the ingestion service
    # sets them from the parent row, and Django still cascades deletes. Each check costs every row.
    run = models.ForeignKey(
        "runs.Run",
        on_delete=models.CASCADE,
        related_name="rollouts",
        db_index=False,
        db_constraint=False,
    )  # denormalised
    step = models.IntegerField()  # denormalised from group
    split = models.CharField(max_length=8, default="train")  # denormalised from group
    index = models.IntegerField()
    transcript = models.JSONField()  # list of {"role", "content", "tool_calls"?, "name"?}
    completion = models.TextField(blank=True)  # final assistant text (search, preview)
    reward = models.FloatField(
        null=True
    )  # aggregate, as the trainer defines it; NULL when unscorable
    advantage = models.FloatField(null=True)
    length = models.IntegerField(null=True)
    truncated = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=50, blank=True)
    parse_error = models.TextField(blank=True)
    state = models.JSONField(null=True, blank=True)  # environment state, e.g. the diagram canvas
    # Built at ingest by webapp/rollouts/text.py, so list pages never read the transcript (often
    # 10-200 KB). Database defaults too: a raw COPY without them (a restore, a bench floor) still
    # stores the row.
    preview_head = models.TextField(
        blank=True, default="", db_default=""
    )  # first 300 chars of agent text
    preview_tail = models.TextField(
        blank=True, default="", db_default=""
    )  # last 300 ("" when head has all)
    n_turns = models.IntegerField(default=0, db_default=0)  # assistant messages
    n_tool_calls = models.IntegerField(default=0, db_default=0)
    text_chars = models.IntegerField(default=0, db_default=0)  # characters of visible agent text
    # Prompt + every message (tool calls and results) + reward reasons, whitespace collapsed.
    # Postgres: a pg_trgm GIN index on its tokens holding a non-ASCII character (migration 0014,
    # rd_search_nonascii: what the word index below cannot serve; docs/performance.md).
    search_text = models.TextField(blank=True, default="", db_default="")
    # Its distinct words (text.search_words), written with it by ingestion; Postgres GIN-indexes
    # them with the run id (migration 0010). NULL: not word-indexed (written another way, or too
    # many words): search rechecks such rows' text.
    search_words = WordsField(null=True, blank=True, editable=False)

    # What list pages (explorer, group, queues, exports listings) load: never
    # transcript, state, search_text.
    LIST_FIELDS = (
        "id",
        "group",
        "run",
        "step",
        "split",
        "index",
        "completion",
        "reward",
        "advantage",
        "length",
        "truncated",
        "finish_reason",
        "parse_error",
        "preview_head",
        "preview_tail",
        "n_turns",
        "n_tool_calls",
        "text_chars",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "index"], name="rollout_unique_index")
        ]
        # INCLUDE step (Postgres; ignored elsewhere), as score_sort: a step-range filter on a sort
        # is checked inside the index. Without it the walk fetched the heap row of every entry it
        # skipped: the best rewards of steps 0-10 at 1M rollouts walked 222,560 later-step rows
        # first, 625 ms; 25 ms index-only (migration 0011).
        indexes = [
            models.Index(
                fields=["run", "reward", "id"], include=["step"], name="rollout_run_reward"
            ),
            models.Index(
                fields=["run", "advantage", "id"], include=["step"], name="rollout_run_adv"
            ),
            models.Index(
                fields=["run", "length", "id"], include=["step"], name="rollout_run_length"
            ),
            # Sorted by step (keyset on step, id); the sort columns INCLUDEd for index-only reads
            # of a step's values.
            models.Index(
                fields=["run", "step", "id"],
                include=["reward", "advantage", "length"],
                name="rollout_run_step",
            ),
            # A step range sorted by one of them: each step's top, merged, as score_step
            # (migration 0012; paging.per_step_fetch).
            models.Index(fields=["run", "step", "reward", "id"], name="rollout_run_step_reward"),
            models.Index(fields=["run", "step", "advantage", "id"], name="rollout_run_step_adv"),
            models.Index(fields=["run", "step", "length", "id"], name="rollout_run_step_length"),
        ]

    def __str__(self) -> str:
        return f"rollout {self.id} (run {self.run_id} step {self.step} #{self.index})"


class RewardScore(models.Model):
    # No database FK check on the (N x K) score rows: at commit Postgres would run one deferred
    # trigger per row, a quarter of ingestion time. The service writes them with their rollout,
    # in one transaction.
    rollout = models.ForeignKey(
        Rollout,
        on_delete=models.CASCADE,
        related_name="scores",
        db_index=False,
        db_constraint=False,
    )
    component = models.ForeignKey(
        RewardComponent, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, db_index=False, db_constraint=False
    )  # denormalised: the sort index leads with it
    step = models.IntegerField()  # denormalised: step-range filters stay inside the index
    value = models.FloatField(null=True)
    reason = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rollout", "component"], name="score_unique")
        ]
        indexes = [
            # The design's (component, value, rollout) sort index, led by run so that one run's scan
            # never walks another run's rows of a shared environment.
            # INCLUDE step (Postgres; ignored elsewhere): a step-range filter is checked inside the
            # index instead of a heap fetch per entry (measured 760 ms -> 115 ms at 1M rollouts).
            models.Index(
                fields=["run", "component", "value", "rollout"], include=["step"], name="score_sort"
            ),
            # A step range sorted by a component: each step's top entries are the first of its
            # stretch (the value in the key since migration 0012), so the page merges per-step
            # tops (paging.per_step_fetch) at a cost of steps x page size, whatever the run's
            # size. score_sort skips every other step's rows first (78 ms for the best of steps
            # 0-10 at 1M rollouts when scores climb).
            models.Index(
                fields=["run", "component", "step", "value", "rollout"], name="score_step"
            ),
        ]


class GroupComponentStat(models.Model):
    """Per (group, component): computed at ingest, never per page view."""

    group = models.ForeignKey(
        Group,
        on_delete=models.CASCADE,
        related_name="component_stats",
        db_index=False,
        db_constraint=False,
    )
    component = models.ForeignKey(
        RewardComponent, on_delete=models.CASCADE, db_index=False, db_constraint=False
    )
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, db_index=False, db_constraint=False
    )  # denormalised for per-step aggregates
    step = models.IntegerField()
    count = models.IntegerField()
    mean = models.FloatField(null=True)
    std = models.FloatField(null=True)
    min = models.FloatField(null=True)
    max = models.FloatField(null=True)
    zero_std = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["group", "component"], name="gcs_unique")]
        indexes = [models.Index(fields=["run", "component", "step"], name="gcs_run_comp_step")]


class StepStat(models.Model):
    """Per (run, step, component) sufficient statistics, incremented at ingest so the dashboard
    reads one row per step and component instead of aggregating every group. `component_id` 0 is the
    aggregate reward. Means and Bessel stds follow from the sums (see webapp/runs/queries.py)."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, db_index=False)
    step = models.IntegerField()
    component_id = models.BigIntegerField()  # RewardComponent id, or 0 for the aggregate reward
    n_groups = models.IntegerField(default=0)  # groups where this column has at least one value
    n_zero_std = models.IntegerField(default=0)  # of those, groups with zero within-group std
    n_group_std = models.IntegerField(default=0)  # groups with a defined std (2+ values)
    sum_group_std = models.FloatField(default=0.0, null=True)  # NULL: overflowed, stays missing
    n_rollouts = models.IntegerField(default=0)  # rollouts in the step's groups
    n_values = models.IntegerField(default=0)  # non-null values among them
    sum_values = models.FloatField(default=0.0, null=True)  # NULL: overflowed, stays missing
    sum_squares = models.FloatField(default=0.0, null=True)  # NULL: overflowed, stays missing

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "component_id"], name="stepstat_unique")
        ]


class SearchWord(models.Model):
    """A run's vocabulary: every word (text.search_words) of its rollouts' search documents, added
    by ingestion in the batch's transaction. Search looks up the words that contain a term here
    (Postgres: a trigram index on word, migration 0010), then the rollouts holding any of them
    through the word index: substring matching with no document rechecked."""

    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    word = models.CharField(max_length=64)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "word"], name="searchword_unique")]
