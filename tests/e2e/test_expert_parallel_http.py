"""Expert parallel through serving: `deepring serve --ep 2` runs each prefill and decode worker
as a group of two gloo ranks (each its own worker to the frontend, the routed experts split
over the pair, rearranged every few steps). Concurrent greedy requests, spread over both ranks
with one rank idle at some steps, get exactly the single-process output of the same rendered
prompts; a rank killed mid-run takes its group down, the group restarts, and every stream
still ends with the fault-free output."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch
from deepring import LLM, SamplingParams
from e2e_helpers import Server

THINKING = {"type": "disabled"}  # the same rendering offline and served
# Prompts of different lengths and outputs of different lengths: the ranks' requests end at
# different steps, so some group steps find one rank without work.
PROMPTS = [
    ("def fibonacci(n):", 20),
    ("The quick brown fox jumps over the lazy dog. " * 6, 12),
    ("import numpy as np\nx = np.arange(10)\n", 28),
    ("Once upon a time", 16),
]
ARGS = (
    "--ep", "2", "--redundant-experts", "2", "--rebalance-interval", "3",
    "--max-num-seqs", "4", "--max-model-len", "1024", "--devices", "cpu",
)  # fmt: skip


@pytest.fixture(scope="module")
def group(tmp_path_factory, server_env):
    s = Server(list(ARGS), tmp_path_factory.mktemp("serve") / "serve.log", server_env)
    yield s
    assert s.stop() == 0, s.log()[-4000:]


@pytest.fixture(scope="module")
def offline() -> list[tuple[str, int]]:
    """Each prompt's greedy text and token count from the single-process model."""
    bodies = [{"model": "tiny", "messages": _messages(p), "thinking": THINKING} for p, _ in PROMPTS]
    params = [SamplingParams(temperature=0, max_tokens=n) for _, n in PROMPTS]
    try:
        outs = LLM("tiny", max_model_len=1024, device="cpu").generate(bodies, params)
    finally:
        # The engine's CPU set-up flushes denormals process-wide; later suites (hypothesis)
        # refuse to draw floats under it.
        torch.set_flush_denormal(False)
    # The chat parser drops the newline that opens an answer after the closed think block.
    return [(o.text.removeprefix("\n"), len(o.token_ids)) for o in outs]


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _stream(url: str, prompt: str, max_tokens: int, started: threading.Event) -> tuple:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        parts, n, usage = [], 0, None
        for chunk in c.chat.completions.create(
            model="tiny", messages=_messages(prompt), max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"thinking": THINKING},
        ):  # fmt: skip
            usage = chunk.usage or usage
            for ch in chunk.choices:
                if ch.delta.content:
                    parts.append(ch.delta.content)
                    n += 1
                    if n >= 3:
                        started.set()
        return "".join(parts), usage.completion_tokens


def _run_all(url: str, fault=None) -> list[tuple]:
    started = threading.Event()
    with ThreadPoolExecutor(len(PROMPTS)) as ex:
        futs = [ex.submit(_stream, url, p, n, started) for p, n in PROMPTS]
        if fault is not None:
            assert started.wait(120), "no stream started"
            fault()
        return [f.result(timeout=300) for f in futs]


def _ranks(s: Server, role: str) -> list[dict]:
    return [w for w in s.health()["workers"] if w["role"] == role]


def _settled(s: Server, timeout: float = 10.0) -> list[dict]:
    """The decode ranks once their load reports agree on the group's steps: a rank that ran
    only idle steps at the end reports them with its next heartbeat."""
    deadline = time.monotonic() + timeout
    while True:
        ranks = _ranks(s, "decode")
        steps = {w["expert_parallel"].get("group_steps") for w in ranks}
        if len(steps) == 1 or time.monotonic() > deadline:
            return ranks
        time.sleep(0.1)


def test_ep2_serving_equals_the_single_process_model(group, offline):
    before = {w["worker"]: w["steps_total"] for w in _ranks(group, "decode")}
    assert _run_all(group.url) == offline
    decode = _settled(group)
    assert len(decode) == 2
    assert len(_ranks(group, "prefill")) == 2
    for w in decode:
        ep = w["expert_parallel"]
        assert (ep["ranks"], ep["slots"], ep["redundant"]) == (2, 5, 2)
        # Both ranks decoded requests of their own.
        assert w["steps_total"] > before[w["worker"]], w
        # The experts were rearranged mid-run (every 3 group steps).
        assert ep["rebalances"] >= 1
        assert 1.0 <= ep["balance_factor"] <= 2.0
    # The outputs' lengths differ (28 tokens at most, 20 at most on the rank without that
    # request): a rank ran idle steps, in which the group stepped without it having work.
    assert any(w["expert_parallel"]["group_steps"] > w["steps_total"] for w in decode)
    # The two ranks agree on the group's loads (one all_gather per layer and step).
    a, b = (w["expert_parallel"] for w in decode)
    assert a["balance_rows"] == b["balance_rows"]
    assert a["balance_factor_sum"] == pytest.approx(b["balance_factor_sum"])
    # The memory plan was printed at start: every rank with 5 of the 8 experts of a layer.
    plan = group.log().split("memory plan", 1)[1]
    for wid in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        assert re.search(rf"{wid}: weights .* routed experts .* \(5/8 per layer\)", plan), wid
    labels = '{worker="decode-0",role="decode",group="0"}'
    factor = group.metric("deepring_ep_balance_factor", labels)
    assert factor == pytest.approx(a["balance_factor"], abs=1e-5)


def test_a_killed_rank_restarts_its_group_and_the_streams_go_on(group, offline):
    restarts = {w: r["restarts"] for w, r in group.health()["local_workers"]["workers"].items()}
    rerouted = group.metric("deepring_requests_rerouted_total")

    def kill() -> None:
        victim = next(w for w in _ranks(group, "decode") if w["worker"] == "decode-1")
        os.kill(victim["pid"], signal.SIGKILL)

    assert _run_all(group.url, fault=kill) == offline
    assert group.metric("deepring_requests_rerouted_total") > rerouted
    # Both ranks of the decode group were restarted; the prefill group was not touched.
    now = group.health()["local_workers"]["workers"]
    assert now["decode-0"]["restarts"] == restarts["decode-0"] + 1
    assert now["decode-1"]["restarts"] == restarts["decode-1"] + 1
    assert now["prefill-0"]["restarts"] == restarts["prefill-0"]
    deadline = time.monotonic() + 120
    while group.health()["status"] != "ok" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group.health()["status"] == "ok"


def test_a_frozen_rank_is_killed_and_its_group_restarts(group, offline):
    """A rank frozen mid-run (SIGSTOP: alive, silent) holds its group: its peer waits in the
    next collective. The frontend declares it dead after the heartbeat timeout, the
    supervisor kills it (not waiting for the group's collective timeout, minutes), the group
    restarts, and every stream still ends with the fault-free output."""
    from deepring.worker.ep_rank import GROUP_TIMEOUT_S

    restarts = {w: r["restarts"] for w, r in group.health()["local_workers"]["workers"].items()}
    victim = next(w for w in _ranks(group, "decode") if w["worker"] == "decode-1")["pid"]
    t0 = time.monotonic()
    try:
        assert _run_all(group.url, fault=lambda: os.kill(victim, signal.SIGSTOP)) == offline
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)  # (only if it was not killed: the test fails)
    took = time.monotonic() - t0
    # The frontend may notice either rank first: decode-0, waiting on its frozen peer in a
    # collective, sends no heartbeats either. Killing either one restarts the group.
    killed = re.findall(
        r"killing (decode-[01]) \(pid (\d+)\): a silent expert-parallel", group.log()
    )
    assert killed, "no silent rank was killed"
    assert took < GROUP_TIMEOUT_S / 2, took
    now = group.health()["local_workers"]["workers"]
    assert now["decode-1"]["restarts"] == restarts["decode-1"] + 1
    assert now["decode-0"]["restarts"] == restarts["decode-0"] + 1
    # Every rank killed for silence says so, whichever exit took the group down; a rank
    # stopped with its group says that.
    for w in ("decode-0", "decode-1"):
        silenced = w in {k for k, _ in killed}
        want = "silent for the heartbeat timeout" if silenced else "went down with its"
        assert want in now[w]["last_exit"], (w, now[w]["last_exit"])
    assert now["prefill-0"]["restarts"] == restarts["prefill-0"]
    deadline = time.monotonic() + 120
    while group.health()["status"] != "ok" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert group.health()["status"] == "ok"
