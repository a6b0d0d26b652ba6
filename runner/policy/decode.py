"""The decoding state behind `LocalPolicy`: a batch of rows sharing one KV cache.

Rows join while others are mid-generation (continuous batching): a group of new prompts is
prefilled on its own, left-padded, and its cache is concatenated to the running one along the
batch axis after left-padding both to the same length. Every row keeps its own positions and
attention mask, so the padding columns are invisible to it. Finished rows are dropped from the
cache, and columns no remaining row attends to are trimmed from the left. Identical prompts in
one admission (a GRPO group's samples) are prefilled once and their cache rows copied.

Merging needs plain per-layer key/value tensors (transformers' `DynamicCache`); for other cache
types `can_merge` is False and the caller only admits rows into an empty batch.

Failures stay with their request: `admit` changes nothing when it raises (the new rows are
built completely before the running batch is touched), and a row whose `advance` raises leaves
the batch as finished with `error` set while the other rows go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .base import GenerationRequest

__all__ = ["DecodeBatch", "Row"]


@dataclass(slots=True)
class Row:
    """Decode state of one request."""

    request: GenerationRequest
    version: int
    payload: Any = None  # the caller's handle (future, enqueue time)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    stop_at: int | None = None  # char offset of a matched stop string in the decoded text
    admitted_at: float = 0.0
    done_at: float = 0.0
    error: Exception | None = None  # set when this row alone failed; `finish` is then "error"


def _layers(cache: Any) -> list[Any] | None:
    """Per-layer objects with `.keys`/`.values`, or None when the cache cannot be merged."""
    layers = getattr(cache, "layers", None)
    if layers is None or not all(type(layer).__name__ == "DynamicLayer" for layer in layers):
        return None
    return list(layers)


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class DecodeBatch:
    """Rows decoding together. `forward(ids, mask, positions, cache, last_only)` -> fp32 logits
    of the last position; `sample(logits, temps, top_ps, generators)` -> (tokens, logprobs);
    `advance(row, token, logprob)` records a token and decides whether the row finished."""

    def __init__(self, forward: Callable[..., torch.Tensor], new_cache: Callable[[], Any],
                 sample: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                 advance: Callable[[Row, int, float], None], pad_id: int,
                 device: torch.device, default_generator: torch.Generator) -> None:
        self._forward, self._new_cache = forward, new_cache
        self._sample, self._advance = sample, advance
        self._pad, self._device, self._rng = pad_id, device, default_generator
        self.rows: list[Row] = []
        self.can_merge = True
        self._cache: Any = None
        self._mask = self._next_pos = self._logits = self._temps = self._top_ps = None
        self._gens: list[torch.Generator] = []

    def __len__(self) -> int:
        return len(self.rows)

    def admit(self, rows: list[Row]) -> int:
        """Prefill `rows` and add them to the batch (their first token is sampled next step).

        Identical prompts are prefilled once and their cache rows copied: the samples of a GRPO
        group arrive together with one prompt. Returns how many prompts were prefilled."""
        cache = self._new_cache()
        if _layers(cache):  # plain per-layer tensors (known before the prefill): rows can be copied
            distinct: dict[tuple[int, ...], int] = {}
            source = [distinct.setdefault(tuple(r.request.prompt_ids), len(distinct))
                      for r in rows]
            prompts: list[Any] = list(distinct)
        else:
            prompts, source = [r.request.prompt_ids for r in rows], []
        ids, mask = self._left_padded(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(ids, mask, positions, cache, True)
        if len(prompts) < len(rows):
            index = torch.tensor(source, device=self._device)
            cache.batch_select_indices(index)
            logits, mask, positions = logits[index], mask[index], positions[index]
        temps = torch.tensor([max(r.request.temperature, 0.0) for r in rows], device=self._device)
        top_ps = torch.tensor([r.request.top_p for r in rows], device=self._device)
        gens = [torch.Generator().manual_seed(r.request.seed) if r.request.seed is not None
                else self._rng for r in rows]
        if not self.rows:
            self._cache, self._mask, self._next_pos = cache, mask, positions[:, -1]
            self._logits, self._temps, self._top_ps, self._gens = logits, temps, top_ps, gens
            self.can_merge = _layers(cache) is not None
        else:
            # Everything is computed before anything is assigned: if one step raises, the
            # running rows keep a consistent state and only the new rows fail.
            layers, merged_mask = self._merged(cache, mask)
            next_pos = torch.cat([self._next_pos, positions[:, -1]])
            logits = torch.cat([self._logits, logits])
            temps = torch.cat([self._temps, temps])
            top_ps = torch.cat([self._top_ps, top_ps])
            for layer, (keys, values) in zip(_layers(self._cache) or [], layers):
                layer.keys, layer.values = keys, values
            self._mask, self._next_pos, self._logits = merged_mask, next_pos, logits
            self._temps, self._top_ps, self._gens = temps, top_ps, self._gens + gens
        now = time.perf_counter()
        for row in rows:
            row.admitted_at = now
        self.rows.extend(rows)
        return len(prompts)

    def _left_padded(self, prompts: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of `prompts`, left-padded to one width, on the device."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt):] = 1
        return ids.to(self._device), mask.to(self._device)

    def _merged(self, cache: Any, mask: torch.Tensor
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per-layer (keys, values) and the attention mask of the running rows followed by
        the new ones, left-padded to one width; assigns nothing."""
        old, new = _layers(self._cache), _layers(cache)
        if old is None or new is None:
            raise RuntimeError("this model's KV cache cannot be merged; admit rows only into "
                               "an empty batch (check can_merge)")
        width = max(self._mask.shape[1], mask.shape[1])
        layers = [(torch.cat([_pad_left(a.keys, width, 2), _pad_left(b.keys, width, 2)]),
                   torch.cat([_pad_left(a.values, width, 2), _pad_left(b.values, width, 2)]))
                  for a, b in zip(old, new)]
        return layers, torch.cat([_pad_left(self._mask, width, 1), _pad_left(mask, width, 1)])

    def step(self, finish: Callable[[Row], None] | None = None) -> list[Row]:
        """Sample one token for every row, drop finished rows, run the next forward pass.

        Returns the rows that finished in this step; they are handed to `finish` first, before
        the forward pass, so a forward pass that raises cannot take finished rows with it.
        """
        tokens, logps = self._sample(self._logits, self._temps, self._top_ps, self._gens)
        for row, tok, lp in zip(self.rows, tokens.tolist(), logps.tolist()):
            try:
                self._advance(row, tok, lp)
            except Exception as exc:  # noqa: BLE001 - e.g. a stop-string check: this row only
                row.error, row.finish, row.done_at = exc, "error", time.perf_counter()
        done = [r for r in self.rows if r.finish is not None]
        keep = [j for j, r in enumerate(self.rows) if r.finish is None]
        if not keep:
            self.rows, self._cache = [], None
        elif done:
            self._select(keep)
            tokens = tokens[torch.tensor(keep, device=self._device)]
        for row in done if finish is not None else ():
            finish(row)
        if not keep:
            return done
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=1)
        self._next_pos = self._next_pos + 1
        self._logits = self._forward(tokens[:, None], self._mask, self._next_pos[:, None],
                                     self._cache, False)
        return done

    def remove(self, gone: Callable[[Row], bool]) -> list[Row]:
        """Drop the rows for which `gone(row)` is true (their callers stopped waiting), so
        they cost no more decode steps; returns them."""
        flags = [gone(row) for row in self.rows]  # once: a caller may leave while we look
        dropped = [row for row, flag in zip(self.rows, flags) if flag]
        keep = [j for j, flag in enumerate(flags) if not flag]
        if not dropped:
            return []
        if not keep:
            self.rows, self._cache = [], None
            return dropped
        self._select(keep)
        # Between steps the next logits are already computed: they lose the same rows.
        self._logits = self._logits[torch.tensor(keep, device=self._device)]
        return dropped

    def _select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self._device)
        self._cache.batch_select_indices(index)
        self._mask, self._next_pos = self._mask[index], self._next_pos[index]
        self._temps, self._top_ps = self._temps[index], self._top_ps[index]
        self._gens = [self._gens[j] for j in keep]
        self.rows = [self.rows[j] for j in keep]
        layers = _layers(self._cache)
        seen = self._mask.sum(0).nonzero()
        first = int(seen[0]) if len(seen) else 0
        if layers is not None and first > 0:  # columns only departed rows attended to
            for layer in layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self._mask = self._mask[:, first:]
