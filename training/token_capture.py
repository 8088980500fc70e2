"""Per-token arrays from a TRL GRPOTrainer (1.16) for the recorder's rollouts' `tokens` objects (no
Django here; the contract is webapp/tokens/models.py).

It reads what TRL already computed in `_generate_and_score_completions` and the loss (completion
ids and masks, tool masks, sampler, trainer and reference log-probs, entropies) through three
light hooks on the trainer instance, each returning TRL's result unchanged. Gaps (several
processes, another TRL version) are warned about, never filled. Which arrays exist under which
TRL settings: docs/tokens.md, "Module notes".
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

ROW_KEY = "recorder_row"  # the row-number tensor added to TRL's generation output
GEN_STRIDE = 1 << 24  # row numbers are generation * GEN_STRIDE + row: stale passes are told apart
# How each array is sent: base64 of little-endian binary (a quarter of the JSON of a list, and
# no per-number parsing on the server); text as a list of strings.
DTYPES = {
    "ids": "int32",
    "loss_mask": "uint8",
    "advantages": "float32",
    "sampler_logprobs": "float32",
    "trainer_logprobs": "float32",
    "ref_logprobs": "float32",
    "entropy": "float32",
}
HOOKS = ("_generate_and_score_completions", "compute_loss", "_get_per_token_logps_and_entropies")


class TokenCapture:
    """Holds the last training generation's per-row token arrays until the recorder takes them."""

    def __init__(self, text: bool = True) -> None:
        self.text = text  # decode each token's text (the token view shows it)
        self.trainer: Any = None
        self.enabled = False
        self._gen = 0
        self._rows: list[dict[str, Any]] = []
        self._ids: list[list[int]] | None = None  # the reward functions' unpadded completion ids
        self._current: list[int] | None = None  # the loss pass's row numbers

    # ---- installing

    def install(self, trainer: Any) -> bool:
        """Hook `trainer`; False (and a warning) when it is not a GRPOTrainer this module knows."""
        if self.trainer is trainer:
            return self.enabled
        self.trainer = trainer
        missing = [h for h in HOOKS if not callable(getattr(trainer, h, None))]
        processes = getattr(getattr(trainer, "accelerator", None), "num_processes", 1)
        if missing or processes != 1:
            why = f"no {', '.join(missing)}" if missing else f"{processes} processes"
            logger.warning("recorder: token arrays not recorded (%s)", why)
            return False
        generate = trainer._generate_and_score_completions
        compute_loss = trainer.compute_loss
        logps = trainer._get_per_token_logps_and_entropies

        def generate_hook(*args: Any, **kwargs: Any) -> Any:
            output = generate(*args, **kwargs)
            self._after_generation(output)
            return output

        def compute_loss_hook(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            rows = inputs.get(ROW_KEY) if isinstance(inputs, dict) else None
            self._current = rows.tolist() if rows is not None else None
            try:
                return compute_loss(model, inputs, *args, **kwargs)
            finally:
                self._current = None

        def logps_hook(*args: Any, **kwargs: Any) -> Any:
            result = logps(*args, **kwargs)
            if kwargs.get("compute_entropy") and self._current is not None:
                self._after_loss_pass(result[0], result[1])
            return result

        trainer._generate_and_score_completions = generate_hook
        trainer.compute_loss = compute_loss_hook
        trainer._get_per_token_logps_and_entropies = logps_hook
        self.enabled = True
        return True

    def note_completion_ids(self, ids: Any) -> None:
        """The unpadded completion ids TRL hands the reward functions (the recorder's first reward
        wrapper calls this): the rows' true lengths, whatever the masks say."""
        if self.enabled and ids is not None and self.trainer.model.training:
            self._ids = [list(map(int, x)) for x in ids]

    # ---- hooks

    def _after_generation(self, output: dict[str, Any]) -> None:
        if not self.trainer.model.training:
            self._ids = None
            return
        import torch

        ids = output["completion_ids"]
        b = int(ids.shape[0])
        self._gen += 1
        output[ROW_KEY] = torch.arange(b, device=ids.device) + self._gen * GEN_STRIDE
        lengths = (
            [len(x) for x in self._ids]
            if self._ids is not None and len(self._ids) == b
            else output["completion_mask"].sum(dim=1).tolist()
        )
        self._ids = None
        mask = output["completion_mask"]
        if output.get("tool_mask") is not None:
            mask = mask * output["tool_mask"]
        self._rows = []
        for i, n in enumerate(int(x) for x in lengths):
            row: dict[str, Any] = {
                "ids": ids[i, :n].cpu().numpy(),
                "loss_mask": mask[i, :n].cpu().numpy(),
                "advantages": np.full(n, float(output["advantages"][i])),
            }
            for key, name in (
                ("sampling_per_token_logps", "sampler_logprobs"),
                ("old_per_token_logps", "trainer_logprobs"),
                ("ref_per_token_logps", "ref_logprobs"),
            ):
                if output.get(key) is not None:
                    row[name] = _floats(output[key][i, :n], upper=0.0)
            if self.text:
                row["text"] = self._decode(row["ids"].tolist())
            self._rows.append(row)

    def _after_loss_pass(self, logps: Any, entropies: Any) -> None:
        for j, number in enumerate(self._current or []):
            gen, i = divmod(int(number), GEN_STRIDE)
            if gen != self._gen or i >= len(self._rows) or "entropy" in self._rows[i]:
                continue  # an older generation's rows, or a later iteration over the same ones
            row = self._rows[i]
            n = len(row["ids"])
            if entropies is not None:
                row["entropy"] = _floats(entropies[j, :n], lower=0.0)
            if "trainer_logprobs" not in row:  # TRL then trains against these very values
                row["trainer_logprobs"] = _floats(logps[j, :n], upper=0.0)

    def _decode(self, ids: list[int]) -> list[str]:
        """Each token's text, such that they join into the decoded completion: a character split
        over several byte-level tokens is given to the last of them (the others get ""), where
        decoding each alone would show U+FFFD for every part."""
        tok = getattr(self.trainer, "_tokenizer", None) or self.trainer.processing_class
        tok = getattr(tok, "tokenizer", tok)  # a processor wraps its tokenizer
        texts = tok.batch_decode([[i] for i in ids])
        start = None  # first token of a character still incomplete
        for i, text in enumerate(texts):
            if "\ufffd" not in text and start is None:
                continue
            first = i if start is None else start
            joined = tok.decode(ids[first : i + 1])
            if joined.endswith("\ufffd") and i - first < 3:  # UTF-8: 4 bytes at most
                start = first
                continue
            texts[first : i + 1] = [""] * (i - first) + [joined]
            start = None
        return texts

    # ---- reading

    def take(self, n: int) -> list[dict[str, Any]] | None:
        """The last generation's token objects in TRL's row order (the recorder's rows), or None
        when they are not the `n` rows the recorder is writing. Each is taken once."""
        rows, self._rows = self._rows, []
        if not self.enabled or len(rows) != n:
            return None
        return [{k: pack(v, DTYPES[k]) if k in DTYPES else v for k, v in r.items()} for r in rows]


def pack(a: Any, dtype: str) -> dict[str, str]:
    """An array as the tokens object's binary form: {"dtype", "data": base64 little-endian}."""
    raw = np.asarray(a).astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    return {"dtype": dtype, "data": base64.b64encode(raw).decode("ascii")}


def unpack(v: Any) -> np.ndarray:
    """An array of a tokens object, as sent in either form (a list, or `pack`'s dict)."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["data"]), np.dtype(v["dtype"]).newbyteorder("<"))
    return np.asarray(v)


def _floats(t: Any, lower: float | None = None, upper: float | None = None) -> np.ndarray:
    """A 1-d tensor as float32 numpy, clamped into the valid range (float noise past 0)."""
    t = t.detach().float()
    if lower is not None or upper is not None:
        t = t.clamp(min=lower, max=upper)
    return t.cpu().numpy()
