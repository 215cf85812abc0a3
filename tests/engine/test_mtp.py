"""The MTP layer: loaded with the model, run over its own cache; chunked == whole."""

from __future__ import annotations

import itertools

import torch
from deepring.model.batch import ForwardBatch, SeqChunk
from v4_helpers import model_config, ours, pool_for


def _mtp_logits(model, ids: list[int], cuts: list[int]) -> torch.Tensor:
    """Backbone then MTP, chunk by chunk: MTP row t sees backbone streams at t and token t+1."""
    pool = pool_for(model, num_blocks=16, block_size=16)
    blocks = [1, 2, 3, 4]
    out = []
    bounds = [0, *cuts, len(ids) - 1]
    for a, b in itertools.pairwise(bounds):
        chunk = SeqChunk(ids[a:b], a, 0, blocks, logits="all")
        batch = ForwardBatch.build([chunk], model.rope_tables(), 16, model.device)
        hidden = model(batch, pool, return_hidden=True).hidden
        nxt = SeqChunk(ids[a + 1 : b + 1], a, 0, blocks, logits="all")
        mbatch = ForwardBatch.build([nxt], model.rope_tables(), 16, model.device)
        out.append(model.mtp_forward(mbatch, pool, hidden).logits)
    return torch.cat(out)


def test_mtp_chunked_equals_whole_and_is_wired():
    model = ours(model_config("csa-first", num_nextn_predict_layers=1), seed=2)
    assert len(model.mtp) == 1
    ids = torch.randint(0, 512, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    whole = _mtp_logits(model, ids, [])
    assert whole.shape == (44, 512)
    assert torch.isfinite(whole).all()
    torch.testing.assert_close(_mtp_logits(model, ids, [5, 6, 30]), whole, atol=2e-5, rtol=0)
    torch.testing.assert_close(
        _mtp_logits(model, ids, list(range(1, 44))), whole, atol=2e-5, rtol=0
    )
    # The MTP weights matter to the draft and nothing else.
    with torch.no_grad():
        model.mtp[0].e_proj.weight.mul_(-1)
    assert not torch.allclose(_mtp_logits(model, ids, []), whole, atol=1e-3)
