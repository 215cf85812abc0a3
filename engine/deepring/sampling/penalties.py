"""Presence and frequency penalties: each request's output-token counts, kept on the device.

OpenAI's definition: the logit of token j drops by frequency_penalty * c[j] +
presence_penalty * (c[j] > 0), where c[j] is how often j occurs in the request's output so far
(the prompt does not count). The sampler applies it to the logits it receives, before
temperature.

Recounting every penalized request's whole output each step would move O(output length) ids
to the device per step; instead `OutputCounts` keeps one [vocab] row of counts per request on
the device and adds only the tokens appended since its last step (normally one). A request is
known by its identity (a weak reference, so a finished request is not kept alive): a request
seen for the first time, or whose output shrank, is recounted from its output ids, which is
also what makes the counts right for a request resumed on another worker or recomputed after
preemption. Counts are exact integers, so the state changes nothing but the cost.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch


class OutputCounts:
    """Per-request output-token counts, rows of one [R, vocab] int32 table on the device.
    Rows are reused least recently used first; the table grows to the most penalized requests
    one step held."""

    def __init__(self) -> None:
        self.table: torch.Tensor | None = None
        self._owner: list[weakref.ref | None] = []
        self._owner_key: list[int | None] = []  # id() of each row's owner
        self._counted: list[int] = []
        self._used_at: list[int] = []
        self._row_of: dict[int, int] = {}  # id(request) -> row; checked against _owner
        self._step = 0

    def _table(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        t = self.table
        if t is None or t.shape[1] != vocab or t.device != device:
            t = torch.zeros(max(rows, 4), vocab, dtype=torch.int32, device=device)
            self._owner = [None] * t.shape[0]
            self._owner_key = [None] * t.shape[0]
            self._counted = [0] * t.shape[0]
            self._used_at = [-1] * t.shape[0]
            self._row_of.clear()
        elif rows > t.shape[0]:
            extra = max(rows, 2 * t.shape[0]) - t.shape[0]
            t = torch.cat([t, t.new_zeros(extra, vocab)])
            self._owner += [None] * extra
            self._owner_key += [None] * extra
            self._counted += [0] * extra
            self._used_at += [-1] * extra
        self.table = t
        return t

    def _row(self, owner: Any) -> tuple[int, bool]:
        """owner's row, and whether it is new (to be recounted)."""
        key = id(owner)
        row = self._row_of.get(key)
        if row is not None:
            ref = self._owner[row]
            if ref is not None and ref() is owner:
                return row, False
        # The least recently used row not taken this step (the table has room: see gather).
        row = min(range(len(self._owner)), key=self._used_at.__getitem__)
        old = self._owner_key[row]
        if old is not None and self._row_of.get(old) == row:
            del self._row_of[old]
        self._owner[row] = weakref.ref(owner)
        self._owner_key[row] = key
        self._row_of[key] = row
        return row, True

    def gather(
        self, owners: Sequence[Any], outputs: Sequence[Sequence[int]], vocab: int, device
    ) -> torch.Tensor:
        """[len(owners), vocab] int32: the output-token counts of each request (owners[i] is
        the request, outputs[i] its output ids so far)."""
        self._step += 1
        t = self._table(len(owners), vocab, device)
        rows, reset, inc_rows, inc_ids = [], [], [], []
        for owner, out in zip(owners, outputs, strict=True):
            row, new = self._row(owner)
            n = len(out)
            if new or self._counted[row] > n:
                reset.append(row)
                self._counted[row] = 0
            start = self._counted[row]
            if n > start:
                inc_rows.extend([row] * (n - start))
                inc_ids.extend(out[start:])
            self._counted[row] = n
            self._used_at[row] = self._step
            rows.append(row)
        if reset:
            t[torch.tensor(reset, device=device)] = 0
        if inc_ids:
            idx = (
                torch.tensor(inc_rows, dtype=torch.long, device=device),
                torch.tensor(inc_ids, dtype=torch.long, device=device),
            )
            t.index_put_(idx, torch.ones(len(inc_ids), dtype=torch.int32, device=device), True)
        return t[torch.tensor(rows, device=device)]


def penalize(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """logits [n, V] less presence [n] where a token occurred and frequency [n] per occurrence
    (counts [n, V]); elementwise, so every row depends on itself alone."""
    c = counts.to(logits.dtype)
    return logits - c * frequency[:, None] - (counts > 0).to(logits.dtype) * presence[:, None]
