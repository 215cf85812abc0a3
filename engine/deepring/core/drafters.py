"""Drafters for speculative decoding (core.speculative), behind one small interface:

- `observe(out, fed)`: after a step, read what the target computed for each request's rows
  that stay (fed: (request, first position, rows, first batch row)) and keep the drafter's own
  context state. Only accepted rows are ever fed, so a drafter's state never needs a rollback.
- `propose(reqs) -> Proposal`: drafts for the tokens after each request's last token, with
  the calibrated prefix survival of each (None without a confidence head).

`MTPDrafter`: V4's MTP layer, one token. Row t of the MTP layer reads the backbone's final
streams at t and the embedding of token t + 1, and predicts token t + 2; its window ring is the
pool's layer after the backbone. Each step it runs over the fed rows (their next tokens are
known once the step's tokens are appended), and its last row's argmax is the next draft.

`DSparkContext`: the DSpark drafter (model.dspark). Its context is, per stage, the K=V rows of
the target's fused taps at the last `sliding_window` positions: kept in the window rings the
pool already has for the stages' layers (the MTP slots), written for fed rows only. A draft
block is [anchor, noise...] at the last token's position, attending to that ring.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from deepring.cache.pool import KVCachePool
from deepring.config import SpecMode
from deepring.core.request import Request
from deepring.kernels.greedy_head import GreedyArgmax, packed_linear
from deepring.model.batch import ForwardBatch, SeqChunk
from deepring.model.config import ModelConfig
from deepring.model.model import DeepseekV4, StepOutput
from deepring.spec.calibrate import apply_temperatures, cumulative, fit_temperatures

# Requests x drafts up to which a block's logits come from one bf16 GEMM (else the greedy head
# per position: measured on the 2-core dev machine, the GEMM wins for one request only).
SMALL_BLOCK = 8
Fed = list[tuple[Request, int, int, int]]  # (request, first position, rows, first batch row)


@dataclass
class Proposal:
    drafts: list[list[int]]
    survival: list[list[float]] | None = None  # calibrated P(draft k and all before accepted)


class MTPDrafter:
    kind = "mtp"  # names the ring snapshots that hold its window (cache.prefix.ring_key)
    taps: tuple[int, ...] = ()
    wants_hidden = True
    schedules = False

    def __init__(self, model: DeepseekV4, pool: KVCachePool) -> None:
        self.model = model
        self.pool = pool
        self._next: dict[int, int] = {}  # id(request) -> its draft from the last observe

    def observe(self, out: StepOutput, fed: Fed) -> None:
        self._next.clear()
        if not fed or out.hidden is None:
            return
        chunks, rows, last = [], [], []
        for r, start, n, off in fed:
            if r.draft_from is None:
                r.draft_from = start
            chunks.append(
                SeqChunk(
                    r.tokens(start + 1, start + n + 1),
                    start,
                    r.slot,
                    r.blocks,
                    logits="last" if r.pending == 1 else "none",
                )
            )
            rows.extend(range(off, off + n))
            if r.pending == 1:
                last.append(r)
        dev = self.model.device
        batch = ForwardBatch.build(
            chunks, self.model.rope_tables(), self.pool.cache.block_size, dev
        )
        hidden = out.hidden[torch.tensor(rows, device=dev)]
        res = self.model.mtp_forward(batch, self.pool, hidden)
        if last:
            for r, tok in zip(last, res.logits.max(-1).indices.tolist(), strict=True):
                self._next[id(r)] = tok

    def propose(self, reqs: list[Request]) -> Proposal:
        return Proposal([[self._next[id(r)]] if id(r) in self._next else [] for r in reqs])


class DSparkContext:
    kind = "dspark"  # (fixed:N too: the same drafter, the same window rings)
    wants_hidden = False

    def __init__(self, model: DeepseekV4, pool: KVCachePool, fixed: int | None) -> None:
        """fixed: drafts per step (fixed:N); None: the whole block, with survival for the
        scheduler to cut (dspark)."""
        ds = model.config.dspark
        if ds is None:
            raise ValueError("this model has no DSpark drafter")
        self.model = model
        self.drafter = model.mtp
        self.taps = tuple(ds.target_layer_ids)
        n = model.config.num_hidden_layers
        self.rings = [lc.ring for lc in pool.layers[n : n + ds.num_stages]]
        self.window = model.config.sliding_window
        # The drafts are argmax_v (U_k + W2 W1[prev])_v = argmax of one linear map of
        # [h_k ; W1[prev]] by [lm_head | W2]: the greedy head (kernels.greedy_head) finds it
        # without the vocabulary-wide logits, which cost more than the rest of the drafter.
        self._head = GreedyArgmax()
        markov = self.drafter.last.markov_head
        # The candidates (model.dspark.read_draft_vocab): the rows of the head and of W2 the
        # drafter scores; argmaxes are positions in it, mapped back to token ids.
        self._vocab = model.draft_vocab
        head, w2 = model.lm_head.weight, markov.head.weight
        if self._vocab is not None:
            self._vocab = self._vocab.to(head.device)
            head, w2 = head[self._vocab], w2[self._vocab]
        self._w = torch.cat([head, w2.to(model.dtype)], 1)
        self._head.prepare(self._w)
        # One request: the block's base logits U_k in one bf16 GEMM (one read of the head,
        # not one per position), then each position's Markov term (rank-r, cheap) and argmax.
        # A draft is only a proposal, so bf16 logits are as good as exact ones here.
        self._u = packed_linear(head.to(torch.bfloat16))
        # W2 transposed, for one addmm per position onto the block's logits.
        self._w2t = w2.float().t().contiguous()
        self.length = fixed if fixed is not None else ds.block_size
        # Only dspark lets the prefix scheduler cut the drafts by their survival; fixed:N
        # reports it too (calibration is measured on it), and verifies all N.
        self.schedules = fixed is None
        self.calibration = OnlineCalibration(ds.confidence_temperatures, self.length)
        self._conf: dict[int, list[float]] = {}  # id(request) -> its drafts' confidence logits

    @torch.inference_mode()
    def observe(self, out: StepOutput, fed: Fed) -> None:
        if not fed or out.taps is None:
            return
        rows, pos, slots = [], [], []
        for r, start, n, off in fed:
            if r.draft_from is None:
                r.draft_from = start
            rows.extend(range(off, off + n))
            pos.extend(range(start, start + n))
            slots.extend([r.slot] * n)
        dev = out.taps.device
        p = torch.tensor(pos, device=dev)
        rows_t = torch.tensor(rows, device=dev)
        slot_t = torch.tensor(slots, device=dev)
        if out.tapped is not None:
            # V4.1 decoder targets: a prompt's rows before decoder_from have no taps (they lie
            # more than KEEP >= window + backtrack before its end: no block ever sees them).
            have = out.tapped[rows_t]
            rows_t, p, slot_t = rows_t[have], p[have], slot_t[have]
            for r, start, n, off in fed:
                if r.draft_from == start:  # (its context starts at its first tapped row)
                    first = out.tapped[off : off + n].nonzero()
                    r.draft_from = start + (int(first[0]) if len(first) else n)
        kvs = self.drafter.context_kv(out.taps[rows_t], p)
        for ring, kv in zip(self.rings, kvs, strict=True):
            n = ring.shape[1]
            ring.view(-1, ring.shape[-1])[slot_t * n + p % n] = kv.to(ring.dtype)

    @torch.inference_mode()
    def propose(self, reqs: list[Request]) -> Proposal:
        dev = self.rings[0].device
        n = self.rings[0].shape[1]
        anchor_pos = torch.tensor([r.num_tokens - 1 for r in reqs], device=dev)
        anchor_ids = torch.tensor([r.token(r.num_tokens - 1) for r in reqs], device=dev)
        first = torch.tensor([r.draft_from or 0 for r in reqs], device=dev)
        slots = torch.tensor([r.slot for r in reqs], device=dev)
        # Ring row i holds the latest position q < anchor with q % n == i; the block sees the
        # window before its anchor, from the first position this slot's context covers.
        i = torch.arange(n, device=dev)
        before = anchor_pos[:, None] - 1
        q = before - torch.remainder(before - i, n)
        valid = (q >= anchor_pos[:, None] - self.window) & (q >= first[:, None]) & (q >= 0)
        ctx = [ring[slots] for ring in self.rings]
        h, h_conf = self.drafter.draft_block(
            ctx, valid, anchor_ids, anchor_pos, self.model.embed_tokens
        )
        embed = self.drafter.last.markov_head.embed
        prev, prevs, toks = anchor_ids, [], []
        base = None
        if len(reqs) * self.length <= SMALL_BLOCK:
            base = self._u(h[:, : self.length].reshape(-1, h.shape[-1]).to(torch.bfloat16))
            base = base.float().view(len(reqs), self.length, -1)
        for k in range(self.length):
            prevs.append(prev)
            e = embed(prev)
            if base is not None:
                prev = torch.addmm(base[:, k], e.float(), self._w2t).argmax(-1)
            else:
                prev = self._head(torch.cat([h[:, k], e.to(h.dtype)], -1), self._w)
            if self._vocab is not None:
                prev = self._vocab[prev]
            toks.append(prev)
        conf = self.drafter.confidence_logits(h_conf[:, : self.length], torch.stack(prevs, -1))
        drafts = torch.stack(toks, -1).tolist()
        self._conf = dict(zip((id(r) for r in reqs), conf.tolist(), strict=True))
        survival = cumulative(apply_temperatures(conf.float(), self.calibration.temps))
        return Proposal(drafts, survival.tolist())

    def feedback(self, req: Request, verified: int, accepted: int) -> None:
        """How the request's last drafts fared (SpecRunner.verify): calibration data."""
        conf = self._conf.pop(id(req), None)
        if conf is not None and verified > 0:
            self.calibration.add(conf, verified, accepted)


class OnlineCalibration:
    """The confidence head's per-position temperatures, refitted on this engine's own
    verify outcomes (spec.calibrate.fit_temperatures over the last KEEP request-steps); until
    then the checkpoint's (dspark_confidence_temperatures, or 1). Calibration drifts with the
    traffic (the checkpoint's were fitted on its training text), and the prefix scheduler
    trusts the survival as a probability.

    When: after FIRST request-steps, then at twice as many each time up to REFIT, then every
    REFIT new ones. A survival that is wrong from the start costs every step until the first
    fit (tiny-trained's checkpoint temperatures put draft 4's survival at 0.19 where 0.52 of
    them survived on bench/speculative.py's prompts, read by an ad-hoc script, so the
    scheduler cut drafts that would have been accepted and rested the drafter), so the first
    fit comes early; a position keeps its temperature until MIN_SAMPLES outcomes tested it
    (the later positions are tested only when every draft before them survived, so early fits
    see few of them)."""

    FIRST = 32
    REFIT = 256
    KEEP = 4096
    MIN_SAMPLES = 16

    def __init__(self, temps: tuple[float, ...], length: int) -> None:
        t = list(temps[:length]) + [1.0] * max(0, length - len(temps))
        self.temps = torch.tensor(t, dtype=torch.float32)
        self.length = length
        self.samples: deque[tuple[list[float], int, int]] = deque(maxlen=self.KEEP)
        self.new = 0
        self.fits = 0

    def add(self, conf: list[float], verified: int, accepted: int) -> None:
        self.samples.append((conf[: self.length], verified, accepted))
        self.new += 1
        # Fit k (k >= 1) came at FIRST * 2^(k-1) samples in all: the next when that many
        # more arrived.
        due = min(self.FIRST * 2 ** max(self.fits - 1, 0), self.REFIT)
        if self.new < due:
            return
        self.new = 0
        self.fits += 1
        z = torch.tensor([c for c, _, _ in self.samples], dtype=torch.float32)
        g = torch.arange(z.shape[1])
        ver = torch.tensor([v for _, v, _ in self.samples])[:, None]
        acc = torch.tensor([a for _, _, a in self.samples])[:, None]
        # Draft g was tested when it was verified and every draft before it accepted.
        valid = (g[None] < ver) & (g[None] <= acc)
        fitted = fit_temperatures(z, g[None] < acc, valid)
        enough = valid.sum(0) >= self.MIN_SAMPLES
        self.temps = torch.where(enough, fitted, self.temps)


def drafter_problem(mode: SpecMode, config: ModelConfig, name: str) -> str | None:
    """Why model `name` (its config) cannot run speculative `mode` (None: it can): checked
    at start-up, before any weights load."""
    ds = config.dspark
    if mode.kind == "mtp" and (ds is not None or config.num_nextn_predict_layers < 1):
        return f"--speculative mtp needs MTP layers; model {name!r} has " + (
            "a DSpark drafter in their place (use dspark or fixed:N)" if ds else "none"
        )
    if mode.kind in ("fixed", "dspark"):
        if ds is None:
            has_mtp = config.num_nextn_predict_layers > 0
            return f"--speculative {mode} needs a DSpark drafter; model {name!r} has none" + (
                " (it has MTP layers: use --speculative mtp)" if has_mtp else ""
            )
        if mode.kind == "fixed" and mode.length > ds.block_size:
            return (
                f"--speculative {mode}: model {name!r}'s DSpark drafter drafts at most "
                f"{ds.block_size} tokens"
            )
    return None


def make_drafter(mode: SpecMode, model: DeepseekV4, pool: KVCachePool, name: str):
    """The drafter of `mode` for `model` (named `name` in errors). ValueError when the model
    has none for that mode."""
    problem = drafter_problem(mode, model.config, name)
    if problem is not None:
        raise ValueError(problem)
    if mode.kind == "mtp":
        return MTPDrafter(model, pool)
    if mode.kind in ("fixed", "dspark"):
        return DSparkContext(model, pool, mode.length if mode.kind == "fixed" else None)
    raise ValueError(f"no drafter for --speculative {mode}")
