"""RolloutRecorder: records every GRPO rollout (prompt, completion or transcript, each reward
component's value and reason, group, advantage, per-token arrays) and every metric TRL logs, into
a sink. Works for our jobs and for anyone's TRL script:

    from .recorder import RolloutRecorder
    recorder = RolloutRecorder(url="http://app:8000", token="KEY", run="42")
    trainer = GRPOTrainer(..., callbacks=[recorder])

It reads the values TRL trains on (`trainer._logs`), never re-computes them, and the trainer's
settings once at the start. Where each number comes from: docs/recording.md, "Module notes".
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from transformers import Trainer, TrainerCallback

from .common import numeric_metrics
from .records import GroupRecord, InvalidRecord, RolloutRecord, Score
from .rewards import REASON_PREFIX
from .sinks import SETTINGS_FILE, BatchingSink, HttpSink, JsonlSink, Sink
from .stats import weighted_reward
from .token_capture import TokenCapture

KEY_COLUMN = "recorder/key"
LENGTH_COLUMN = "recorder/length"
TRUNCATED_COLUMN = "recorder/truncated"
TRANSCRIPT_COLUMN = (
    "recorder/transcript"  # JSON text: TRL may write extra columns to parquet tables
)

TRL_ADVANTAGE_EPS = 1e-4  # TRL's constant in the advantage denominator (std + 1e-4), not a setting
logger = logging.getLogger(__name__)

StateFn = Callable[[str, Any, Any], dict[str, Any] | None]  # (key, prompt, completion) -> env state


def prompt_key(prompt: Any) -> str:
    """Stable group key for a prompt without a dataset "key" column: a hash of its
    text / messages."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return "p-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _split_outputs(outputs: list[Any]) -> tuple[list[float | None], list[str] | None]:
    """Values for TRL and reasons (None when the function gave none) from a
    reward function's output."""
    values: list[float | None] = []
    reasons: list[str] = []
    has_reasons = False
    for out in outputs:
        if hasattr(out, "value") and hasattr(out, "reason"):  # training.environments.base.Score
            v, r, has_reasons = out.value, out.reason, True
        elif isinstance(out, tuple) and len(out) == 2:
            (v, r), has_reasons = out, True
        else:
            v, r = out, ""
        if v is not None:
            v = float(v)
            if math.isnan(v):
                v = None
        values.append(v)
        reasons.append("" if r is None else str(r))
    return values, (reasons if has_reasons else None)


class RolloutRecorder(TrainerCallback):
    """TrainerCallback + reward-function wrappers that record GRPO rollouts and metrics into a sink.

    Give exactly one destination: `sink` (any `training.sinks.Sink`), `url`+`token`+`run` (HttpSink,
    spooling to `spool` when the server is down) or `jsonl` (JsonlSink). `split` labels the groups.
    `state_fn(key, prompt, completion)` may add environment state to each rollout (e.g. a rendered
    canvas); it runs on the training thread, so keep it cheap or leave it None."""

    def __init__(
        self,
        sink: Sink | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        run: str | int | None = None,
        spool: str | None = None,
        jsonl: str | None = None,
        split: str = "train",
        background: bool = True,
        record_metrics: bool = True,
        state_fn: StateFn | None = None,
        tokens: bool = True,
        token_text: bool = True,
    ) -> None:
        given = [x is not None for x in (sink, url, jsonl)]
        if sum(given) != 1:
            raise ValueError(
                "sink: give exactly one of sink=, url= (with token= and run=) or jsonl="
            )
        self._owns_inner = sink is None
        if url is not None:
            if token is None or run is None:
                raise ValueError("token: url= needs token= and run=")
            sink = HttpSink(url, token, run, spool_path=spool)
        elif jsonl is not None:
            sink = JsonlSink(jsonl)
        # The recorder closes only what it created; a caller's own sink stays open for the caller.
        self.sink: Sink = BatchingSink(sink, close_inner=self._owns_inner) if background else sink  # type: ignore[arg-type]
        self._owns_sink = background or self._owns_inner
        self.split = split
        self.record_metrics = record_metrics
        self.state_fn = state_fn
        self._tokens = TokenCapture(text=token_text) if tokens else None
        self.trainer: Trainer | None = None
        self._pending = 0  # train-mode generations scored since the last emission
        self._wrapped_any = False
        self._settings_written = False
        self.settings: dict[str, Any] | None = None  # what trainer_settings read at train start
        self.groups_written = 0

    # ---- binding to a trainer

    @classmethod
    def attach(cls, trainer: Trainer, sink: Sink | None = None, **kwargs: Any) -> RolloutRecorder:
        """Wrap `trainer`'s reward functions and add the callback: the whole recorder
        in one call."""
        recorder = cls(sink, **kwargs)
        recorder.bind(trainer)
        trainer.add_callback(recorder)
        return recorder

    def bind(self, trainer: Trainer) -> None:
        if self.trainer is trainer:
            return
        self.trainer = trainer
        funcs = getattr(trainer, "reward_funcs", None)
        if funcs is None:
            return  # not a GRPO-style trainer: only metrics are recorded
        if self._tokens is not None:
            self._tokens.install(trainer)
        names = trainer.reward_func_names
        first = True
        for i, func in enumerate(funcs):
            if not callable(func) or hasattr(
                func, "parameters"
            ):  # nn.Module reward models: TRL scores them
                continue
            if getattr(func, "_recorder", None) is self:
                first = False
                continue
            funcs[i] = self._wrap(func, names[i], first)
            first = False
            self._wrapped_any = True

    def _wrap(self, func: Callable, name: str, first: bool) -> Callable:
        recorder = self

        def after(outputs: list[Any], kwargs: dict[str, Any]) -> list[float | None]:
            values, reasons = _split_outputs(list(outputs))
            log_extra = kwargs.get("log_extra")
            if log_extra is not None:
                if reasons is not None:
                    log_extra(REASON_PREFIX + name, reasons)
                if first:
                    recorder._log_row_facts(kwargs, log_extra)
            return values

        if inspect.iscoroutinefunction(func):

            async def wrapped(*args: Any, **kwargs: Any) -> list[float | None]:
                return after(await func(*args, **kwargs), kwargs)

        else:

            def wrapped(*args: Any, **kwargs: Any) -> list[float | None]:
                return after(func(*args, **kwargs), kwargs)

        wrapped.__name__ = name
        wrapped.__qualname__ = name
        wrapped.__wrapped__ = func  # type: ignore[attr-defined]
        wrapped._recorder = self  # type: ignore[attr-defined]
        return wrapped

    def _log_row_facts(self, kwargs: dict[str, Any], log_extra: Callable) -> None:
        """Key, token length and truncation per row, logged once per generation (by
        the first function)."""
        trainer = self.trainer
        prompts = kwargs.get("prompts") or []
        keys = kwargs.get("key") or [prompt_key(p) for p in prompts]
        log_extra(KEY_COLUMN, [str(k) for k in keys])
        transcripts = kwargs.get("transcript")
        if transcripts is not None:
            log_extra(TRANSCRIPT_COLUMN, [json.dumps(_jsonable(t)) for t in transcripts])
        ids = kwargs.get("completion_ids")
        if self._tokens is not None:
            self._tokens.note_completion_ids(ids)
        if ids is not None and trainer is not None:
            stop = {
                *getattr(trainer, "eos_token_ids", []),
                getattr(trainer._tokenizer, "pad_token_id", None),
            }
            policy_tokens = kwargs.get(
                "policy_tokens"
            )  # multi-turn: env replies are not the policy's
            log_extra(
                LENGTH_COLUMN,
                [int(n) for n in policy_tokens]
                if policy_tokens is not None
                else [len(x) for x in ids],
            )
            # TRL's own definition (completions/clipped_ratio): the last token is neither
            # eos nor pad
            log_extra(TRUNCATED_COLUMN, [bool(len(x)) and x[-1] not in stop for x in ids])
        if trainer is not None and trainer.model.training:
            self._pending += 1

    # ---- callback events

    def on_init_end(self, args, state, control, **kwargs):
        self._bind_from_stack()

    def on_train_begin(self, args, state, control, **kwargs):
        self._bind_from_stack()
        if self.trainer is not None and state.is_world_process_zero and not self._settings_written:
            self._settings_written = True
            self.settings = trainer_settings(self.trainer)
            write = getattr(
                self.sink, "write_settings", None
            )  # a caller's own sink may not take them
            if write is not None:
                write(self.settings)
            if getattr(args, "log_completions", False):
                self._write_settings_file(args.output_dir)

    def _write_settings_file(self, output_dir: str) -> None:
        """Beside TRL's completions/ parquet files, so `import_rollouts --format trl` knows the
        reward functions, weights and group size."""
        try:
            path = Path(output_dir) / SETTINGS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.settings, indent=2), encoding="utf-8")
        except OSError as e:  # never raise into training
            logger.error("recorder: could not write %s: %s", SETTINGS_FILE, e)

    def _bind_from_stack(self) -> None:
        """`callbacks=[RolloutRecorder(...)]` gives the callback no trainer reference; the Trainer
        calling us is the `self` of a frame up the stack (Trainer.__init__ / Trainer.train)."""
        if self.trainer is not None:
            return
        frame = inspect.currentframe()
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                self.bind(candidate)
                return
            frame = frame.f_back

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer is None or not hasattr(self.trainer, "_logs"):
            return
        if self._generated_this_step(args):
            self._pending = 0
            if state.is_world_process_zero:
                try:
                    groups = self.collect_groups(state.global_step)
                except InvalidRecord as e:  # a bug (a state_fn's value) must not stop training
                    self.sink.log(f"recorder: step {state.global_step} not recorded: {e}")
                    logger.error("recorder: step %s not recorded: %s", state.global_step, e)
                    return
                if groups:
                    self.sink.write_groups(groups)
                    self.groups_written += len(groups)

    def _generated_this_step(self, args) -> bool:
        if self._wrapped_any:
            return self._pending > 0
        # No wrappable reward function (reward models only): TRL generates on micro-steps where
        # _step % (steps_per_generation * num_iterations) == 0; this optimizer step spanned the
        # last GA ones.
        t = self.trainer
        every = args.steps_per_generation * t.num_iterations
        end = t._step
        return any(m % every == 0 for m in range(end - t.current_gradient_accumulation_steps, end))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.record_metrics and state.is_world_process_zero and logs:
            values = numeric_metrics(logs)
            if values:
                self.sink.write_metrics(state.global_step, values)

    def on_train_end(self, args, state, control, **kwargs):
        self.flush()

    # ---- reading TRL's values

    def collect_groups(self, step: int) -> list[GroupRecord]:
        """The last generation batch as ingestion groups, read from TRL's `_logs`."""
        t = self.trainer
        logs = t._logs
        advantages = list(logs["advantages"])
        n = len(advantages)
        prompts, completions = list(logs["prompt"]), list(logs["completion"])
        names = list(t.reward_func_names)
        rewards = {name: list(logs["rewards"][name]) for name in names}
        # TRL releases before log_extra (as some Unsloth pins) have no "extra":
        # record without reasons.
        extra = {col: list(vals) for col, vals in logs.get("extra", {}).items() if len(vals) == n}
        g = t.num_generations if t.model.training else t.num_generations_eval
        weights = reward_weights(t)
        weight_of = dict(zip(names, weights, strict=False))
        if n == 0 or n % g or len(prompts) != n or len(weights) != len(names):
            return []  # not a batch this recorder can read: record nothing rather than guess
        keys = extra.get(KEY_COLUMN) or [prompt_key(p) for p in prompts]
        lengths = extra.get(LENGTH_COLUMN)
        truncated = extra.get(TRUNCATED_COLUMN)
        transcripts = extra.get(TRANSCRIPT_COLUMN)
        tokens = self._tokens.take(n) if self._tokens is not None else None
        seen: dict[str, int] = {}
        groups = []
        for start in range(0, n, g):
            key = str(keys[start])
            seen[key] = seen.get(key, 0) + 1
            if (
                seen[key] > 1
            ):  # the same prompt twice in one batch: keys must be unique within a step
                key = f"{key}#{seen[key]}"
            rollouts = []
            for j in range(g):
                row = start + j
                completion = completions[row]
                if transcripts and transcripts[row] is not None:
                    completion = json.loads(
                        transcripts[row]
                    )  # multi-turn: the episode, not the token stream
                is_trunc = bool(truncated[row]) if truncated else False
                state_value = None
                if self.state_fn is not None:
                    state_value = self.state_fn(str(keys[start]), prompts[row], completion)
                text = isinstance(completion, str)
                rollouts.append(
                    RolloutRecord(
                        index=j,
                        completion=completion if text else None,
                        transcript=None if text else _jsonable(completion),
                        rewards={
                            name: Score(_value(rewards[name][row]), _reason(extra, name, row))
                            for name in names
                        },
                        reward=_finite(
                            weighted_reward({n: rewards[n][row] for n in names}, weight_of)
                        ),
                        advantage=_finite(float(advantages[row])),
                        length=int(lengths[row]) if lengths else self._count_tokens(completion),
                        truncated=is_trunc,
                        finish_reason="length" if is_trunc else "stop",
                        tokens=tokens[row] if tokens is not None else None,
                        state=state_value,
                    )
                )
            groups.append(
                GroupRecord(
                    step=int(step),
                    key=key,
                    prompt=_jsonable(prompts[start]),
                    split=self.split,
                    rollouts=rollouts,
                )
            )
        return groups

    def _count_tokens(self, completion: Any) -> int:
        """Fallback when no wrapped reward function saw the token ids (reward models only)."""
        if not isinstance(completion, str):  # chat messages: count the text of every turn
            completion = "".join(
                str(m.get("content") or "") for m in completion if isinstance(m, dict)
            )
        tok = getattr(self.trainer, "_tokenizer", None) or self.trainer.processing_class
        return len(tok(completion, add_special_tokens=False)["input_ids"])

    # ---- lifecycle

    def flush(self) -> None:
        """Block until everything recorded so far has reached the sink's destination."""
        flush = getattr(self.sink, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        """Drain the queue and close the sink if the recorder created it (a caller's
        sink stays open)."""
        if self._owns_sink:
            self.sink.close()


def reward_weights(trainer: Any) -> list[float]:
    """The weights the user gave (GRPOConfig.reward_weights), not TRL's float32 copy of them:
    torch.tensor(..., dtype=float32) turns 0.2 into 0.20000000298023224, which a page would show
    as a weight nobody typed. Without a usable config list (TRL filled in ones, or added a weight),
    each float32 weight as the shortest decimal that is the same float32 (0.2, not 0.2000000029).

    >>> import torch
    >>> class T: pass
    >>> t = T(); t.reward_weights = torch.tensor([0.2, 1.0, 0.35], dtype=torch.float32)
    >>> reward_weights(t)
    [0.2, 1.0, 0.35]
    """
    tensor = [float(w) for w in trainer.reward_weights.tolist()]
    given = getattr(getattr(trainer, "args", None), "reward_weights", None)
    if isinstance(given, (list, tuple)) and len(given) == len(tensor):
        return [float(w) for w in given]
    return [float(str(np.float32(w))) for w in tensor]


def trainer_settings(trainer: Any) -> dict[str, Any]:
    """What a TRL trainer computes its rewards and advantages with, in the shape of a run's
    `reward_settings` (webapp/runs/reward_settings.py). Read from the trainer's attributes (TRL 1.16
    names), so what is stored is what it trains on. A setting that cannot be read is logged by name
    and left out; the rest is recorded."""
    args = getattr(trainer, "args", None)
    out: dict[str, Any] = {"source": "trainer", "advantage_epsilon": TRL_ADVANTAGE_EPS}
    missing: list[str] = []

    def read(name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - another TRL version, another trainer: record the rest
            missing.append(name)
            return None

    names = read("reward_func_names", lambda: list(trainer.reward_func_names))
    weights = read("reward_weights", lambda: reward_weights(trainer))
    if names is not None and weights is not None and len(names) == len(weights):
        out["weights"] = dict(zip(names, weights, strict=True))
    scale = read("scale_rewards", lambda: trainer.scale_rewards)
    if isinstance(scale, bool):  # TRL before 0.22: True = divide by the group std, False = do not
        scale = "group" if scale else "none"
    if scale is not None:
        out["scale_rewards"] = str(scale)
    # TRL before multi_objective_aggregation existed always summed first.
    out["aggregation"] = str(
        getattr(trainer, "multi_objective_aggregation", None) or "sum_then_normalize"
    )
    size = read("num_generations", lambda: int(trainer.num_generations))
    if size is not None:
        out["group_size"] = size
    facts = {
        "trainer_class": lambda: type(trainer).__name__,
        "trl_version": lambda: _version("trl"),
        "transformers_version": lambda: _version("transformers"),
        "model_name": lambda: _model_name(trainer),
        "loss_type": lambda: trainer.loss_type,
        "beta": lambda: float(trainer.beta),
        "epsilon": lambda: float(trainer.epsilon_low),
        "epsilon_high": lambda: float(trainer.epsilon_high),
        "learning_rate": lambda: float(args.learning_rate),
        "num_generations": lambda: int(trainer.num_generations),
        "steps_per_generation": lambda: int(args.steps_per_generation),
        "num_iterations": lambda: int(trainer.num_iterations),
        "temperature": lambda: float(trainer.temperature),
        "max_completion_length": lambda: int(trainer.max_completion_length),
        "scale_rewards": lambda: out["scale_rewards"],
        "multi_objective_aggregation": lambda: out["aggregation"],
    }
    trainer_facts = {name: read(name, fn) for name, fn in facts.items()}
    out["trainer"] = {k: v for k, v in trainer_facts.items() if v is not None}
    if missing:
        logger.warning(
            "recorder: could not read the trainer's %s; recording the other settings",
            ", ".join(missing),
        )
        out["trainer"]["unreadable"] = ", ".join(missing)
    logger.info("recorder: trainer settings %s", json.dumps(out, default=str))
    return out


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _model_name(trainer: Any) -> str:
    config = trainer.model.config
    return str(getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", ""))


def _value(v: Any) -> float | None:
    """A component's value; NaN (not scored) and inf (sent as null by the sinks) as None."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _finite(v: float | None) -> float | None:
    """NaN or inf as null, as the sinks have always sent them (`sinks.storable`)."""
    return v if v is None or math.isfinite(v) else None


def _reason(extra: dict[str, list[Any]], name: str, row: int) -> str:
    reasons = extra.get(REASON_PREFIX + name)
    r = reasons[row] if reasons else None
    return "" if r is None else str(r)


def _jsonable(obj: Any) -> Any:
    """Chat messages may carry non-JSON objects (images): keep the JSON-able parts,
    stringify the rest."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj)
