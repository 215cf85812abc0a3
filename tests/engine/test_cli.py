"""The `deepring` console script: subcommands listed, bad serving configurations refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import deepring
import deepring_recipe
import pytest
from deepring import cli

SUBCOMMANDS = [
    "serve",
    "frontend",
    "prefill",
    "decode",
    "generate",
    "bench",
    "kv-store",
    "ring-keys",
]


def test_help_lists_every_subcommand():
    exe = shutil.which("deepring") or sys.executable
    args = [exe, "--help"] if exe != sys.executable else [exe, "-m", "deepring.cli", "--help"]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    for name in SUBCOMMANDS:
        assert name in out


def test_version_names_both_packages(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert deepring.__version__ in out
    assert deepring_recipe.__version__ in out


def test_unknown_subcommand_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["nope"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--num-decode", "0"], "at least one prefill and one decode"),
        (["serve", "--max-model-len", "1"], "max_model_len"),
        (["frontend", "--ring", "localhost:5555"], "ZeroMQ endpoint"),
        (["decode", "--frontend", "tcp://h:1", "--handoff-bind", "nope"], "ZeroMQ endpoint"),
        (
            ["serve", "--model", "/no/such/model"],
            "(tiny, tiny-trained, v41-tiny) nor a checkpoint directory",
        ),
        (["prefill", "--frontend", "tcp://h:1", "--model", "/no/such"], "checkpoint directory"),
        (["serve", "--served-model-name", "a", "a"], "duplicate served model names"),
        (["prefill", "--frontend", "ipc:///a", "--frontend", "ipc:///a"], "listed twice"),
        (["serve", "--allowed-origins", "evil.example"], "an allowed origin is '*'"),
        (["serve", "--max-connections", "0"], "max_connections must be >= 1"),
        (["prefill", "--frontend", "ipc:///a,ipc:///a"], "listed twice"),
        (["prefill", "--frontend", "ipc:///a,localhost:1"], "ZeroMQ endpoint"),
        (["serve", "--speculative", "dspark"], "needs a DSpark drafter; model 'tiny' has none"),
        (
            [
                "decode",
                "--frontend",
                "tcp://h:1",
                "--handoff-bind",
                "tcp://*:1",
                "--model",
                "tiny-trained",
                "--speculative",
                "mtp",
            ],
            "model 'tiny-trained' has a DSpark drafter in their place",
        ),
        (["serve", "--speculative", "fixed:99"], "fixed:N needs N in 1..64"),
        (["serve", "--speculative", "medusa"], "must be one of off, mtp, fixed:N, dspark"),
        (["serve", "--devices", "gpu0"], "'gpu0' is not cpu, cuda or cuda:N"),
        (["serve", "--devices", "cpu", "--device", "cpu"], "exclude each other"),
        (["serve", "--devices", "cpu,cuda:999"], "cuda:999 asked for, this machine has"),
        # Expert parallel: the tiny model has 8 routed experts, so E + K must divide by N.
        (["serve", "--ep", "3"], "do not split evenly over 3 ranks"),
        (["serve", "--ep", "2", "--redundant-experts", "1"], "do not split evenly over 2"),
        (
            ["serve", "--ep", "2", "--prefill-ep", "4", "--redundant-experts", "2"],
            "--ep 4 --redundant-experts 2",
        ),
        (["serve", "--ep", "0"], "--ep and --prefill-ep must be >= 1"),
        (["serve", "--redundant-experts", "2"], "--redundant-experts needs --ep N > 1"),
        (["serve", "--ep", "2", "--speculative", "mtp"], "does not run speculative decoding"),
        (["serve", "--ep", "2", "--zero-cost"], "cannot run with --zero-cost"),
        (["serve", "--ep", "2", "--reserve-workers", "1"], "--reserve-workers does not take"),
        (["serve", "--ep", "2", "--model", "v41-tiny"], "runs DeepSeek V4 MoE models"),
        (
            ["serve", "--model", "v41-tiny", "--speculative", "mtp"],
            "model 'v41-tiny' has a DSpark drafter in their place",
        ),
        (
            ["serve", "--image-url-allow-private"],
            "--image-url-allow-private needs --image-url-hosts",
        ),
        (["serve", "--image-url-hosts", "https://x.com/"], "is not a host name or address"),
    ],
)
def test_serving_commands_refuse_bad_configurations(capsys, argv, message):
    # Rejected before any process starts or any socket is bound: one line, no traceback.
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_model_directory_needs_a_parsable_config_and_a_tokenizer(capsys, tmp_path):
    from deepring.model.tiny import TINY_CONFIG

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert cli.main(["serve", "--model", str(tmp_path)]) == 2
    assert "unsupported model_type 'llama'" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    assert cli.main(["serve", "--model", str(tmp_path)]) == 2
    assert "has no tokenizer.json: pass --tokenizer" in capsys.readouterr().err


@pytest.mark.parametrize("role", ["prefill", "decode", "frontend"])
def test_role_commands_need_their_endpoints(capsys, role):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([role])
    assert exit_info.value.code == 2
    assert "required" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000),
     ("64 k", 64_000)],
)  # fmt: skip
def test_sizes_parse(text, size):
    from deepring.cli_serve_args import size as _size

    assert _size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "2 parsecs", "-1GiB", "1e"])
def test_bad_sizes_are_refused(text):
    import argparse

    from deepring.cli_serve_args import size as _size

    with pytest.raises(argparse.ArgumentTypeError):
        _size(text)


def test_devices_go_to_the_workers_in_order():
    from deepring.cli_serve import worker_devices

    assert worker_devices(None, "cuda:1", 3) == ["cuda:1"] * 3
    assert worker_devices(None, None, 2) == [None, None]
    assert worker_devices("cpu, cpu", None, 3) == ["cpu", "cpu", "cpu"]


def test_the_ranks_of_an_ep_group_need_distinct_cuda_devices():
    from deepring.cli_ep import check_group_devices

    check_group_devices("decode", ["cuda:0", "cuda:1", "cuda:0", "cuda:1"], 2)  # two groups
    check_group_devices("decode", ["cpu", "cpu"], 2)  # gloo: any number of ranks per CPU
    check_group_devices("decode", ["cuda:0", "cuda:0"], 1)  # whole workers may share
    with pytest.raises(ValueError, match=r"decode group 1 share a CUDA device \(cuda:1, cuda:1\)"):
        check_group_devices("decode", ["cuda:0", "cuda:1", "cuda:1", "cuda:1"], 2)
    with pytest.raises(ValueError, match=r"prefill group 0 mix CUDA and CPU devices"):
        check_group_devices("prefill", ["cuda:0", "cpu"], 2)
