"""The memory plan `deepring serve` prints: its weight bytes equal those of the loaded model
(replicated parts and routed experts apart), a rank of an EP group holds (E + K) / N of the
experts, the KV bytes are the pool's own, and a device that cannot hold its workers is a clear
error before anything starts."""

from __future__ import annotations

import re

import pytest
import torch
from deepring import cli
from deepring.cache.pool import CacheConfig, KVCachePool
from deepring.config import EngineSpec, EPConfig, WorkerConfig
from deepring.core import memory_plan
from deepring.model.loader import load_model

SPEC = EngineSpec(model="tiny", device="cpu", max_num_seqs=4, max_model_len=512)


def _workers(n: int, ep: int = 1, redundant: int = 0) -> tuple[WorkerConfig, ...]:
    def rank(i: int) -> EPConfig | None:
        if ep == 1:
            return None
        return EPConfig(ep, i % ep, i // ep, "tcp://127.0.0.1:1", redundant)

    return tuple(
        WorkerConfig(role="prefill", index=i, frontend_addrs=("ipc:///x",), engine=SPEC, ep=rank(i))
        for i in range(n)
    )


@pytest.fixture(scope="module")
def tiny():
    try:
        yield load_model("tiny", device="cpu", progress=False)
    finally:
        torch.set_flush_denormal(False)  # (the CPU set-up flushes denormals process-wide)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_bytes_are_the_loaded_models(tiny, dtype):
    from deepring.model.weights import cast_for_inference

    model = tiny.model
    if dtype != torch.float32:
        model = load_model("tiny", device="cpu", progress=False).model
        cast_for_inference(model, dtype)
    experts = _bytes(
        t
        for layer in model.model.layers
        for t in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj)
    )
    everything = _bytes(model.parameters()) + _bytes(model.buffers())
    got = memory_plan.model_bytes(tiny.config, dtype)
    assert got.experts == experts
    assert got.replicated == everything - experts
    assert got.n_experts == tiny.config.n_routed_experts


def test_a_rank_holds_its_share_of_the_experts_and_the_whole_rest(tiny):
    whole = memory_plan.plan(_workers(1))[0]
    ranks = memory_plan.plan(_workers(2, ep=2, redundant=2))
    e = tiny.config.n_routed_experts
    for r in ranks:
        assert r.replicated == whole.replicated
        assert r.experts == whole.experts * (e + 2) // 2 // e  # 5 of 8 slots per layer
        assert r.expert_share == "5/8"
        assert r.kv == whole.kv
    layout = tiny.config.cache_layout(torch.float32)
    pool = KVCachePool(layout, CacheConfig(SPEC.total_blocks, SPEC.max_num_seqs, SPEC.block_size))
    held = _bytes(pool.block_tensors()) + _bytes(pool.slot_tensors())
    assert whole.kv == held


def test_a_device_that_cannot_hold_its_workers_is_a_clear_error():
    rows = memory_plan.plan(_workers(2, ep=2))
    need = sum(r.total for r in rows)
    fits = memory_plan.check_fits(rows, limit=need)
    assert fits == {"cpu": (need, need)}
    assert "prefill-1: weights" in memory_plan.describe(rows, fits)
    with pytest.raises(ValueError, match=r"the model does not fit: cpu needs .* for 2 workers"):
        memory_plan.check_fits(rows, limit=need - 1)


def test_serve_refuses_a_plan_over_max_memory_before_starting(capsys):
    assert cli.main(["serve", "--ep", "2", "--max-memory", "64MiB", "--devices", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "does not fit: cpu needs" in err
    assert "has 64.0 MiB (--max-memory)" in err
    assert err.count("\n") == 1


def test_v41_weight_bytes_are_the_loaded_models_without_the_engram_tables():
    """V4.1 (`v41-tiny`): the plan counts the loaded model's parameters and buffers, its
    backbone's routed experts apart, and leaves out Engram's tables (host memory)."""
    built = load_model("v41-tiny", device="cpu", progress=False)
    named = dict(built.model.named_parameters())
    host = [t for n, t in named.items() if ".engram.embed." in n]
    experts = [t for n, t in named.items() if re.match(r"^layers\.\d+\.ffn\.experts\.", n)]
    assert host
    assert experts
    device = _bytes(named.values()) + _bytes(built.model.buffers()) - _bytes(host)
    got = memory_plan.model_bytes(built.config, torch.float32)
    assert got.experts == _bytes(experts)
    assert got.replicated == device - _bytes(experts)
