"""The replay's arm grid: every fixed tree has a floored twin (echo_lab.replay.arms)."""

from __future__ import annotations

from echo_lab.replay.arms import default_arms, optional_arms, select_arms


def test_every_fixed_grid_point_has_an_optional_floored_arm() -> None:
    fixed = [a for a in default_arms() if a.family in ("chain", "static", "eagle2")]
    floored = {a.name: a for a in optional_arms() if a.family.endswith("+floor")}
    assert set(floored) == {f"{a.name}+floor" for a in fixed}
    for a in fixed:
        f = floored[f"{a.name}+floor"]
        assert (f.policy, f.config, f.per_request) == (f"{a.policy}+floor", a.config, a.per_request)
        assert f.floor
        assert f.gate == "echo_nogate"
    every = default_arms() + optional_arms()
    picked = {a.name for a in select_arms(every, ["chain+floor"])}
    assert picked == {f"{a.name}+floor" for a in fixed if a.family == "chain"} | {"plain", "echo"}
