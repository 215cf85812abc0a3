"""`deepring generate` on the embedded tiny model."""

from __future__ import annotations

import io
import json

import pytest
from deepring import LLM, SamplingParams, cli


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=4)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_prints_what_the_api_generates(capsys, llm):
    code, out, _ = _run(capsys, "--ids", "0,5,6,7", "-p", "Hello", "--max-tokens", "5", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    want = llm.generate([[0, 5, 6, 7], "Hello"], SamplingParams(temperature=0, max_tokens=5))
    assert [r["token_ids"] for r in rows] == [w.token_ids for w in want]
    assert [r["prompt_token_ids"] for r in rows] == [w.prompt_token_ids for w in want]
    assert all(r["finish_reason"] == "length" for r in rows)


def test_generate_reads_prompts_from_stdin(capsys, monkeypatch, llm):
    monkeypatch.setattr("sys.stdin", io.StringIO("first prompt\n\nsecond prompt\n"))
    code, out, _ = _run(capsys, "--max-tokens", "3", "--temperature", "0.7", "--seed", "9")
    assert code == 0
    want = llm.generate(
        ["first prompt", "second prompt"], SamplingParams(temperature=0.7, seed=9, max_tokens=3)
    )
    assert out.splitlines() == [w.text for w in want]


def test_generate_takes_chat_bodies(capsys, tmp_path, llm):
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "Hi!"}]}'
    (tmp_path / "body.json").write_text(body)
    code, out, _ = _run(capsys, "--chat", body, "--chat", f"@{tmp_path / 'body.json'}",
                        "--max-tokens", "3", "--json")  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    want = llm.generate([json.loads(body)], SamplingParams(temperature=0, max_tokens=3))[0]
    assert [r["token_ids"] for r in rows] == [want.token_ids] * 2
    assert rows[0]["prompt_token_ids"] == want.prompt_token_ids


def test_generate_samples_with_penalties_and_reports_logprobs(capsys, llm):
    argv = ["--ids", "0,5,6,7", "--max-tokens", "4", "--temperature", "0.8", "--seed", "3",
            "--top-k", "40", "--min-p", "0.01", "--presence-penalty", "0.5",
            "--frequency-penalty", "-0.5", "--logprobs", "2", "--json"]  # fmt: skip
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    row = json.loads(out)
    p = SamplingParams(temperature=0.8, seed=3, top_k=40, min_p=0.01, presence_penalty=0.5,
                       frequency_penalty=-0.5, max_tokens=4, logprobs=2)  # fmt: skip
    want = llm.generate([[0, 5, 6, 7]], p)[0]
    assert row["token_ids"] == want.token_ids
    assert row["logprobs"] == [[lp, [list(t) for t in top]] for lp, top in want.logprobs]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ids", "1,x"], "comma-separated integers"),
        (["--chat", "{not json"], "JSON request body"),
        (["--ids", "1", "--top-p", "0"], "top_p"),
    ],
)
def test_generate_rejects_bad_input(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err
