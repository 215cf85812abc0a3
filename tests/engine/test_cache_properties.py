"""Serving-cache properties: chunked == unchunked, batched == alone, scattered blocks ==
contiguous, reused slots and blocks carry nothing over, and the allocator's bookkeeping."""

from __future__ import annotations

import pytest
import torch
from deepring.cache.allocator import BlockAllocator, OutOfBlocks, SlotAllocator
from deepring.model.batch import SeqChunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from v4_helpers import model_config, ours, pool_for, prefill_logits, step

ATOL = 2e-5


@pytest.fixture(scope="module")
def model():
    # Small window and ratios so that short sequences cross many window, entry and block edges.
    return ours(model_config("swa-csa-hca"), seed=7)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def reference(model):
    ids = _ids(75, 0)
    return ids, prefill_logits(model, ids)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(splits=st.lists(st.integers(1, 74), max_size=6))
def test_chunked_prefill_equals_unchunked(model, reference, splits):
    ids, ref = reference
    got = prefill_logits(model, ids, splits=splits)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_token_by_token_equals_unchunked(model, reference):
    ids, ref = reference
    got = prefill_logits(model, ids, splits=range(1, len(ids)))
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_scattered_blocks_equal_contiguous(model, reference):
    ids, ref = reference
    pool = pool_for(model, num_blocks=64, block_size=16)
    scattered = [41, 3, 57, 12, 30]  # any order, any gaps
    got = prefill_logits(model, ids, pool=pool, splits=[13, 40, 41], blocks=scattered)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_block_size_does_not_change_results(model, reference):
    ids, ref = reference
    for bs in (8, 32):
        pool = pool_for(model, num_blocks=32, block_size=bs)
        torch.testing.assert_close(
            prefill_logits(model, ids, pool=pool, splits=[20]), ref, atol=ATOL, rtol=0
        )


def test_mixed_batch_equals_each_alone(model):
    """Requests at different phases (fresh prefill, mid-prompt chunk, decode) share steps; every
    request's logits equal those it gets running alone."""
    prompts = [_ids(n, 10 + n) for n in (33, 9, 50, 1, 20)]
    plans = [  # chunk cut points per request; one cut per step, requests join at different steps
        [33, 34, 35, 36, 37],
        [4, 9, 10, 11, 12, 13],
        [0, 17, 50, 51, 52],
        [0, 0, 1, 2, 3, 4],
        [0, 0, 0, 20, 21],
    ]
    extra = _ids(8, 99)  # tokens fed after each prompt ("decoded" tokens)
    seqs = [p + extra for p in prompts]

    def run(which: list[int]) -> dict[tuple[int, int], torch.Tensor]:
        pool = pool_for(model, num_blocks=64, num_slots=8, block_size=16)
        got = {}
        done = dict.fromkeys(which, 0)
        for t in range(6):
            chunks, owners = [], []
            for r in which:
                plan = plans[r]
                if t >= len(plan) or plan[t] <= done[r]:
                    continue
                a, b = done[r], plan[t]
                blocks = [1 + 8 * r + i for i in range(8)]
                chunks.append(SeqChunk(seqs[r][a:b], a, slot=r, block_ids=blocks, logits="all"))
                owners.append((r, a, b))
                done[r] = b
            if not chunks:
                continue
            logits = step(model, pool, chunks)
            row = 0
            for r, a, b in owners:
                for pos in range(a, b):
                    got[(r, pos)] = logits[row]
                    row += 1
        return got

    together = run(list(range(5)))
    for r in range(5):
        alone = run([r])
        assert alone.keys() == {k for k in together if k[0] == r}
        for k, v in alone.items():
            torch.testing.assert_close(together[k], v, atol=ATOL, rtol=0)


def test_reused_slot_and_blocks_carry_nothing_over(model, reference):
    ids, ref = reference
    pool = pool_for(model, num_blocks=16, num_slots=1, block_size=16)
    blocks = [1, 2, 3, 4, 5]
    prefill_logits(model, _ids(75, 123), pool=pool, splits=[30], blocks=blocks)  # dirty them
    got = prefill_logits(model, ids, pool=pool, splits=[7, 50], blocks=blocks)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_ring_longer_than_window_changes_nothing(model, reference):
    ids, ref = reference
    pool = pool_for(model, backtrack=5)
    torch.testing.assert_close(
        prefill_logits(model, ids, pool=pool, splits=[3, 4, 60]), ref, atol=ATOL, rtol=0
    )


def test_bad_chunks_are_rejected(model):
    pool = pool_for(model, block_size=16)
    with pytest.raises(ValueError, match="blocks"):
        step(model, pool, [SeqChunk(_ids(20, 1), 0, 0, [1])])
    with pytest.raises(ValueError, match="at least one token"):
        step(model, pool, [SeqChunk([], 0, 0, [1])])


# ---- allocator bookkeeping ----------------------------------------------------------------------


def test_block_allocator_refcounts():
    a = BlockAllocator(6)
    assert a.num_free == 5  # block 0 is reserved
    x = a.allocate(3)
    assert 0 not in x
    assert len(set(x)) == 3
    a.share(x[:2])
    assert a.refcount(x[0]) == 2
    assert a.free(x) == [x[2]]  # shared blocks survive one free
    assert a.num_free == 3
    assert sorted(a.free(x[:2])) == sorted(x[:2])
    assert a.num_free == 5
    with pytest.raises(ValueError, match="not allocated"):
        a.free([x[0]])
    with pytest.raises(ValueError, match="not allocated"):
        a.share([x[0]])
    with pytest.raises(OutOfBlocks):
        a.allocate(6)
    with pytest.raises(ValueError, match="not allocated"):
        a.free([0])


def test_slot_allocator():
    s = SlotAllocator(2)
    a, b = s.allocate(), s.allocate()
    assert {a, b} == {0, 1}
    with pytest.raises(OutOfBlocks):
        s.allocate()
    s.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        s.free(a)
    assert s.allocate() == a


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=6),
    st.sampled_from([(4, True), (2, True), (8, False), (16, False)]),
)
def test_decode_compress_plan_equals_the_general_one(positions, shape):
    """A decode step's compressor plan is built from ints; it must hold what the general
    builder computes for the same batch."""
    from deepring.model.batch import ForwardBatch
    from deepring.model.rope import RopeTables

    ratio, overlap = shape
    bs = 16
    chunks = [
        # Slots and blocks out of order, so that a mix-up of request and slot shows.
        SeqChunk([5], p, slot=7 - i, block_ids=[100 + 10 * i + b for b in range(p // bs + 1)])
        for i, p in enumerate(positions)
    ]
    batch = ForwardBatch.build(chunks, RopeTables(model_config("swa-csa-hca")), bs, "cpu")
    keep, keep_dest = batch.tail_rows(2 * ratio if overlap else ratio)
    fast = batch._decode_compress_plan(ratio, overlap, keep_dest)
    slow = batch._general_compress_plan(ratio, overlap, keep, keep_dest)
    assert fast.entry_seq.tolist() == [i for i, p in enumerate(positions) if (p + 1) % ratio == 0]
    for name in ("entry_seq", "from_chunk", "chunk_row", "state_row", "valid", "dest",
                 "rope_pos", "keep_dest", "tail_row"):  # fmt: skip
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert (fast.chunk_only, fast.all_valid) == (slow.chunk_only, slow.all_valid)


@given(
    prompt=st.lists(st.integers(0, 99), min_size=1, max_size=12),
    output=st.lists(st.integers(100, 199), max_size=12),
    data=st.data(),
)
def test_request_tokens_is_a_slice_of_prompt_then_output(prompt, output, data):
    from deepring.core.request import Request
    from deepring.sampling.params import SamplingParams

    req = Request(0, prompt, SamplingParams(), 0, output_ids=list(output))
    total = len(prompt) + len(output)
    start = data.draw(st.integers(0, total))
    end = data.draw(st.integers(start, total))
    assert req.tokens(start, end) == (prompt + output)[start:end]
