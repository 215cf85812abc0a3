"""`deepring kv-store inspect | clear` on a directory store, and its errors: a bad URL is exit
code 2, a store that is not there is 1, each with one line on stderr. (On Redis:
test_kv_store_redis.py.)"""

from __future__ import annotations

import io
import json

import pytest
from deepring import cli
from deepring.cache.store import DirectoryStore
from kv_store_helpers import key, value

HOUR = 3600


@pytest.fixture
def store(tmp_path) -> DirectoryStore:
    s = DirectoryStore(tmp_path / "kv")
    # Remaining TTLs: expired, under an hour, 1-3 days (two), 3-7 days, 7 days or more.
    for i, ttl in enumerate([-1, 0.5 * HOUR, 30 * HOUR, 60 * HOUR, 4 * 24 * HOUR, 8 * 24 * HOUR]):
        s.put_many([(key(i), value(i, 1000 * (i + 1)), max(ttl, 0.001))])
    return s


def test_inspect_as_text(store, capsys):
    assert cli.main(["kv-store", "inspect", str(store.root), "--list", "2"]) == 0
    out = capsys.readouterr().out
    assert f"dir://{store.root} (directory)" in out
    assert "entries        6 (20.5 KiB)" in out
    assert "expired        1" in out
    assert "  1d-3d        2" in out
    assert (
        len([line for line in out.splitlines() if line[:64] in {key(i).hex() for i in range(6)}])
        == 2
    )


def test_inspect_as_json(store, capsys):
    assert cli.main(["kv-store", "inspect", f"dir://{store.root}", "--json", "--list", "10"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "directory"
    assert report["entries"] == 6
    assert report["bytes"] == 21000
    assert report["expired"] == 1
    assert report["remaining_ttl"] == {
        "expired": 1,
        "<1h": 1,
        "1h-1d": 0,
        "1d-3d": 2,
        "3d-7d": 1,
        ">=7d": 1,
    }
    assert sorted(e["key"] for e in report["listed"]) == sorted(key(i).hex() for i in range(6))


def test_clear_expired_only(store, capsys):
    assert cli.main(["kv-store", "clear", str(store.root), "--expired-only"]) == 0
    assert "removed 1 from" in capsys.readouterr().out
    assert len(list(store.scan())) == 5


@pytest.mark.parametrize(("answer", "code", "left"), [("y\n", 0, 0), ("no\n", 1, 6), ("", 1, 6)])
def test_clear_asks_first(store, capsys, monkeypatch, answer, code, left):
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    assert cli.main(["kv-store", "clear", str(store.root)]) == code
    out = capsys.readouterr().out
    assert "remove all 6 entries" in out
    assert len(list(store.scan())) == left
    assert ("removed 6 entries" in out) == (left == 0)


def test_clear_yes_asks_nothing(store, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["kv-store", "clear", str(store.root), "--yes"]) == 0
    assert "removed 6 entries" in capsys.readouterr().out
    assert list(store.scan()) == []


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["inspect", "s3://bucket/kv"], 2, "unsupported store URL"),
        (["inspect", "dir://relative"], 2, "absolute path"),
        (["clear", "redis://host:notaport", "--yes"], 2, "bad store URL"),
        (["inspect", "{tmp}/kv", "--prefix", "x:"], 2, "--prefix applies to Redis stores only"),
        (["inspect", "{tmp}/kv", "--list", "-1"], 2, "--list"),
        (["inspect", "{tmp}/missing"], 1, "does not exist"),
        (["clear", "{tmp}/missing", "--yes"], 1, "does not exist"),
    ],
)
def test_errors_are_one_line(tmp_path, capsys, argv, code, message):
    (tmp_path / "kv").mkdir()
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert cli.main(["kv-store", *argv]) == code
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("deepring kv-store: ")
    assert err.count("\n") == 1
    assert not (tmp_path / "missing").exists()  # inspecting never creates a store


def test_an_action_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["kv-store"])
    assert exit_info.value.code == 2
