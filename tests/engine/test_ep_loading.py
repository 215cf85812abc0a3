"""A rank of an expert-parallel group loads only its own routed experts from the checkpoint:
the other experts' tensors need not even be in the file, the rank's expert tensors are exactly
the full model's rows of its slots, and everything else is the full model's."""

from __future__ import annotations

import pytest
import torch
from deepring.ep.group import rank_slots
from deepring.model.loader import load_model
from ep_helpers import SEED, save_per_expert
from v4_helpers import model_config, ours


@pytest.mark.parametrize(("n_ranks", "rank", "n_redundant"), [(2, 1, 0), (4, 2, 4)])
def test_a_rank_loads_its_experts_and_nothing_else(tmp_path, n_ranks, rank, n_redundant):
    config = model_config("swa-csa-hca")
    full = ours(config, seed=SEED)
    slots = rank_slots(config.n_routed_experts, n_ranks, rank, n_redundant)
    # The checkpoint holds only this rank's experts (MTP layers keep all of theirs): a load of
    # the whole model fails, the rank's load does not miss anything.
    save_per_expert(full, tmp_path, keep=set(slots))
    with pytest.raises(ValueError, match=r"has shape|lack"):
        load_model(tmp_path, dtype="float32", progress=False)
    part = load_model(tmp_path, dtype="float32", progress=False, experts=slots).model
    want, got = full.state_dict(), part.state_dict()
    assert set(got) == set(want)
    rows = torch.tensor(slots)
    assert len(slots) == (config.n_routed_experts + n_redundant) // n_ranks
    for name, t in want.items():
        if name.startswith("model.layers.") and name.endswith(("gate_up_proj", "down_proj")):
            assert (
                got[name].shape[0]
                == len(slots)
                == (config.n_routed_experts + n_redundant) // n_ranks
            )
            assert torch.equal(got[name], t[rows]), name
        else:
            assert torch.equal(got[name], t), name


def test_a_fused_checkpoint_is_cut_to_the_ranks_experts(tmp_path):
    """The transformers layout fuses a layer's experts: read, then cut to the slots."""
    from deepring.model.weights import save_checkpoint

    config = model_config("swa-csa-hca")
    full = ours(config, seed=SEED)
    save_checkpoint(full, tmp_path, config.to_hf_dict())
    slots = rank_slots(config.n_routed_experts, 2, 0, 2)
    part = load_model(tmp_path, dtype="float32", progress=False, experts=slots).model
    name = "model.layers.1.mlp.experts.down_proj"
    assert torch.equal(part.state_dict()[name], full.state_dict()[name][torch.tensor(slots)])
