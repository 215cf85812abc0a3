"""V4.1 in the real engine: the embedded `v41-tiny` under `LLM`, checkpoints in the official
naming, Engram's host-memory table."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from deepring.llm import LLM
from deepring.model.loader import load_model
from deepring.model.v41.weights import save_v41_checkpoint
from deepring.sampling.params import SamplingParams
from safetensors.torch import load_file, save_file
from v41_helpers import greedy_generate, make_pool, new_seqs, step, tiny_dict, tiny_model


@functools.lru_cache(maxsize=1)
def _llm() -> LLM:
    return LLM("v41-tiny", max_model_len=512, max_num_seqs=4, num_blocks=64)


def test_llm_greedy_equals_the_model_stepped_by_hand():
    llm = _llm()
    assert type(llm.model).__name__ == "DeepseekV41"
    prompts = [[0, *range(10, 40)], [0, 7, 7, 7, 9], [0, *range(300, 500, 3)]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        pool = make_pool(llm.model, num_blocks=8, num_slots=4, block_size=128)
        want = greedy_generate(llm.model, pool, new_seqs(3, blocks_each=2)[i], p, 6)
        assert o.token_ids == want


def test_llm_decoder_bounded_replay_equals_the_model_stepped_by_hand():
    """A prompt longer than KEEP (140): the engine's decoder computes its last 140 tokens."""
    llm = _llm()
    keep = llm.model.decoder_keep
    assert keep == 140
    prompt = [0, *range(2000, 2299)]
    out = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0))[0].token_ids
    pool = make_pool(llm.model, num_blocks=8, num_slots=4, block_size=128)
    s = new_seqs(1, blocks_each=4)[0]
    got = [int(step(llm.model, pool, [s.chunk(prompt, "last", len(prompt) - keep)])[-1].argmax())]
    for _ in range(4):
        nxt = s.chunk([got[-1]], decoder_from=len(s.tokens) + 1 - keep)
        got.append(int(step(llm.model, pool, [nxt])[-1].argmax()))
    assert out == got


@pytest.mark.parametrize("budget", [None, 64, 13])
def test_llm_prefix_cache_hit_reproduces_the_output(budget):
    """The second run of a prompt takes its cached blocks (and ring snapshot) and continues
    exactly as the first; also when the step budget cuts the hit's replay into chunks that end
    before the first uncached entry (64, 13: the compressor pooled nothing for those, and
    crashed on them)."""
    llm = (
        _llm()
        if budget is None
        else LLM(
            "v41-tiny",
            max_model_len=512,
            max_num_seqs=4,
            num_blocks=64,
            max_num_batched_tokens=budget,
        )
    )
    prompt = [0, *range(1000, 1300)]  # two full 128-token blocks and a tail
    params = SamplingParams(max_tokens=5, temperature=0)
    first = llm.generate([prompt], params)[0].token_ids
    hits_before = llm.engine.prefix.stats["hit_tokens"]
    second = llm.generate([prompt], params)[0].token_ids
    assert llm.engine.prefix.stats["hit_tokens"] > hits_before
    assert second == first


def test_chat_prompts_render_with_the_v41_template():
    llm = _llm()
    ids = llm.encode({"model": "v41-tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert llm.tokenizer.decode(ids).count("<｜User｜>") == 1


def test_official_naming_round_trip_and_clear_errors(tmp_path):
    model = tiny_model()
    save_v41_checkpoint(model, tmp_path, tiny_dict())
    loaded = load_model(tmp_path, dtype="float32").model
    prompt = list(range(3, 20))
    a = step(model, make_pool(model), [new_seqs(1)[0].chunk(prompt)])
    b = step(loaded, make_pool(loaded), [new_seqs(1)[0].chunk(prompt)])
    assert torch.equal(a, b)
    names = load_file(tmp_path / "model.safetensors")
    assert "layers.5.attn.compressor.wkv.weight" in names
    assert "layers.3.engram.embed.weight" in names
    assert "mtp.0.main_proj.weight" in names
    assert "layers.2.attn.compressor.wgate.weight" in names  # ratio 2 only
    assert "layers.5.attn.compressor.wgate.weight" not in names

    def broken(edit, match: str) -> None:
        t = dict(names)
        edit(t)
        save_file(t, str(tmp_path / "model.safetensors"))
        with pytest.raises(ValueError, match=match):
            load_model(tmp_path, dtype="float32")

    missing = "layers.7.attn.indexer.wq_b.weight"
    broken(lambda t: t.pop(missing), missing)
    bad = "layers.2.attn.wkv.weight"
    broken(lambda t: t.__setitem__(bad, torch.zeros(3, 3)), rf"{bad}.*\(3, 3\)")
    extra = "layers.4.attn.compressor.wkv.weight"  # layer 4 reuses layer 2's KV
    broken(lambda t: t.__setitem__(extra, torch.zeros(32, 64)), extra)


@pytest.mark.parametrize("ranks", [1, 3])
def test_engram_tables_row_padded_as_deepinfer_stores_them_load(tmp_path, ranks):
    """A table padded to a multiple of lcm(256, engram-parallel ranks) loads as the unpadded
    one (the padding rows hold anything); a row count no such padding gives is refused."""
    model = tiny_model()
    save_v41_checkpoint(model, tmp_path, tiny_dict())
    names = load_file(tmp_path / "model.safetensors")
    key = "layers.3.engram.embed.weight"
    table = names[key]
    step_rows = math.lcm(256, ranks)
    padded = -(-table.shape[0] // step_rows) * step_rows
    junk = torch.randn(padded - table.shape[0], table.shape[1])
    save_file({**names, key: torch.cat([table, junk])}, str(tmp_path / "model.safetensors"))
    loaded = load_model(tmp_path, dtype="float32").model
    prompt = list(range(3, 20))
    a = step(model, make_pool(model), [new_seqs(1)[0].chunk(prompt)])
    b = step(loaded, make_pool(loaded), [new_seqs(1)[0].chunk(prompt)])
    assert torch.equal(a, b)
    save_file({**names, key: torch.cat([table, junk[:1]])}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{key}.*shape"):
        load_model(tmp_path, dtype="float32")


def test_engram_table_stays_in_host_memory():
    config = tiny_model().config
    from deepring.model.v41.model import DeepseekV41

    net = DeepseekV41(config).to("meta")  # any device that is not the host
    assert net.layers[1].engram.embed.weight.device.type == "cpu"
    assert net.layers[1].engram.wkv.weight.device.type == "meta"
    assert net.head.weight.device.type == "meta"


def test_keep_below_the_ring_is_refused(monkeypatch):
    from deepring.core.runner import ModelRunner

    model = tiny_model()
    pool = make_pool(model)  # ring of 6 = window 4 + backtrack 2
    monkeypatch.setattr(model, "decoder_keep", 5)
    with pytest.raises(ValueError, match="DEEPRING_V41_KEEP = 5"):
        ModelRunner(model, pool)
    monkeypatch.setenv("DEEPRING_V41_KEEP", "-1")
    from deepring import env

    with pytest.raises(ValueError, match="DEEPRING_V41_KEEP"):
        env.v41_keep()


def test_handoff_from_a_prefill_engine_continues_exactly():
    """Serving's split: a 200-token prompt prefilled in 96-token chunks (decoder replay across
    them) in one engine, its cache state through the wire format into another engine's other
    slot and blocks, decoded there: the tokens one LLM generates alone."""
    import numpy as np
    from deepring.cache.transfer import CacheState
    from deepring.config import EngineSpec
    from deepring.core.build import build_engine
    from deepring.ipc import codec
    from deepring.ipc.messages import Handoff

    spec = EngineSpec(model="v41-tiny", max_model_len=512, max_num_seqs=4,
                      max_num_batched_tokens=96)  # fmt: skip
    pre, dec = build_engine(spec).engine, build_engine(spec).engine
    prompt = [(37 * j) % 120000 + 3 for j in range(200)]
    params = SamplingParams(temperature=0, max_tokens=8)
    want = _llm().generate([prompt], params)[0].token_ids
    req = pre.add(1, prompt, params, 0)
    while not req.output_ids:
        pre.step()
    assert req.output_ids == want[:1]
    state = pre.export(req)
    pre.finish(req, "handoff")
    msg = Handoff(
        rid=1, frontend_gen=0, token_ids=np.asarray(prompt + req.output_ids, dtype=np.int32),
        prompt_len=len(prompt), num_cached=req.num_cached, cache_hit=0, sampling=params,
        seed=0, decode_gen=1, cache_class="chat", slot_state=state.slot_state,
        block_state=state.block_state,
    )  # fmt: skip
    msg = codec.decode_strict([bytes(f) for f in codec.encode(msg)])
    busy = dec.slots.allocate(), dec.blocks.allocate(2)  # the state lands elsewhere
    state = CacheState(msg.slot_state, msg.block_state)
    ids = msg.token_ids.tolist()
    got = dec.admit(msg.rid, ids, msg.prompt_len, msg.num_cached, msg.sampling, msg.seed, state)
    assert got.slot != busy[0]
    while not got.finished:
        dec.step()
    assert got.output_ids == want


@pytest.mark.parametrize("budget", [2048, 64])
def test_a_resumed_request_continues_exactly(budget):
    """A request resumed with its output so far (a reroute after a fault, a recompute after
    preemption) prefills prompt + output at once; its decoder windows start where the first
    prefill started them (the prompt's last KEEP tokens), so it continues exactly as the
    uninterrupted run (starting them KEEP before the output's end diverged a few tokens on: the
    decoder's bounded replay is an approximation that depends on where it starts)."""
    prompt = [0, *range(1000, 1300)]  # past KEEP (140) and the window (128)

    def run(done: list[int]) -> list[int]:
        llm = LLM("v41-tiny", max_model_len=512, max_num_seqs=4, num_blocks=64,
                  max_num_batched_tokens=budget)  # fmt: skip
        req = llm.engine.add(0, prompt, SamplingParams(max_tokens=40, temperature=0), 1,
                             output_ids=done)  # fmt: skip
        while llm.engine.has_work:
            llm.engine.step()
        return req.output_ids

    full = run([])
    for cut in (1, 17, 33):
        assert run(full[:cut]) == full, cut
