"""Expert-parallel test driver: spawns an EP group of gloo ranks on loopback, each running its
own requests (attention data parallel) through the sharded model in lockstep, and collects what
each rank saw for the test to compare with the single-process model."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from deepring.model.batch import ForwardBatch, SeqChunk
from v4_helpers import model_config, ours, pool_for

SEED = 3
N_DECODE = 4
MAX_STEPS = 60  # a bound on the lockstep loop (the workload needs about 15)


@dataclass(frozen=True)
class Workload:
    config: str
    n_ranks: int
    n_redundant: int
    rebalance_at: int | None  # step before which the group rebalances (None: never)
    requests_per_rank: int = 3


def prompts(w: Workload) -> list[list[int]]:
    """Request i belongs to rank i % N and arrives at step i, so ranks start at different
    steps (the late ones run idle steps), and a rank's batches mix prefill and decode rows."""
    g = torch.Generator().manual_seed(11)
    vocab = model_config(w.config).vocab_size
    out = []
    for _ in range(w.n_ranks * w.requests_per_rank):
        n = int(torch.randint(5, 21, (1,), generator=g))
        out.append(torch.randint(0, vocab, (n,), generator=g).tolist())
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(
    w: Workload, out_dir: Path, checkpoint: Path | None = None, quantised: str = "auto"
) -> list[dict]:
    """Run the workload on w.n_ranks spawned gloo ranks; each rank's results (torch.load).
    checkpoint: the model saved there (as `ours(..., seed=SEED)`), each rank loading only
    its own experts from it (`quantised` as load_model takes it: "keep" runs the kernels in
    Triton's interpreter, which the caller turns on with TRITON_INTERPRET=1 in the
    environment the ranks inherit); None: each rank builds the whole model and cuts its
    experts."""
    port = _free_port()
    args = (w, port, str(out_dir), checkpoint, quantised)
    mp.spawn(_rank_main, args=args, nprocs=w.n_ranks, join=True)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(w.n_ranks)]


class _Request:
    def __init__(self, rid: int, prompt: list[int], slot: int) -> None:
        self.rid, self.prompt, self.slot = rid, prompt, slot
        self.blocks = list(range(1 + 4 * slot, 5 + 4 * slot))  # 64 tokens of 16-token blocks
        self.cut = len(prompt) // 2  # prefill in two chunks
        self.done_prefill = 0  # chunks done
        self.tokens: list[int] = []
        self.prefill_logits: list[torch.Tensor] = []
        self.decode_logits: list[torch.Tensor] = []

    def chunk(self) -> SeqChunk | None:
        if self.done_prefill == 0:
            return SeqChunk(self.prompt[: self.cut], 0, self.slot, self.blocks, logits="all")
        if self.done_prefill == 1:
            ids = self.prompt[self.cut :]
            return SeqChunk(ids, self.cut, self.slot, self.blocks, logits="all")
        if len(self.tokens) < N_DECODE:
            pos = len(self.prompt) + len(self.tokens) - 1
            return SeqChunk([self.tokens[-1]], pos, self.slot, self.blocks)
        return None

    def take(self, logits: torch.Tensor) -> None:
        if self.done_prefill < 2:
            self.prefill_logits.append(logits)
            self.done_prefill += 1
            if self.done_prefill < 2:
                return
            logits = logits[-1:]
        self.decode_logits.append(logits[0])
        self.tokens.append(int(logits[0].argmax()))


def _rank_main(
    rank: int, w: Workload, port: int, out_dir: str, checkpoint: Path | None, quantised: str
) -> None:
    from triton_interp import interpreter_or_skip

    if quantised == "keep":
        interpreter_or_skip()  # (before triton is imported: the interpreter's shim)
    from deepring.ep.group import ExpertParallel, rank_slots
    from deepring.model.loader import load_model

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=w.n_ranks
    )
    try:
        if checkpoint is None:
            model = ours(model_config(w.config), seed=SEED)
            ep = ExpertParallel(model, n_redundant=w.n_redundant)
        else:
            e = model_config(w.config).n_routed_experts
            slots = rank_slots(e, w.n_ranks, rank, w.n_redundant)
            model = load_model(
                checkpoint, dtype="float32", progress=False, experts=slots, quantised=quantised
            ).model
            ep = ExpertParallel(model, n_redundant=w.n_redundant, sharded=True)
        slots = [layer.mlp.experts.gate_up_proj.shape[0] for layer in model.model.layers]
        pool = pool_for(model)
        mine = [
            (i, p) for i, p in enumerate(prompts(w)) if i % w.n_ranks == rank
        ]  # (arrival step, prompt)
        reqs: list[_Request] = []
        before = ep.placements
        step = 0
        while step < MAX_STEPS:
            reqs += [_Request(i, p, len(reqs)) for i, p in mine if i == step]
            work = [(r, c) for r in reqs if (c := r.chunk()) is not None]
            pending = any(i > step for i, _ in mine)
            if not ep.step_together(bool(work) or pending):
                break
            if step == w.rebalance_at:
                ep.rebalance()
            if work:
                batch = ForwardBatch.build(
                    [c for _, c in work], model.rope_tables(), pool.cache.block_size, model.device
                )
                logits = model(batch, pool).logits
                at = 0
                for r, c in work:
                    n = len(c.token_ids) if c.logits == "all" else 1
                    r.take(logits[at : at + n])
                    at += n
            else:
                ep.idle_forward()
            step += 1
        torch.save(
            {
                "requests": {
                    r.rid: {
                        "tokens": r.tokens,
                        "prefill": torch.cat(r.prefill_logits),
                        "decode": torch.stack(r.decode_logits),
                    }
                    for r in reqs
                },
                "slots": slots,
                "quant": [layer.mlp.experts.quant for layer in model.model.layers],
                "changed": [a != b for a, b in zip(before, ep.placements, strict=True)],
                "step_loads": list(ep.step_loads),
                "steps": step,
                "balance": ep.balance_factor(),
            },
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def save_per_expert(model, path: Path, keep: set[int] | None = None) -> None:
    """`model` as a checkpoint in the original per-expert layout (`...experts.<e>.w1/w2/w3`,
    what DeepSeek ships), unquantised; keep: the only backbone experts written (None: all)."""
    import json

    from safetensors.torch import save_file

    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith("inv_freq"):
            continue
        t = t.detach().contiguous()
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            prefix = name.rsplit(".", 1)[0]
            backbone = name.startswith("model.layers.")
            for e in range(t.shape[0]):
                if backbone and keep is not None and e not in keep:
                    continue
                if name.endswith("gate_up_proj"):
                    inter = t.shape[1] // 2
                    tensors[f"{prefix}.{e}.w1.weight"] = t[e, :inter].clone()
                    tensors[f"{prefix}.{e}.w3.weight"] = t[e, inter:].clone()
                else:
                    tensors[f"{prefix}.{e}.w2.weight"] = t[e].clone()
        else:
            tensors[name] = t
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(model.config.to_hf_dict()), encoding="utf-8")
