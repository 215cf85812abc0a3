"""The `deepring` console script: subcommands listed, serve placeholder exits cleanly."""

from __future__ import annotations

import shutil
import subprocess
import sys

import deepring
import deepring_recipe
import pytest
from deepring import cli

SUBCOMMANDS = ["serve", "frontend", "prefill", "decode", "generate", "bench"]


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


def test_serve_placeholder_exits_cleanly(capsys):
    assert cli.main(["serve"]) == 0
    assert "not landed yet" in capsys.readouterr().out
