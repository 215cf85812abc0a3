"""The low-precision greedy heads (bf16, oneDNN int8, fbgemm int8, fp16 and our AVX2 int8) against
the fp32 argmax they stand for, and their error bounds against the kernels' actual output
(kernels.greedy_head, kernels.greedy_int8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from deepring.kernels import greedy as greedy_kernels
from deepring.kernels import greedy_head, greedy_int8
from deepring.kernels.dispatch import HAVE_NUMBA
from deepring.kernels.greedy_head import GreedyHead


def _fp32_argmax(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(y, w).argmax(-1)


TILE = greedy_kernels.TILE
HAS_INT8_OP = hasattr(torch.ops.onednn, "qlinear_prepack")


_NO_NUMBA = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")


@pytest.mark.parametrize("vocab", [1000, 1003, 7, 20 * TILE])  # most with a partial last tile
def test_random_rows_match_fp32_argmax(vocab, kind):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(vocab, 64, generator=g)  # fp32 values bf16 cannot hold
    y = torch.randn(300, 64, generator=g) * 3
    assert torch.equal(GreedyHead(kind).argmax(y, w), _fp32_argmax(y, w))


def test_near_ties_below_bf16_resolution_are_settled_in_fp32(kind):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(500, 64, generator=g) * 0.1
    # Tokens 100..139 all have logit ~65 for every row; row i favours token 100 + i by 0.0065,
    # far below what bf16 resolves at 65 (0.5) and far above fp32 rounding (8e-6).
    eps = 1e-4
    for t in range(40):
        w[100 + t] = 1.0
        w[100 + t, t] += eps
    y = torch.ones(40, 64) + torch.eye(40, 64)
    got = GreedyHead(kind).argmax(y, w)
    assert got.tolist() == [100 + i for i in range(40)]
    assert torch.equal(got, _fp32_argmax(y, w))


def test_exact_ties_pick_the_first_token(kind):
    g = torch.Generator().manual_seed(2)
    w = torch.randn(300, 32, generator=g) * 0.1
    w[17] = w[250] = w[123] = torch.ones(32)
    y = torch.ones(4, 32)
    assert GreedyHead(kind).argmax(y, w).tolist() == [17] * 4


def test_the_last_partial_tile_can_win(kind):
    w = torch.zeros(2 * TILE + 3, 8)  # 2 whole tiles and 3 tokens in the partial tile
    w[2 * TILE + 2] = 1.0
    y = torch.ones(3, 8)
    assert GreedyHead(kind).argmax(y, w).tolist() == [2 * TILE + 2] * 3


def test_rows_whose_logits_are_all_negative_or_mixed_in_sign(kind):
    # The max pass orders bf16 values by their bits, which reverses the order of negative
    # values: rows with every logit negative, tiles with negative values only, and -0.0.
    g = torch.Generator().manual_seed(4)
    w = torch.randn(1003, 32, generator=g)
    y = torch.randn(6, 32, generator=g)
    w_neg = w.clone()
    w_neg[:, 0] = -w_neg.abs().sum(-1) - 1.0  # with y[:, 0] = 1 below: every logit < 0
    y_neg = y.clone()
    y_neg[:, 0] = 1.0
    y_neg[:, 1:] *= 0.01
    head = GreedyHead(kind)
    assert (F.linear(y_neg, w_neg) < 0).all()
    assert torch.equal(head.argmax(y_neg, w_neg), _fp32_argmax(y_neg, w_neg))
    w_half = w.clone()
    w_half[:500] = -w_half[:500].abs()  # the first tiles' logits mostly negative
    y_pos = y.abs()
    assert torch.equal(GreedyHead(kind).argmax(y_pos, w_half), _fp32_argmax(y_pos, w_half))
    # The fp32 winner's bf16 logit is negative and every other token of its tile is too, while
    # the bf16 maximum (another tile) is positive: its tile must still be searched.
    # With 2 * TILE tokens, tile 0 holds tokens 0 .. TILE - 1 and tile 1 the rest.
    y1 = torch.tensor([[1.0035, 1, 1, 1, 1, 1, 1, 1]])  # bf16: [1, 1, ...]
    w1 = -torch.ones(2 * TILE, 8)
    # The other tokens of tile 1: logit -2^-9, negative but above the threshold (about -0.02),
    # so the tile cannot be ruled out by comparing bits with the threshold's.
    w1[TILE:] = 0.0
    w1[TILE:, 2] = -(2.0**-9)
    w1[0] = 0.0
    w1[0, 2] = 2.0**-11  # token 0: bf16 and fp32 logit 2^-11
    win = TILE + 1
    w1[win] = 0.0
    w1[win, :3] = torch.tensor([1.0, -1.0, -(2.0**-10)])  # fp32 0.0025, bf16 -2^-10
    assert F.linear(y1.to(torch.bfloat16), w1.to(torch.bfloat16))[0, win] < 0
    assert _fp32_argmax(y1, w1).tolist() == [win]
    assert GreedyHead(kind).argmax(y1, w1).tolist() == [win]
    # The same with the other tokens of tile 1 far below the threshold: the tile's maximum is
    # then known only as "below 0", and the tile must still be searched.
    w1[TILE:] = -1.0
    w1[win] = 0.0
    w1[win, :3] = torch.tensor([1.0, -1.0, -(2.0**-10)])
    assert _fp32_argmax(y1, w1).tolist() == [win]
    assert GreedyHead(kind).argmax(y1, w1).tolist() == [win]
    w_zero = torch.zeros(2 * TILE + 8, 8)
    w_zero[: TILE + 4] = -1.0
    w_zero[TILE + 11] = -0.0
    # Logits are -8 (tokens 0..TILE+3) and 0 (the rest): the first 0 wins.
    assert GreedyHead(kind).argmax(torch.ones(2, 8), w_zero).tolist() == [TILE + 4] * 2


def test_non_finite_rows_fall_back_to_fp32(kind):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(200, 16, generator=g)
    y = torch.randn(3, 16, generator=g)
    y[1, 4] = float("nan")
    assert torch.equal(GreedyHead(kind).argmax(y, w), _fp32_argmax(y, w))


def test_a_changed_weight_is_noticed(kind):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(400, 16, generator=g)
    y = torch.randn(5, 16, generator=g)
    head = GreedyHead(kind)
    assert torch.equal(head.argmax(y, w), _fp32_argmax(y, w))
    with torch.no_grad():
        w.neg_()
    assert torch.equal(head.argmax(y, w), _fp32_argmax(y, w))


def test_without_a_packed_weight_the_plain_gemm_gives_the_same(monkeypatch):
    def unavailable(*_args):
        raise RuntimeError("no packed linear in this build")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", unavailable)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(1003, 32, generator=g)
    y = torch.randn(50, 32, generator=g)
    assert torch.equal(GreedyHead("bf16").argmax(y, w), _fp32_argmax(y, w))
    assert greedy_head._packed_gemm(w.bfloat16())(y.bfloat16()).dtype == torch.bfloat16


def test_rows_of_very_different_size_share_one_int8_scale(kind):
    # The int8 head quantises the batch with one scale: the small rows keep few levels, so their
    # bound is loose and they have more candidates, but the answer is still the fp32 argmax.
    g = torch.Generator().manual_seed(7)
    w = torch.randn(5000, 64, generator=g)
    y = torch.randn(12, 64, generator=g) * torch.logspace(-4, 3, 12)[:, None]
    y[3] = 0.0  # every logit 0: the first token
    w[77] = 0.0  # an all-zero weight row
    got = GreedyHead(kind).argmax(y, w)
    assert torch.equal(got, _fp32_argmax(y, w))
    assert got[3] == 0


def test_the_rounding_of_the_rows_alone_can_reorder_tokens(kind):
    # Weights int8 holds exactly (each row's largest entry is 127), so only the rounding of y
    # separates the approximate logits from the exact ones. With int8's step 1/127: y1 rounds
    # down and y2 up, so token 1 leads the approximate logits (40.16 against 39.76) while
    # token 0 wins in fp32 (40.154 against 39.772).
    y = torch.tensor([[1.0, 50.49 / 127, 50.51 / 127, 0.0]])
    w = torch.tensor([[0.0, 101, 0, 127], [0.0, 0, 100, 127]])
    w = torch.cat([w, torch.zeros(3 * TILE, 4)])
    w[2:, 3] = 127
    assert _fp32_argmax(y, w).tolist() == [0]
    assert GreedyHead(kind).argmax(y, w).tolist() == [0]


def test_rows_with_too_many_candidates_take_their_fp32_logits(kind, monkeypatch):
    # Every token within a hair of every other: each tile reaches the threshold, more than
    # _MAX_TILES of them, so the row takes the plain fp32 GEMM, which must agree.
    g = torch.Generator().manual_seed(8)
    w = torch.ones(300 * TILE, 16) + torch.randn(300 * TILE, 16, generator=g) * 1e-6
    y = torch.randn(3, 16, generator=g).abs()
    calls = []
    real_linear = F.linear
    monkeypatch.setattr(greedy_head.F, "linear", lambda *a: calls.append(1) or real_linear(*a))
    assert torch.equal(GreedyHead(kind).argmax(y, w), _fp32_argmax(y, w))
    assert calls, "the plain fp32 fallback did not run"


@pytest.mark.parametrize("settle", ["torch", pytest.param("numba", marks=_NO_NUMBA)])
@pytest.mark.parametrize("vocab", [2, 3 * TILE + 5])
def test_settling_allows_for_the_bf16_rounding_of_the_output(settle, vocab, monkeypatch):
    # Inputs exact (a = 0): only the output rounding, |approx - exact| <= u'|approx|, separates
    # the logits. Token 0's exact logit 64.25 may show as 64.0 and token 1's 64.248 as 64.5, so
    # token 1 leads the approximate logits, yet token 0 wins; it must be among the candidates
    # (no plain fp32 GEMM is run to find it).
    w = torch.full((vocab, 1), -1000.0)
    w[0], w[vocab - 1] = 64.25, 64.248
    approx = torch.full((1, vocab), -1000.0)
    approx[0, 0], approx[0, vocab - 1] = 64.0, 64.5
    calls = []
    real_linear = F.linear
    monkeypatch.setattr(F, "linear", lambda *a: calls.append(1) or real_linear(*a))
    fn = getattr(greedy_kernels, f"settle_{settle}")
    got = fn(approx.to(torch.bfloat16), torch.zeros(1), torch.ones(1, 1), w)
    assert got.tolist() == [0]
    assert not calls


@pytest.mark.parametrize(("value", "want"), [("fp32", "fp32"), ("bf16", "bf16"), ("BF16", "bf16")])
def test_the_environment_chooses_the_head(monkeypatch, value, want):
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", value)
    assert greedy_head.head_setting() == want


def test_a_bad_or_unavailable_head_choice_is_an_error(monkeypatch):
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "fp8")
    with pytest.raises(ValueError, match="DEEPRING_GREEDY_HEAD must be one of"):
        greedy_head.head_setting()
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "int8")
    monkeypatch.setattr(greedy_head, "cpu_int8_is_fast", lambda: False)
    with pytest.raises(ValueError, match="VNNI or AMX"):
        greedy_head.head_setting()
    monkeypatch.setenv("DEEPRING_GREEDY_HEAD", "auto")
    assert greedy_head.head_setting() == "auto"
    for name in ("cpu_int8_fbgemm", "cpu_fp16_gemm", "cpu_int8_avx2"):
        monkeypatch.setattr(greedy_head, name, lambda: False)
    assert greedy_head.auto_candidates() == ("fp32", "bf16")  # no int8 without VNNI / AMX
    for value, needs in (
        ("int8-fbgemm", "fbgemm's int8"),
        ("fp16", "fbgemm's fp16"),
        ("int8-avx2", "int8 head kernel and AVX2"),
    ):
        monkeypatch.setenv("DEEPRING_GREEDY_HEAD", value)
        with pytest.raises(ValueError, match=needs):
            greedy_head.head_setting()
    monkeypatch.setattr(greedy_head, "cpu_fp16_gemm", lambda: True)
    monkeypatch.setattr(greedy_head, "cpu_int8_fbgemm", lambda: True)
    assert greedy_head.auto_candidates() == ("fp32", "bf16", "fp16", "int8-fbgemm")
    monkeypatch.setattr(greedy_head, "cpu_int8_avx2", lambda: True)
    assert greedy_head.auto_candidates()[-1] == "int8-avx2"


@pytest.mark.parametrize("scale", [1e-3, 1.0, 100.0])  # (within fp16 range: the fp16 head)
def test_the_bound_holds_for_every_logit(kind, scale):
    """The approximate logits the GEMM actually returns are within the bound the settle
    relies on (a + u'|approx|, module docstring of kernels.greedy_head) of the exact logits,
    for rows of very different sizes in one batch and weights with large and tiny rows."""
    g = torch.Generator().manual_seed(10)
    w = torch.randn(3000, 128, generator=g) * torch.logspace(-3, 1, 3000)[:, None]
    w[5] = 0.0
    y = torch.randn(33, 128, generator=g) * scale * torch.logspace(-2, 2, 33)[:, None]
    y[7, ::3] = 0.0
    head = GreedyHead(kind)
    head.prepare(w)
    approx, a = head._logits(y)
    exact = y.double() @ w.double().T
    err = (approx.double() - exact).abs()
    room = a.double()[:, None] + greedy_kernels.U_OUT * approx.double().abs()
    assert bool((err <= room).all()), float((err - room).max())
    assert torch.equal(head.argmax(y, w), _fp32_argmax(y, w))


@pytest.mark.skipif(not greedy_head.cpu_fp16_gemm(), reason="no fbgemm fp16 GEMM")
def test_a_weight_past_fp16s_range_is_left_to_the_other_heads(monkeypatch):
    w = torch.randn(300, 16)
    w[3, 2] = 1e5
    with pytest.raises(ValueError, match="fp16's range"):
        GreedyHead("fp16").prepare(w)
    monkeypatch.setattr(greedy_head, "head_setting", lambda: "auto")
    monkeypatch.setattr(greedy_head, "cached_choice", lambda _shape, _kinds, run: run())
    argmax = greedy_head.GreedyArgmax()
    y = torch.randn(2, 16)
    assert torch.equal(argmax(y, w), _fp32_argmax(y, w))
    assert "fp16" not in argmax.choice.seconds
    big = torch.randn(2, 16)
    big[0, 0] = 1e6  # a row past fp16's range: the plain fp32 path
    w2 = torch.randn(300, 16)
    assert torch.equal(GreedyHead("fp16").argmax(big, w2), _fp32_argmax(big, w2))


def test_an_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="int8"):
        GreedyHead("fp8")


@pytest.mark.parametrize("rows", [1, 5, 40])  # 40: the fp32 path runs in vocabulary tiles
def test_model_greedy_tokens_agree_with_and_without_the_fast_head(monkeypatch, rows, kind):
    from deepring.model.loader import load_model
    from deepring.model.tiny import tiny_config

    if kind == "int8" and rows == 40:
        # The int8 GEMM's multi-row path is the 5-row case's; oneDNN's int8 linear takes ~17 s
        # for 40 rows of the 129k-row head on some CPUs (AMD EPYC), twice per run of the suite.
        pytest.skip("int8 at 40 rows: covered by 5 rows (and slow on some CPUs)")

    net = load_model(tiny_config(), load_format="dummy", progress=False).model
    h = torch.randn(rows, net.config.hc_mult, net.config.hidden_size, generator=_gen(6))
    with torch.inference_mode():
        monkeypatch.setattr(greedy_head, "head_setting", lambda: kind)
        fast = net.greedy_tokens(h)
        assert net._greedy._used is not None
        assert net._greedy._used.kind == kind
        monkeypatch.setattr(greedy_head, "head_setting", lambda: "fp32")
        plain = net.greedy_tokens(h)
        assert net._greedy._used is None
        want = net.logits(h).argmax(-1)
    assert torch.equal(plain, want)
    assert torch.equal(fast, want)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
def test_int8_quantisation_numba_equals_torch():
    g = torch.Generator().manual_seed(9)
    y = torch.randn(7, 40, generator=g) * torch.logspace(-2, 2, 7)[:, None]
    q_t, x_t, a_t = greedy_kernels.quantize_rows_torch(y, 0.25, 3.0)
    q_n, x_n, a_n = greedy_kernels.quantize_rows_numba(y, 0.25, 3.0)
    assert x_n == x_t
    assert torch.equal(q_n, q_t)
    torch.testing.assert_close(a_n, a_t, rtol=1e-5, atol=0)
    y[2, 5] = float("inf")
    assert greedy_kernels.quantize_rows_numba(y, 0.25, 3.0) is None
    assert greedy_kernels.quantize_rows_torch(y, 0.25, 3.0) is None
    y[2, 5] = float("nan")
    assert greedy_kernels.quantize_rows_numba(y, 0.25, 3.0) is None
    zero = greedy_kernels.quantize_rows_numba(torch.zeros(2, 4), 0.25, 3.0)
    assert zero[1] == 1.0
    assert not zero[0].any()


@pytest.mark.skipif(not greedy_int8.cpu_int8_avx2(), reason="no AVX2 for the int8-avx2 kernel")
def test_int8_avx2_candidates_are_the_tokens_that_reach_the_threshold():
    """The kernel's candidates through the binding against its own approximate logits: every
    token within 2a of its row's best, for bounds from exact ties only to wide."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(3 * 1024 + 5, 40, generator=g)
    y = torch.randn(19, 40, generator=g) * torch.logspace(-1, 1, 19)[:, None]
    head = greedy_int8.Int8Avx2Logits(w)
    q, x, a = head._quantize(y)
    a = a.double() * torch.linspace(0, 30, 19, dtype=torch.double)
    qb, xb = q.numpy().tobytes(), x.numpy().tobytes()
    raw = head._head.logits(qb, 19, xb, 2)
    approx = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(19, -1)
    best, lost, rows, tokens, values = head._head.candidates(qb, 19, xb, a.numpy().tobytes(), 2)
    # One part, and three (on torch's OpenMP team where this torch loaded libgomp), agree.
    for threads in (1, 3):
        again = head._head.candidates(qb, 19, xb, a.numpy().tobytes(), threads)
        assert again == (best, lost, rows, tokens, values)
    assert torch.equal(torch.frombuffer(bytearray(best), dtype=torch.float32), approx.amax(-1))
    assert not any(lost)
    r = torch.from_numpy(np.frombuffer(rows, np.uint32).astype(np.int64))
    j = torch.from_numpy(np.frombuffer(tokens, np.uint32).astype(np.int64))
    reach = approx.double() >= (approx.amax(-1).double() - 2 * a)[:, None]
    assert torch.equal(torch.stack([r, j], 1), reach.nonzero())  # by row, then token
    assert torch.equal(torch.frombuffer(bytearray(values), dtype=torch.float32), approx[r, j])
    with pytest.raises(ValueError, match="row values"):
        head._head.candidates(bytes([64]) * 40, 1, xb[:4], bytes(8), 1)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")
@pytest.mark.skipif(not greedy_int8.cpu_int8_avx2(), reason="no AVX2 for the int8-avx2 kernel")
def test_int8_avx2_row_quantisation_numba_equals_torch(monkeypatch):
    """The numba quantisation against the torch path's: the same scales up to the last bit
    (numba may divide through a reciprocal), the same values wherever the rounding is not
    within that bit of a half, and the bound from its own values as the torch path computes it
    from them."""
    g = torch.Generator().manual_seed(12)
    head = greedy_int8.Int8Avx2Logits(torch.randn(300, 40, generator=g))
    y = torch.randn(7, 40, generator=g) * torch.logspace(-2, 2, 7)[:, None]
    y[3] = 0.0  # scale 1, every value 0
    q, x, a = head._quantize(y)
    monkeypatch.setattr(greedy_int8, "use_numba", lambda *_: False)
    q_t, x_t, _ = head._quantize(y)
    torch.testing.assert_close(x, x_t, rtol=2.0**-23, atol=0)
    assert x[3] == 1.0
    assert int((q.int() - q_t.int()).abs().max()) <= 1
    assert float((q != q_t).float().mean()) < 0.01
    lp = q.float() * x[:, None]
    r = torch.linalg.vector_norm(y - lp, dim=-1)
    res_term = head.res_max + 2.0**-20 * head.lp_max
    want = (torch.linalg.vector_norm(y, dim=-1) + r) * res_term + r * head.w_max
    torch.testing.assert_close(a, want, rtol=1e-5, atol=0)
    for bad in (float("inf"), float("nan")):
        y[2, 5] = bad
        for numba in (True, False):
            monkeypatch.setattr(greedy_int8, "use_numba", lambda *_, n=numba: n)
            assert head._quantize(y) is None
