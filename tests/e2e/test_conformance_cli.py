"""`deepring conformance` (issue 24) against a real `deepring serve`, which must pass, and
against a broken proxy in front of it (broken_proxy.py), where each corruption must make the
run fail and name the property it breaks."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET

import pytest
from broken_proxy import BrokenProxy
from e2e_helpers import deepring_command

# What every run against deepring serve must have checked (not skipped) on every protocol.
CHECKED = [
    "sse_framing",
    "event_order",
    "stream_agrees",
    "stream_accumulates",
    "usage_arithmetic",
    "prompt_tokens",
    "no_markup",
    "error_shape",
    "invalid_refused",
    "unknown_model",
    "oversize_prompt",
    "prefix_cache",
]


def conformance(url: str, tmp_path, tokenizer, *args: str) -> tuple[int, str, dict]:
    """Run the CLI; (exit code, stdout, {(property, protocol): (status, message)})."""
    junit = tmp_path / "junit.xml"
    cmd = [*deepring_command(), "conformance", "--base-url", url, "--junit", str(junit)]
    cmd += ["--tokenizer", str(tokenizer), "--seed", "11", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    cases = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failure, skipped = case.find("failure"), case.find("skipped")
        status = "fail" if failure is not None else "skip" if skipped is not None else "pass"
        message = failure.get("message") if failure is not None else ""
        cases[(case.get("name"), case.get("classname"))] = (status, message)
    return run.returncode, run.stdout, cases


def test_passes_against_deepring_serve(base_url, tmp_path, v41_tokenizer_path):
    code, out, cases = conformance(base_url, tmp_path, v41_tokenizer_path, "--examples", "40")
    # (This run found reasoning_tokens > completion_tokens, fixed in the recipe: DEVIATIONS R6.)
    failed = {k: m for k, (s, m) in cases.items() if s == "fail"}
    assert not failed, out
    assert code == 0, out
    for prop in CHECKED:
        for protocol in ("chat", "responses", "messages"):
            assert cases[(prop, protocol)][0] != "skip", f"{prop} [{protocol}] skipped:\n{out}"
    # the grammar-bounded requests finish, so these are checked somewhere in a run this size
    for prop in ("tool_calls", "tool_choice", "response_format"):
        assert any(cases[(prop, p)][0] == "pass" for p in ("chat", "responses", "messages")), out
    assert re.search(r"^prefix_cache +pass \(\d+\) +pass \(\d+\) +pass \(\d+\)$", out, re.M), out


@pytest.fixture
def proxy(request, base_url):
    p = BrokenProxy(base_url, request.param)
    yield p
    p.close()


# mode: (protocols to run, {(property, protocol) that must fail}, what the message must say)
BROKEN = {
    "drop_done": ("chat", {("sse_framing", "chat")}, "[DONE]"),
    "corrupt_delta": (
        "chat,responses,messages",
        {("stream_agrees", p) for p in ("chat", "responses", "messages")},
        "X",
    ),
    "wrong_usage": (
        "chat,responses,messages",
        {("prompt_tokens", p) for p in ("chat", "responses", "messages")}
        | {("usage_arithmetic", "chat"), ("usage_arithmetic", "responses")},
        "prompt",
    ),
    "leak_dsml": (
        "chat,responses,messages",
        {("no_markup", p) for p in ("chat", "responses", "messages")},
        "｜DSML｜",
    ),
}


@pytest.mark.parametrize("proxy", list(BROKEN), indirect=True)
def test_each_corruption_is_caught_and_named(proxy, tmp_path, v41_tokenizer_path):
    protocols, must_fail, said = BROKEN[proxy.mode]
    # no shrinking nor grammar-bounded examples: what is under test is that each corruption
    # is caught and named
    args = ("--protocols", protocols, "--examples", "8", "--max-shrinks", "0")
    args += ("--bounded-examples", "0")
    code, out, cases = conformance(proxy.url, tmp_path, v41_tokenizer_path, *args)
    assert code == 1, out
    for prop, protocol in must_fail:
        status, message = cases[(prop, protocol)]
        assert status == "fail", f"{prop} [{protocol}] not caught:\n{out}"
        assert said in message, out
        assert f"FAIL {prop} [{protocol}]" in out  # named in the printed summary too


def test_an_api_key_is_sent_and_a_missing_one_is_a_clear_start_failure(
    start_server, tmp_path, v41_tokenizer_path
):
    """Against a server that requires a key: with --api-key every request carries it (the run
    passes); without, the run cannot start (exit 2) and says the server answered 401."""
    s = start_server("--api-key", "conformance-key", "--max-model-len", "2048")
    try:
        cmd = [*deepring_command(), "conformance", "--base-url", s.url, "--seed", "3",
               "--tokenizer", str(v41_tokenizer_path), "--examples", "6"]  # fmt: skip
        keyed = subprocess.run([*cmd, "--api-key", "conformance-key"], capture_output=True,
                               text=True, timeout=240)  # fmt: skip
        bare = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        s.stop()
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert "401" in bare.stdout + bare.stderr
