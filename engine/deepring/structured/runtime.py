"""The worker side of structured output: compiled grammars, per-request matchers, and the
batched token mask applied to the logits before sampling.

- `GrammarCompiler` (one per engine): llguidance's tokenizer view of the served tokenizer (built
  once per process and tokenizer file: ~0.6 s for the 129k-token V4 vocabulary) and an LRU of
  compiled grammars. A request's matcher is a copy of its grammar's compiled matcher (a few
  microseconds) that then consumes the request's output so far: a request resumed elsewhere
  (handoff to decode, reroute after a fault) rebuilds exactly the state it had. Compiling is
  bounded in time by llguidance's limits (`_LIMITS`): a grammar past them is an error.
- `GrammarState`: one request's matcher; it advances with each token the engine appends (only
  sampled tokens: prompt chunks never reach it, and a preempted request keeps its state while
  its cache is recomputed).
- `TokenMasks`: each step, the bitmask of every constrained row, computed by llguidance's
  parallel executor on a helper thread while the model runs (llguidance releases the GIL), then
  applied in place to those logits rows (-inf for disallowed tokens). Greedy rows may instead be
  checked after the model ran (`start(lazy=True)`): the argmax is validated by the matcher
  (microseconds) and only a refused row computes its mask. On CPU the forward already uses every
  core, so a mask computed beside it is not free: inside a bounded string (`maxLength`) each
  mask costs ~0.3-5 ms, while the argmax is refused there only near the bound. A row refused
  once is computed ahead again next step (`GrammarState.eager`): structure positions are
  refused step after step, string bodies rarely.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llguidance
import numpy as np
import torch

from deepring.structured.constraint import Constraint

log = logging.getLogger("deepring.structured")

# Per-compile and per-step bounds. Defaults of llguidance 1.9 except a smaller initial lexer
# fuel (~10 ms of regex work instead of ~20 ms): a compile happens on the step loop.
_LIMITS = dict(initial_lexer_fuel=500_000, step_lexer_fuel=200_000, step_max_items=50_000)

# A refused greedy row with at most this many allowed tokens computes only their logits.
_SPARSE_TOKENS = 4096

# llguidance's slicer: tokens are grouped by the first of these regexes they match, and a slice
# whose every token the lexer state accepts is added to the mask without walking its trie. The
# defaults (general_slices) have string-body slices of 1-10, 1-30 and any length, so inside a
# bounded string (maxLength) with fewer than 10 characters left every token is walked: ~1.2 ms
# per mask for our 129k vocabulary. Finer string-body slices keep most tokens in slices that
# the remaining length still accepts: masks ~1.6x cheaper over bounded strings (maxLength 12,
# 40, 100), unchanged elsewhere (ad-hoc timings on the 2-core dev machine, 2026-12-02; the
# bench's effect: bench/structured.py), identical masks (tests/engine/test_structured_masks.py).
_STRING_BODY = r'[^"\\\x00-\x1F\x7F]'
_SLICES = [
    r"[\x20\x0A\x0D\x09]+",
    *(f"{_STRING_BODY}{{1,{k}}}" for k in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 30)),
    f"{_STRING_BODY}+",
]

_TOKENIZERS: dict[tuple[str, int, tuple[int, ...]], llguidance.LLTokenizer] = {}
_TOKENIZERS_LOCK = threading.Lock()


def llg_tokenizer(path: str | Path, vocab_size: int, eos_ids: Sequence[int]):
    """llguidance's tokenizer for a tokenizer.json, shared by every engine of the process."""
    key = (str(path), int(vocab_size), tuple(eos_ids))
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(key)
        if tok is None:
            eos = list(eos_ids) or None
            tok = llguidance.LLTokenizer(
                str(path), n_vocab=vocab_size, eos_token=eos, slices=_SLICES
            )
            _TOKENIZERS[key] = tok
        return tok


class GrammarState:
    """One request's matcher."""

    __slots__ = ("eager", "error", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher
        self.error: str | None = None
        # Whether a lazy (greedy, CPU) step computes this row's mask ahead: its last argmax was
        # refused (or nothing is known yet).
        self.eager = True

    def advance(self, token: int) -> bool:
        """Consume a sampled token; False (and `error` set) when the grammar refuses it."""
        if self.error is None and not self.matcher.consume_token(token):
            self.error = self.matcher.get_error() or f"token {token} is not allowed here"
        return self.error is None

    def allows(self, token: int) -> bool:
        """Whether the grammar accepts `token` next (without consuming it)."""
        return self.error is None and self.matcher.validate_tokens([token]) == 1


class GrammarCompiler:
    def __init__(
        self,
        tokenizer_path: str | Path,
        vocab_size: int,
        eos_ids: Sequence[int],
        cache_size: int = 128,
    ) -> None:
        self.tokenizer = llg_tokenizer(tokenizer_path, vocab_size, eos_ids)
        self.vocab_size = vocab_size
        self.cache_size = cache_size
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._limits = llguidance.LLParserLimits(**_LIMITS)
        self.compiles = 0
        self.hits = 0

    def compiled(self, grammar: str) -> llguidance.LLMatcher:
        """The fresh matcher of `grammar` (cached, least recently used out). ValueError when
        it does not compile."""
        m = self._compiled.get(grammar)
        if m is not None:
            self._compiled.move_to_end(grammar)
            self.hits += 1
            return m
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=self._limits)
        if m.is_error():
            raise ValueError(f"the output constraint does not compile: {m.get_error()}")
        self.compiles += 1
        self._compiled[grammar] = m
        while len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)
        return m

    def state(self, constraint: Constraint, output_ids: Sequence[int] = ()) -> GrammarState:
        """A matcher for `constraint` that has consumed `output_ids` (what the request already
        generated). ValueError when the grammar does not compile or refuses those tokens."""
        m = self.compiled(constraint.grammar).deep_copy()
        if output_ids and not m.consume_tokens(list(output_ids)):
            raise ValueError(
                f"the output so far does not match the {constraint.kind} constraint: "
                f"{m.get_error()}"
            )
        return GrammarState(m)


class Pending:
    """The masks of one step: `ahead` rows computed by `future` while the model runs, `later`
    rows (lazy greedy rows) left for after it."""

    __slots__ = ("ahead", "future", "later")

    def __init__(self, future: Future | None, ahead: list, later: list) -> None:
        self.future = future
        self.ahead: list[tuple[int, GrammarState]] = ahead
        self.later: list[tuple[int, GrammarState]] = later


class TokenMasks:
    """The token bitmask of a step's constrained rows and its application to the logits."""

    def __init__(self, vocab_size: int, threads: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._buf = np.zeros((0, self.words), dtype=np.int32)
        self._shifts: dict[torch.device, torch.Tensor] = {}
        self.seconds = 0.0  # wall time spent waiting for masks after the model ran
        self.compute_seconds = 0.0  # wall time the helper thread spent computing masks
        self.steps = 0  # steps with a constrained row
        self.rows = 0  # rows masked
        self.settled = 0  # of them, greedy rows the greedy head's masked settle answered
        self.walked = 0  # refused lazy rows settled by walking their top tokens (no mask)
        self.late = 0  # masks computed after the model ran (lazy rows whose argmax was refused)
        self.computed = 0  # masks computed in all (ahead and late)

    def start(self, states: Sequence[GrammarState | None], lazy: bool = False) -> Pending | None:
        """Begin computing the masks of the rows with a state (on a helper thread); None when no
        row has one. lazy (greedy steps only): rows whose last argmax their grammar allowed are
        left to `fix_greedy`, which validates the new argmax first. Call `apply`, `fix_greedy`
        or `wait` before the states advance."""
        rows = [(i, s) for i, s in enumerate(states) if s is not None]
        if not rows:
            return None
        n = len(states)
        if self._buf.shape[0] < n:
            self._buf = np.zeros((max(n, 2 * self._buf.shape[0]), self.words), dtype=np.int32)
        ahead = [(i, s) for i, s in rows if s.eager or not lazy]
        later = [(i, s) for i, s in rows if lazy and not s.eager]
        self.steps += 1
        pairs = [(s.matcher, i) for i, s in ahead]
        return Pending(self._pool.submit(self._compute, pairs) if ahead else None, ahead, later)

    def _compute(self, pairs: list) -> None:
        """Masks of (matcher, buffer row) pairs into the buffer (llguidance's parallel
        executor, without the GIL)."""
        if not pairs:
            return
        t0 = time.perf_counter()
        self.computed += len(pairs)
        buf = self._buf
        self.executor.unsafe_compute_mask_ptr(pairs, buf.ctypes.data, self.words * 4, buf.shape[0])
        self.compute_seconds += time.perf_counter() - t0

    def wait(self, pending: Pending | None) -> None:
        """Wait for the masks of `start` (the time the model did not hide is counted); raises
        what computing them raised."""
        if pending is None or pending.future is None:
            return
        t0 = time.perf_counter()
        pending.future.result()
        self.seconds += time.perf_counter() - t0

    def _complete(self, pending: Pending, rows: list[tuple[int, GrammarState]]) -> None:
        """Compute the masks of some of `pending`'s later rows now (after the model ran)."""
        self.wait(pending)
        t0 = time.perf_counter()
        self._compute([(s.matcher, i) for i, s in rows])
        self.seconds += time.perf_counter() - t0
        self.late += len(rows)

    def _bits(self, row: int) -> np.ndarray:
        """Row `row` of the last masks as one bool per token id (vocab_size)."""
        packed = self._buf[row].view(np.uint8)
        return np.unpackbits(packed, bitorder="little")[: self.vocab_size].view(np.bool_)

    def _count(self, row: int) -> int:
        """How many tokens row `row` of the last masks allows (a popcount of its words)."""
        return int(np.bitwise_count(self._buf[row].view(np.uint32)).sum())

    def _ids(self, row: int) -> np.ndarray:
        """The token ids row `row` of the last masks allows, ascending: only its nonzero words
        are expanded (a sparse row's few ids without unpacking the whole vocabulary)."""
        words = self._buf[row].view(np.uint32)
        nonzero = np.flatnonzero(words)
        bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little")
        at, bit = np.nonzero(bits.reshape(len(nonzero), 32))
        ids = nonzero[at] * 32 + bit
        return ids[ids < self.vocab_size]

    def allows(self, row: int, token: int) -> bool:
        word = int(self._buf[row, token >> 5])
        return 0 <= token < self.vocab_size and bool((word >> (token & 31)) & 1)

    @torch.inference_mode()
    def apply(self, logits: torch.Tensor, pending: Pending | None, rows=None) -> None:
        """Wait for the masks of `start` and set every disallowed logit of those rows to -inf,
        in place. logits: [rows, >= vocab_size] (columns past the vocabulary are disallowed).
        rows: (mask row, logits row) pairs when logits holds only some rows (default: the
        mask rows, same index)."""
        if pending is None:
            return
        self.wait(pending)
        if rows is None:
            if pending.later:  # (lazy rows are for greedy steps; a sampled one needs all)
                self._complete(pending, pending.later)
                pending.ahead, pending.later = pending.ahead + pending.later, []
            rows = [(i, i) for i, _ in pending.ahead]
        self.rows += len(rows)
        v = self.vocab_size
        if logits.is_cuda:
            # One elementwise pass on the device beats moving index lists there.
            self._apply_dense(logits, rows)
            return
        # On CPU a full pass over 129k logits per row costs more than the step's other vocabulary
        # work: touch only the few allowed (sparse masks) or the few refused (dense ones).
        for m, r in rows:
            bits = self._bits(m)
            row = logits[r]
            row[v:] = float("-inf")
            allowed = int(np.count_nonzero(bits))
            if 2 * allowed < v:
                keep = torch.from_numpy(np.flatnonzero(bits))
                kept = row.index_select(0, keep)
                row[:v] = float("-inf")
                row.index_copy_(0, keep, kept)
            elif allowed < v:
                row.index_fill_(0, torch.from_numpy(np.flatnonzero(~bits)), float("-inf"))

    def _apply_dense(self, logits: torch.Tensor, rows) -> None:
        dev = logits.device
        shifts = self._shifts.get(dev)
        if shifts is None:
            shifts = self._shifts[dev] = torch.arange(32, dtype=torch.int32, device=dev)
        src = torch.tensor([r for r, _ in rows], dtype=torch.long)
        dst = torch.tensor([r for _, r in rows], dtype=torch.long, device=dev)
        words = torch.from_numpy(self._buf[src.numpy()]).to(dev, non_blocking=True)
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1).bool()
        v = min(logits.shape[1], allowed.shape[1])
        masked = logits.index_select(0, dst)
        masked[:, :v].masked_fill_(~allowed[:, :v], float("-inf"))
        masked[:, v:] = float("-inf")
        logits.index_copy_(0, dst, masked)

    def fix_greedy(
        self, tokens: list[int], pending: Pending | None, head, masked=None
    ) -> list[int]:
        """Greedy tokens of a step whose rows took the argmax-only head: a constrained row
        keeps its argmax when the grammar allows it (it is then also the masked argmax: the
        first maximum among the allowed tokens); otherwise the argmax of its allowed tokens'
        logits. head(rows, token_ids): logits [len(rows), len(token_ids) or vocab] of those rows
        (token_ids None: the whole vocabulary). A refused row takes the greedy head's masked
        settle where `masked` (StepOutput.masked_greedy) answers; otherwise few allowed tokens
        (a JSON structure position) take only their own logits, many (inside a string) a
        full row, masked. Rows are those of `start`."""
        if pending is None:
            return tokens
        self.wait(pending)
        # A later row's argmax is validated by its matcher; a refused one first walks its
        # largest approximate logits with the matcher (MaskedGreedy.walk: microseconds a
        # token), and only one the walk cannot settle computes its mask (milliseconds inside
        # a bounded string) and is computed ahead next step.
        refused = [(i, s) for i, s in pending.later if not s.allows(tokens[i])]
        for _, s in pending.later:
            s.eager = False
        if refused and masked is not None:
            v = self.vocab_size  # (a padded head's extra rows are never allowed)
            walked = [(i, masked.walk(i, lambda t, s=s: t < v and s.allows(t))) for i, s in refused]
            self.walked += sum(tok is not None for _, tok in walked)
            for i, tok in walked:
                if tok is not None:
                    tokens[i] = tok
            refused = [(i, s) for (i, s), (_, tok) in zip(refused, walked, strict=True)
                       if tok is None]  # fmt: skip
        if refused:
            self._complete(pending, refused)
        need = []
        for i, s in pending.ahead + refused:
            s.eager = not self.allows(i, tokens[i])
            if s.eager:
                need.append(i)
        words = self._buf[need]  # (a copy: their masks, read once)
        if need:  # (an empty mask: a matcher in error; the engine drops its constraint)
            some = words.any(1)
            need, words = [i for i, any_ in zip(need, some, strict=True) if any_], words[some]
        self.rows += len(need)
        if need and masked is not None:
            # The greedy head's own approximate logits settled again under each mask: exact,
            # and no fp32 row of the vocabulary (kernels.greedy_masked).
            won = masked(need, words, self.vocab_size)
            self.settled += sum(tok is not None for tok in won)
            for i, tok in zip(need, won, strict=True):
                if tok is not None:
                    tokens[i] = tok
            need = [i for i, tok in zip(need, won, strict=True) if tok is None]
        dense, sparse = [], []
        for i in need:
            if self._count(i) > _SPARSE_TOKENS:
                dense.append(i)
            else:
                sparse.append((i, self._ids(i)))
        if sparse:
            # One head call for every sparse row, over the union of their allowed tokens.
            union = np.unique(np.concatenate([a for _, a in sparse]))
            logits = head([i for i, _ in sparse], torch.from_numpy(union))
            for (i, allowed), row in zip(sparse, logits, strict=True):
                cols = torch.from_numpy(np.searchsorted(union, allowed))
                tokens[i] = int(allowed[int(row.index_select(0, cols).argmax())])
        if dense:
            logits = head(dense, None)
            self.apply(logits, pending, list(zip(dense, range(len(dense)), strict=True)))
            for i, tok in zip(dense, logits.max(-1).indices.tolist(), strict=True):
                tokens[i] = tok
        return tokens
