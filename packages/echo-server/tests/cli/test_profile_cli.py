"""``echo-sd profile show|clear`` on a cache directory of planted files (no model is loaded),
and the verify-cost gauges of ``/metrics`` (grpc/metrics.py) from a snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_scheduler.live_cost import BucketEstimate
from echo_server.cli import BUILTIN, build_parser, profile
from echo_server.engine.cost_feedback import CostSnapshot
from echo_server.engine.profile import DEFAULT_CACHE
from echo_server.engine.profile_store import FORMAT
from echo_server.node.metrics import NodeMetrics


def main(argv: list[str]) -> int:
    """``echo-sd`` over the built-in commands only (no plugin is imported)."""
    return profile.run(build_parser(BUILTIN).parse_args(argv))


def plant(path: Path, ms: dict[int, float]) -> None:
    tokens = sorted(ms)
    data = {
        "format": FORMAT,
        "machine": {"cpu": "Elsewhere CPU", "torch": "0", "threads": "1", "model": "m"},
        "measured": "2026-12-05T12:00:00+00:00",
        "tokens": tokens,
        "seconds": [ms[t] / 1e3 for t in tokens],
        "rounds": [[ms[t] / 1e3] * 3 for t in tokens],
        "reference_s": [ms[tokens[0]] / 1e3] * 2,
    }
    path.write_text(json.dumps(data))


def test_show_rechecks_every_cached_profile_and_clear_deletes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plant(tmp_path / "good.json", {1: 30.0, 2: 30.5, 4: 31.0, 8: 38.0})
    plant(tmp_path / "bad.json", {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2})
    (tmp_path / "old.json").write_text(json.dumps({"tokens": [1, 2], "seconds": [0.1, 0.2]}))
    assert main(["profile", "show", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    good = out.split("good.json")[1]
    assert "checks passes" in good.splitlines()[2]
    assert "another machine" in out
    bad = out.split("bad.json")[1].split("good.json")[0]
    assert "fails: not monotone" in bad
    assert "1:33.8 2:49.2" in bad
    assert "old.json: format None" in out
    assert main(["profile", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "deleted 3" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.json"))
    assert main(["profile", "show", "--cache-dir", str(tmp_path)]) == 0
    assert "no cached profile" in capsys.readouterr().out


def test_metrics_show_the_cost_model_per_row_count() -> None:
    metrics = NodeMetrics()
    snap = CostSnapshot(
        "unsettled",
        (BucketEstimate(1, 9, 0.03, 0.0338, 0.03), BucketEstimate(2, 3, None, 0.0492, 0.045)),
        12,
        1,
        None,
    )
    metrics.on_cost(snap)
    r = metrics.registry
    assert r.get_sample_value("echo_node_verify_profile_source", {"source": "unsettled"}) == 1
    assert r.get_sample_value("echo_node_verify_cost_live_seconds", {"rows": "1"}) == 0.03
    assert r.get_sample_value("echo_node_verify_cost_live_seconds", {"rows": "2"}) is None
    assert r.get_sample_value("echo_node_verify_cost_profile_seconds", {"rows": "2"}) == 0.0492
    assert r.get_sample_value("echo_node_verify_cost_curve_seconds", {"rows": "2"}) == 0.045
    assert r.get_sample_value("echo_node_verify_cost_samples", {"rows": "2"}) == 3
    assert r.get_sample_value("echo_node_verify_cost_corrections") == 1
    metrics.on_cost(CostSnapshot("cached", (), 0, 0, None))
    assert r.get_sample_value("echo_node_verify_profile_source", {"source": "unsettled"}) is None
    assert r.get_sample_value("echo_node_verify_cost_samples", {"rows": "2"}) is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], DEFAULT_CACHE),
        (["--profile-cache", "off"], None),
        (["--profile-cache", "~/profiles"], Path.home() / "profiles"),
    ],
)
def test_the_profile_cache_option_names_a_directory_or_off(
    argv: list[str], expected: Path | None
) -> None:
    args = build_parser(BUILTIN).parse_args(["generate", "x", *argv])
    assert args.profile_cache == expected


def test_an_empty_profile_cache_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(BUILTIN).parse_args(["generate", "x", "--profile-cache", ""])
    assert "--profile-cache" in capsys.readouterr().err
