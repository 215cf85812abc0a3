"""Train the embedded `tiny-trained` model: a tiny DeepSeek V4 on the Python standard library,
then its DSpark drafter with the target frozen; calibrate the drafter's confidence, measure it,
and write engine/deepring/model/data/tiny_trained.safetensors (docs/tiny-trained.md).

Usage (from the repository root, in the dev virtualenv, which has transformers):

    python tools/train_tiny.py                      # the shipped run (about 20 min on 2 cores)
    python tools/train_tiny.py --target-steps 20 --drafter-steps 10 --out /tmp/t   # a smoke run

Reproducible: every random draw comes from --seed, and torch runs on one thread by default
(--threads), so a rerun on the same torch computes the same floats. One thread is also the
faster choice on a shared 2-core machine: a second OpenMP thread made a step up to 10x slower
whenever another job held a core. Each phase stops at --max-minutes in all (then the output is
marked partial and says so). The package tiny_training/ next to this file holds the phases.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from deepring.model import tiny_trained as tt  # noqa: E402
from deepring.model.config import ModelConfig  # noqa: E402
from deepring.model.dspark import DSparkDrafter  # noqa: E402
from deepring.protocol.tokenizer import write_v41_tokenizer  # noqa: E402
from tiny_training import corpus as corpus_mod  # noqa: E402
from tiny_training import drafter as drafter_mod  # noqa: E402
from tiny_training import evaluate  # noqa: E402
from tiny_training import target as target_mod  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=tt.WEIGHTS.parent, help="output directory")
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-minutes", type=float, default=60.0, help="time limit for everything")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--target-steps", type=int, default=300)
    p.add_argument("--target-lr", type=float, default=8e-3)
    p.add_argument("--drafter-steps", type=int, default=150)
    p.add_argument("--drafter-lr", type=float, default=3e-3)
    p.add_argument("--anchors", type=int, default=24, help="draft blocks per training window")
    p.add_argument(
        "--distill-seqs", type=int, default=192, help="target greedy continuations to train on"
    )
    p.add_argument("--eval-prompts", type=int, default=24)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--eval-tokens", type=int, default=20000, help="held-out tokens for the NLL")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    t_start = time.monotonic()
    deadline = t_start + 60 * args.max_minutes
    config = ModelConfig.from_hf_dict(tt.BASE_CONFIG)
    tok_dir = tempfile.TemporaryDirectory(prefix="train-tiny-")
    tok_path = write_v41_tokenizer(Path(tok_dir.name) / "tokenizer.json")

    print("tokenizing the standard library ...", flush=True)
    corp = corpus_mod.load(tok_path, bos=config.bos_token_id, eos=config.eos_token_id)
    print(
        f"Python {corp.python}: {corp.files} files, {corp.train.numel()} training tokens, "
        f"{len(corp.held_out)} held-out files, vocabulary {corp.vocab.numel()}",
        flush=True,
    )
    frozen = tt.frozen_tensors(config, args.seed, corp.vocab)
    support = target_mod.Support(corp.vocab, config.vocab_size)

    target = target_mod.hf_model(config, frozen, args.seed)
    random_nll = evaluate.heldout_nll(target, corp, support, args.seq_len, 4000)["nll"]
    t_report = target_mod.train(
        target, corp, support, steps=args.target_steps, batch=args.batch,
        seq_len=args.seq_len, lr=args.target_lr, seed=args.seed + 1, deadline=deadline,
    )  # fmt: skip
    target_mod.round_to_shipped(target)
    for p in target.parameters():
        p.requires_grad_(False)
    held = evaluate.heldout_nll(target, corp, support, args.seq_len, args.eval_tokens)
    print(f"held-out NLL {held['nll']:.3f} (ppl {held['ppl']:.1f}); untrained {random_nll:.3f}")

    generated = None
    if args.distill_seqs:
        t0 = time.monotonic()
        gen = torch.Generator().manual_seed(args.seed + 4)
        prompts = corpus_mod.windows(corp.train, args.prompt_len, args.distill_seqs, gen)
        generated = target_mod.generate_greedy(target, prompts, args.seq_len - args.prompt_len)
        print(f"generated {generated.shape[0]} greedy continuations for the drafter in "
              f"{time.monotonic() - t0:.0f}s", flush=True)  # fmt: skip
    drafter = DSparkDrafter(config)
    drafter_mod.init_drafter(drafter, corp.vocab, args.seed + 2)
    d_report = drafter_mod.train(
        drafter, target, corp, support, steps=args.drafter_steps, batch=args.batch,
        seq_len=args.seq_len, anchors=args.anchors, lr=args.drafter_lr, seed=args.seed + 3,
        deadline=deadline, generated=generated,
    )  # fmt: skip
    target_mod.round_to_shipped(drafter)

    prompts = [ids[: args.prompt_len].tolist() for ids in corp.held_out]
    prompts = [p for p in prompts if len(p) == args.prompt_len][: args.eval_prompts]
    spec = evaluate.speculate(target, drafter, prompts, args.new_tokens)
    plain = evaluate.greedy(target, prompts, args.new_tokens, drafter.ds.target_layer_ids)
    same = sum(a == b for a, b in zip(spec["outputs"], plain, strict=True))
    acc = evaluate.acceptance(spec["accepted"], drafter.ds.block_size)
    cal = evaluate.calibrate(spec["conf"], spec["accepted"])
    print(f"draft-and-verify: tau {acc['tau']:.2f} over {acc['blocks']} blocks, acceptance per "
          f"position {[round(a, 3) for a in acc['per_position']]}; {same}/{len(plain)} outputs "
          f"equal plain greedy; ECE {cal['ece_before_mean']:.3f} -> {cal['ece_after_mean']:.3f}",
          flush=True)  # fmt: skip

    samples = [_decode(tok_path, p + o) for p, o in zip(prompts[:3], plain[:3], strict=False)]
    partial = time.monotonic() > deadline
    hf_dict = config.to_hf_dict()
    hf_dict["dspark_confidence_temperatures"] = [round(t, 4) for t in cal["temperatures"]]
    report = {
        "partial": partial,
        "python": corp.python,
        "torch": torch.__version__,
        "seconds": round(time.monotonic() - t_start),
        "corpus": {"files": corp.files, "train_tokens": corp.train.numel(),
                   "held_out_files": len(corp.held_out), "vocab": corp.vocab.numel()},
        "target": {"steps": t_report["steps"], "seconds": round(t_report["seconds"]),
                   "loss_first10": _mean(t_report["losses"][:10]),
                   "loss_last10": _mean(t_report["losses"][-10:]),
                   "heldout_nll": held["nll"], "heldout_ppl": held["ppl"],
                   "untrained_nll": random_nll},
        "drafter": {"steps": d_report["steps"], "seconds": round(d_report["seconds"]),
                    "last10": {k: _mean([h[k] for h in d_report["history"][-10:]])
                               for k in ("ce", "tv", "bce")}},
        "speculation": {**acc, "equal_to_greedy": f"{same}/{len(plain)}"},
        "calibration": cal,
        "samples": samples,
    }  # fmt: skip
    _write(args.out, target, drafter, config, hf_dict, corp, frozen, args, report)
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    for s in samples:
        print("-" * 60 + "\n" + s)
    if partial:
        print("PARTIAL: the time limit cut training short; this is not the reference run")
    return 0


def _write(out: Path, target, drafter, config, hf_dict, corp, frozen, args, report) -> None:
    from deepring.model.weights import keep_fp32
    from safetensors.torch import save_file

    names = set(_engine_names(config))
    state = {k: v for k, v in target.state_dict().items() if k in names}
    state.update({f"mtp.{k}": v for k, v in drafter.state_dict().items()})
    missing = names - set(state)
    if missing:
        raise ValueError(f"trained state lacks {sorted(missing)[:5]}")
    shipped = {}
    for k, v in tt.pack(state, config, corp.vocab).items():
        if v.is_floating_point():
            v = v.float() if keep_fp32(k) else v.bfloat16()
        shipped[k] = v.contiguous()
    meta = {
        "format": tt.SHIPPED_FORMAT,
        "config": json.dumps(hf_dict),
        "seed": str(args.seed),
        "frozen_digest": tt.digest(frozen),
        "report": json.dumps({k: v for k, v in report.items() if k != "samples"}),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / tt.WEIGHTS.name
    save_file(shipped, str(path), metadata=meta)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MiB)", flush=True)


def _engine_names(config: ModelConfig) -> list[str]:
    from deepring.model.model import DeepseekV4

    with torch.device("meta"):
        net = DeepseekV4(config)
    names = [n for n, _ in net.named_parameters()]
    return names + [n for n, _ in net.named_buffers() if not n.endswith("inv_freq")]


def _decode(tok_path: Path, ids: list[int]) -> str:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tok_path)).decode(ids, skip_special_tokens=False)


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


if __name__ == "__main__":
    raise SystemExit(main())
