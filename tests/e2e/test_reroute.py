"""Faults users never see: workers killed or frozen under streaming load, and every client's
stream goes on with the exact output of a fault-free run (greedy), no error, no repeated or
missing token; a request gives up with a clear error only past its reroute budget. (Exact up to
float rounding: the prompts are those whose tokens no rounding of another chunking or batch
changes, rounding.RoundingCheck.)"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
from e2e_helpers import Server
from rounding import RoundingCheck

pytestmark = pytest.mark.slow

# Prefill steps of 64 tokens: a burst of new prompts takes the prefill workers many steps, so a
# worker killed 0.3 s after the burst arrives still holds some (however fast the machine).
ARGS = (
    "--num-prefill", "2", "--num-decode", "2", "--max-num-seqs", "8", "--max-model-len", "1024",
    "--prefill-max-num-batched-tokens", "64",
)  # fmt: skip


@pytest.fixture(scope="module")
def fault_env(server_env):
    env = dict(server_env)
    env["DEEPRING_HEARTBEAT_INTERVAL"] = "0.3"
    # Short enough for the freeze test, long enough for a step of a loaded 2-core machine.
    env["DEEPRING_HEARTBEAT_TIMEOUT"] = "6"
    return env


@pytest.fixture(scope="module")
def pool(tmp_path_factory, fault_env):
    s = Server(list(ARGS), tmp_path_factory.mktemp("serve") / "serve.log", fault_env)
    yield s
    assert s.stop() == 0, s.log()[-4000:]


@pytest.fixture(scope="module")
def rounding():
    return RoundingCheck()


def _prompts(n: int, seed: int, words: tuple[int, int] = (20, 300)) -> list[str]:
    rng = random.Random(seed)
    lengths = [rng.randrange(*words) for _ in range(n)]
    return [" ".join(f"w{rng.randrange(900)}" for _ in range(k)) for k in lengths]


def _stream(
    url: str,
    prompt: str,
    max_tokens: int,
    started: threading.Event | None = None,
    sampling: dict | None = None,
):
    """A streamed chat completion: (the text, the finish reason), greedy unless `sampling`
    says otherwise; with its log probabilities too when `sampling` asks for them."""
    kw = sampling or {"temperature": 0}
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        text, finish, n, lps = [], None, 0, []
        for chunk in c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={"thinking": {"type": "disabled"}},
            **kw,
        ):
            for ch in chunk.choices:
                if ch.delta.content:
                    text.append(ch.delta.content)
                    n += 1
                    if started is not None and n >= 3:
                        started.set()
                finish = ch.finish_reason or finish
                if ch.logprobs is not None:
                    lps += [e.model_dump() for e in ch.logprobs.content or []]
        if "logprobs" in kw:
            return "".join(text), finish, lps
        return "".join(text), finish


def _run_all(
    url: str,
    prompts: list[str],
    max_tokens: int,
    fault=None,
    early: bool = False,
    sampling: dict | None = None,
) -> list[tuple]:
    """Every prompt streamed at once; `fault()` runs once some streams are under way (early:
    as soon as they are submitted, while prompts are still being prefilled)."""
    started = threading.Event()
    with ThreadPoolExecutor(len(prompts)) as ex:
        futs = [ex.submit(_stream, url, p, max_tokens, started, sampling) for p in prompts]
        if fault is not None:
            if early:
                time.sleep(0.05)
            else:
                assert started.wait(120), "no stream started"
            fault()
        return [f.result(timeout=600) for f in futs]


def _pids(server: Server, role: str) -> list[int]:
    return [w["pid"] for w in server.health()["workers"] if w["role"] == role]


def _wait_status(server: Server, status: str, timeout: float = 30.0) -> tuple[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx2.get(f"{server.url}/health", timeout=10)
        if r.json()["status"] == status:
            return r.status_code, r.json()
        time.sleep(0.02)
    raise AssertionError(f"/health never said {status!r}: {server.health()}")


def _busiest(server: Server, role: str) -> int:
    """The pid of the worker of `role` holding the most requests now."""
    ws = [w for w in server.health()["workers"] if w["role"] == role]
    return max(ws, key=lambda w: w["running_requests"] + w["queue_length"])["pid"]


def _holding(server: Server, role: str) -> bool:
    """Whether a worker of `role` reports requests in its queue or batch."""
    ws = [w for w in server.health()["workers"] if w["role"] == role]
    return any(w["running_requests"] + w["queue_length"] for w in ws)


def _wait_all_up(server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = server.health()
        if h["status"] == "ok" and sum(w["up"] for w in h["workers"]) == 4:
            return
        time.sleep(0.1)
    raise AssertionError(f"workers did not all come back: {server.health()}")


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_killed_worker_is_invisible_to_its_streams(pool, rounding, role):
    _wait_all_up(pool)  # (whatever an earlier test left restarting)
    early = role == "prefill"
    # Long prompts when the kill must land in prefill: many 64-token steps each. Long outputs
    # when it must land in decode: the kill follows a stream's third token and the load
    # reports, and 24 tokens could all be out by then.
    new = 24 if early else 96
    candidates = _prompts(8, seed=2, words=(250, 400)) if early else _prompts(8, seed=1)
    prompts = rounding.stable(candidates, 4, new)
    # The fault-free run goes second when the kill must land in prefill: run first, it would
    # leave the prompts in the prefix cache, and the faulty run's prefill would be over before
    # the kill.
    want = None if early else _run_all(pool.url, prompts, new)
    rerouted = pool.metric("deepring_requests_rerouted_total")

    seen = []

    def kill() -> None:
        deadline = time.monotonic() + 5
        while not _holding(pool, role) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the workers' load reports show the burst
        os.kill(_busiest(pool, role), signal.SIGKILL)
        seen.append(_wait_status(pool, "degraded"))

    got = _run_all(pool.url, prompts, new, fault=kill, early=early)
    if want is None:
        _wait_all_up(pool)
        want = _run_all(pool.url, prompts, new)
    assert got == want
    assert pool.metric("deepring_requests_rerouted_total") > rerouted
    # While the worker restarted the server said it was degraded, and kept serving (200).
    code, health = seen[0]
    assert code == 200
    assert health["capacity"][role] == {"expected": 2, "ready": 1}
    _wait_all_up(pool)
    assert pool.metric("deepring_workers_ready", f'{{role="{role}"}}') == 2


def test_a_killed_worker_keeps_seeded_sampling_penalties_and_logprobs(pool, rounding):
    """Rerouted mid-stream, a sampled request with penalties continues with the same tokens
    (its resubmitted output counts for the penalties on the new worker) and log probabilities
    (recomputed there, so equal to float32 rounding)."""
    sampling = {"temperature": 0.9, "seed": 7, "frequency_penalty": 1.0,
                "presence_penalty": -0.5, "logprobs": True, "top_logprobs": 2}  # fmt: skip
    _wait_all_up(pool)
    prompts = rounding.stable(_prompts(8, seed=6), 4, 64, sampling)
    # 64 tokens: the kill follows a stream's third token, and 24 could all be out by then.
    want = _run_all(pool.url, prompts, 64, sampling=sampling)
    rerouted = pool.metric("deepring_requests_rerouted_total")
    got = _run_all(
        pool.url,
        prompts,
        64,
        fault=lambda: os.kill(_busiest(pool, "decode"), signal.SIGKILL),
        sampling=sampling,
    )
    assert pool.metric("deepring_requests_rerouted_total") > rerouted
    for (text, finish, lps), (want_text, want_finish, want_lps) in zip(got, want, strict=True):
        assert (text, finish) == (want_text, want_finish)
        assert [e["token"] for e in lps] == [e["token"] for e in want_lps]
        for e, w in zip(lps, want_lps, strict=True):
            assert e["logprob"] == pytest.approx(w["logprob"], abs=1e-4)
            # (values, not tokens: two alternatives within rounding may trade places)
            got_top = [t["logprob"] for t in e["top_logprobs"]]
            assert got_top == pytest.approx([t["logprob"] for t in w["top_logprobs"]], abs=1e-4)
    _wait_all_up(pool)


def test_a_frozen_worker_is_declared_dead_and_its_streams_go_on(pool, rounding):
    prompts = rounding.stable(_prompts(6, seed=3), 3, 24)
    _wait_all_up(pool)
    want = _run_all(pool.url, prompts, 24)

    def freeze() -> None:
        victim = _busiest(pool, "decode")
        os.kill(victim, signal.SIGSTOP)
        threading.Timer(8.0, os.kill, (victim, signal.SIGCONT)).start()

    got = _run_all(pool.url, prompts, 24, fault=freeze)
    assert got == want
    time.sleep(8.5)  # thawed: it re-registers (dropping what it held) and serves again
    _wait_all_up(pool)
    assert _run_all(pool.url, prompts[:2], 24) == want[:2]


def test_chaos_kills_lose_no_request(pool, rounding):
    """A bounded load test while a random worker is killed every 1.5 s (the first one 0.3 s
    in), one of each role always left alive."""
    prompts = rounding.stable(_prompts(10, seed=4), 6, 96)
    want = _run_all(pool.url, prompts, 96)
    stop = threading.Event()
    kills = []

    def chaos() -> None:
        rng = random.Random(0)
        wait = 0.3  # the streams take a few seconds: the first kill lands in them
        while not stop.wait(wait):
            wait = 1.5
            ready = [w for w in pool.health()["workers"] if w["up"]]
            roles = {w["role"] for w in ready}
            pick = [w for w in ready if sum(x["role"] == w["role"] for x in ready) > 1]
            if len(roles) == 2 and pick:
                victim = rng.choice(pick)
                os.kill(victim["pid"], signal.SIGKILL)
                kills.append(victim["worker"])

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    try:
        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda p: _stream(pool.url, p, 96), prompts))
    finally:
        stop.set()
        t.join(10)
    assert kills
    assert got == want
    _wait_all_up(pool)


def test_past_its_reroute_budget_a_request_fails_clearly(tmp_path_factory, fault_env):
    s = Server(
        ["--max-reroutes", "0", "--max-model-len", "1024"],
        tmp_path_factory.mktemp("serve") / "serve.log",
        fault_env,
    )
    try:
        started = threading.Event()
        with ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_stream, s.url, "Go on and on.", 900, started)
            assert started.wait(120)
            os.kill(s.worker_pid("decode"), signal.SIGKILL)
            with pytest.raises(
                openai.APIError, match=r"decode worker serving the request .*after 0 reroutes"
            ):
                fut.result(timeout=120)
        s.wait_healthy()
        r = httpx2.post(
            f"{s.url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            },
            timeout=120,
        )
        assert r.status_code == 200
    finally:
        assert s.stop() == 0, s.log()[-4000:]


def test_a_crash_loop_is_reported(tmp_path_factory, fault_env):
    """A worker that keeps dying is still restarted, and /health and /metrics say it loops;
    with its role empty meanwhile, /health is 503 (unavailable)."""
    env = {**fault_env, "DEEPRING_CRASH_LOOP_EXITS": "2"}
    s = Server(["--max-model-len", "1024"], tmp_path_factory.mktemp("serve") / "serve.log", env)
    try:
        for _ in range(2):
            s.wait_healthy()
            os.kill(s.worker_pid("decode"), signal.SIGKILL)
            code, _ = _wait_status(s, "unavailable")
            assert code == 503
        h = s.wait_healthy()
        loop = h["local_workers"]["workers"]["decode-0"]
        assert loop["crash_loop"] is True
        assert loop["restarts"] == 2
        assert "exited unexpectedly" in loop["last_exit"]
        assert s.metric("deepring_worker_crash_loop", '{worker="decode-0"}') == 1
        assert s.metric("deepring_worker_restarts_total", '{worker="decode-0"}') == 2
        assert "crash-looping" in s.log()
    finally:
        assert s.stop() == 0, s.log()[-4000:]


def test_a_warm_spare_takes_over_at_once(tmp_path_factory, fault_env, rounding):
    """--reserve-workers 1: the only decode worker dies mid-stream and the loaded spare
    becomes it without loading the model again; the stream goes on unchanged, and a new
    spare takes the first one's place."""
    s = Server(
        ["--max-model-len", "1024", "--reserve-workers", "1"],
        tmp_path_factory.mktemp("serve") / "serve.log",
        fault_env,
    )
    try:
        _wait_for(lambda: s.health()["local_workers"]["spares"]["loaded"] == 1, "a loaded spare")
        prompts = rounding.stable(_prompts(4, seed=5), 2, 24)
        want = _run_all(s.url, prompts, 24)
        took = []

        def kill() -> None:
            os.kill(_busiest(s, "decode"), signal.SIGKILL)
            t0 = time.monotonic()
            _wait_for(lambda: s.health()["status"] == "ok", "the decode role taken over")
            took.append(time.monotonic() - t0)

        assert _run_all(s.url, prompts, 24, fault=kill) == want
        spares = s.health()["local_workers"]["spares"]
        assert spares["taken"] == 1
        assert "spare-0" in s.log()
        assert "takes over decode-0" in s.log()
        # No model load on the way: the role is back well within a cold start's time.
        assert took[0] < 10, took
        _wait_for(lambda: s.health()["local_workers"]["spares"]["loaded"] == 1, "a new spare")
    finally:
        assert s.stop() == 0, s.log()[-4000:]


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout}s")
        time.sleep(0.05)
