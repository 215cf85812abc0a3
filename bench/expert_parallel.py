"""Expert-parallel benchmark on CPU: EP1 / EP2 / EP4 gloo groups, with and without redundant
expert slots, on a skewed routing trace.

The model is a small V4 (learned routing on every layer, 32 experts, top-4) whose routers carry
a Zipf-like score-correction bias, a different hot set per layer, so a few experts draw most of
the tokens (the skew a real router shows between rebalancings). Every rank prefills its own
requests (attention data parallel) in lockstep. After W warm-up steps the group rebalances
from the routers' counters (ep.placement.balanced_placement); the next M steps are measured.

Reported per setting: tokens/s over the group (all ranks' rows / wall time; on a machine with
fewer cores than ranks this measures the collectives' overhead, not a speed-up), the
load-balance factor (mean over steps and layers of max / mean tokens per rank) on the static
placement during the warm-up ("static") and after the rebalance ("balance"; 1.0 is perfect,
DeepSeek reports 1.090 for decode), and the routed-expert and
replicated weight memory per rank, and each rank's share of the routed picks over the measured
steps (after the rebalance).

Targets: balance factor <= 1.10 with redundancy on the skewed trace; routed-expert memory per
rank = (E + K) / N slots of the E experts' total.
Usage: python bench/expert_parallel.py [--steps 8] [--warmup 4] [--tokens 256]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _machine import describe

BALANCE_TARGET = 1.10
CONFIG = {
    "model_type": "deepseek_v4",
    "vocab_size": 1024,
    "hidden_size": 128,
    "moe_intermediate_size": 64,
    "num_attention_heads": 4,
    "head_dim": 32,
    "q_lora_rank": 32,
    "partial_rotary_factor": 0.25,
    "o_groups": 2,
    "o_lora_rank": 16,
    "index_n_heads": 4,
    "index_head_dim": 16,
    "hc_mult": 2,
    "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 0,
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention"] * 4,
    "mlp_layer_types": ["moe"] * 4,
    "sliding_window": 64,
    "n_routed_experts": 32,
    "num_experts_per_tok": 4,
}
SETTINGS = [(1, 0), (2, 0), (2, 2), (2, 4), (4, 0), (4, 4), (4, 8)]  # (ranks, redundant)


def _skew(model) -> None:
    """Zipf-like routing: bias_e = 4 / rank_e over a per-layer random order of experts."""
    g = torch.Generator().manual_seed(0)
    n = model.config.n_routed_experts
    for layer in model.model.layers:
        order = torch.randperm(n, generator=g)
        bias = 4.0 / torch.arange(1, n + 1, dtype=torch.float32)
        layer.mlp.gate.e_score_correction_bias.copy_(bias[order])


def _rank(rank: int, n: int, k: int, port: int, args, out: str) -> None:
    from deepring.cache.pool import CacheConfig, KVCachePool
    from deepring.ep.group import ExpertParallel
    from deepring.model.batch import ForwardBatch, SeqChunk
    from deepring.model.config import ModelConfig
    from deepring.model.loader import load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        config = ModelConfig.from_hf_dict(CONFIG)
        model = load_model(config, load_format="dummy", seed=1, dtype="float32").model
        _skew(model)
        full_expert_bytes = sum(
            t.numel() * t.element_size()
            for layer in model.model.layers
            for t in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj)
        )
        all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        ep = ExpertParallel(model, n_redundant=k)
        block = 16
        pool = KVCachePool(
            config.cache_layout(model.dtype),
            CacheConfig(num_blocks=2 + args.tokens // block, num_slots=2, block_size=block),
            model.device,
        )
        g = torch.Generator().manual_seed(100 + rank)
        blocks = list(range(1, 1 + args.tokens // block))

        def step() -> None:
            ids = torch.randint(0, config.vocab_size, (args.tokens,), generator=g).tolist()
            chunk = SeqChunk(ids, 0, 0, blocks)
            batch = ForwardBatch.build([chunk], model.rope_tables(), block, model.device)
            model(batch, pool)

        for _ in range(args.warmup):
            step()
        static = ep.balance_factor()  # the warm-up ran on the load-blind static placement
        ep.rebalance()
        ep.step_loads.clear()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        dist.barrier()
        wall = time.perf_counter() - t0
        if rank == 0:
            torch.save(
                {
                    "tok_s": n * args.tokens * args.steps / wall,
                    "balance": ep.balance_factor(),
                    "static": static,
                    "expert_mib": ep.expert_bytes() / 2**20,
                    "full_expert_mib": full_expert_bytes / 2**20,
                    "replicated_mib": (all_bytes - full_expert_bytes) / 2**20,
                    # Picks each rank's experts served over the measured steps, all layers.
                    "rank_load": [sum(row[r] for row in ep.step_loads) for r in range(n)],
                },
                out,
            )
    finally:
        dist.destroy_process_group()


def _shares(load: list[int]) -> str:
    """Each rank's share of the picks, in percent (the spread behind the balance factor)."""
    total = sum(load) or 1
    return " / ".join(f"{100 * x / total:.1f}" for x in load)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="measured steps")
    ap.add_argument("--warmup", type=int, default=4, help="steps before the rebalance")
    ap.add_argument("--tokens", type=int, default=256, help="prefill tokens per rank per step")
    args = ap.parse_args()
    print(describe())
    e = CONFIG["n_routed_experts"]
    print(
        f"model: {CONFIG['num_hidden_layers']} MoE layers, {e} experts top-"
        f"{CONFIG['num_experts_per_tok']}, hidden {CONFIG['hidden_size']}; {args.tokens} tokens "
        f"per rank per step, {args.warmup} warm-up steps, rebalance, {args.steps} measured"
    )
    print(
        f"{'EP':>3} {'K':>3} {'tok/s':>9} {'static':>7} {'balance':>8} {'experts MiB/rank':>17} "
        f"{'(of full)':>10} {'replicated MiB':>15}  per-rank load (% of picks)"
    )
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, k in SETTINGS:
            out = str(Path(tmp) / f"ep{n}-k{k}.pt")
            mp.spawn(_rank, args=(n, k, _port(), args, out), nprocs=n, join=True)
            r = torch.load(out)
            share = r["expert_mib"] / r["full_expert_mib"]
            print(
                f"{n:>3} {k:>3} {r['tok_s']:>9.0f} {r['static']:>7.3f} {r['balance']:>8.3f} "
                f"{r['expert_mib']:>17.2f} "
                f"{share:>10.3f} {r['replicated_mib']:>15.2f}  {_shares(r['rank_load'])}"
            )
            if abs(share - (e + k) / n / e) > 1e-9:
                failures.append(f"EP{n} K{k}: expert share {share:.3f} != (E+K)/N/E")
            if n > 1 and k > 0 and r["balance"] > BALANCE_TARGET:
                failures.append(f"EP{n} K{k}: balance {r['balance']:.3f} > {BALANCE_TARGET}")
    for f in failures:
        print("MISSED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
