"""The first-GPU acceptance run (issue 18): ``python -m gpu_check [--dry-run] [--out PATH]``.

Parts, each in its own subprocess with its own timeout (a CUDA fault in one cannot hide the
others), results gathered into one JSON summary:

1. ``tier``: the GPU test tier, every test file under ``packages/*/tests`` and ``tests/`` that
   carries the ``gpu`` marker, run with ``pytest -m gpu``.
2. ``engine``: the engine end to end on the device (:mod:`gpu_check.engine_check`).
3. ``attention``: Triton tree attention vs torch SDPA with a speed table
   (:mod:`gpu_check.attention_bench`).
4. ``cost`` / ``cost-triton``: a measured verify / draft-head cost profile at Llama-3.1-8B /
   EAGLE-3 shapes with torch SDPA / echo-kernels' tree attention
   (:mod:`gpu_check.cost_profile`), also written beside the summary as
   ``cost-gpu-<device>-llama8b[-triton].json``, a profile ``echo-sd sim`` replays when it lies
   beside the traces (``--gpu-cost``).
5. ``tiles``: a tile sweep of the tree attention on uniform and skewed row spreads
   (:mod:`gpu_check.tile_sweep`).
6. ``schedule``: the policies' own time per step on the recorded pools with their tensors on
   the device, and their host syncs (:mod:`gpu_check.schedule_time`).
7. ``fixed``: ECHO's fixed-layout step (echo_scheduler.device) on the device, eager and
   replayed from one CUDA graph per step shape (later steps reload its buffers), with its host
   syncs and its selections checked (:mod:`gpu_check.fixed_step`).
8. ``fixed-compiled``: the same step compiled by ``torch.compile`` once per shape and captured
   in that shape's graph, at B = 256 on one trace, its selections checked against the eager
   step's and both timed (:func:`gpu_check.fixed_step.run_fixed_compiled`).

On the device the parts run in ``ALL_PARTS`` order (``--parts`` picks some): the profiles first,
then engine, attention, the tier and the sweep; the summary is rewritten after every part, so a
run stopped by its limit still leaves what finished.

``--dry-run`` (CPU, CI): the tier is only collected (``--collect-only``), every ECHO module the
run needs is imported, and the engine and attention parts run at tiny sizes on the CPU, all under
:mod:`gpu_check.import_guard` (nothing the GPU machine lacks may be imported). Exit status 0 when
every part is ok.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PART_TIMEOUT_S = {
    "cost": 120, "cost-triton": 150, "engine": 120, "attention": 90, "tier": 220, "tiles": 150,
    "schedule": 240, "fixed": 150, "fixed-compiled": 240,
}  # fmt: skip
"""Seconds per part on the GPU (``--parts`` picks some; all of them need more than the script's
570 s limit only if every part runs to its timeout: the first H200 run took 102 s for four)."""
ALL_PARTS = (
    "cost", "cost-triton", "engine", "attention", "tier", "tiles", "schedule", "fixed",
    "fixed-compiled",
)  # fmt: skip
DRY_TIMEOUT_S = 120
GPU_MODULES = ("echo_core", "echo_gating", "echo_scheduler", "echo_kernels", "echo_sglang")
SERVER_SUBPACKAGES = ("engine", "model", "drafting", "kv")
NOT_ON_GPU_PATH = frozenset(
    {"echo_sglang.spec_algo", "echo_sglang.worker", "echo_sglang.models.echo_head"}
)
"""Modules the GPU run never imports: echo-sglang's SGLang-facing ones (``sglang`` is absent)."""


def gpu_test_files() -> list[str]:
    """Test files that carry the ``gpu`` marker, relative to the repository root."""
    roots = [*sorted((REPO / "packages").glob("*/tests")), REPO / "tests"]
    found = []
    for root in roots:
        for path in sorted(root.rglob("test_*.py")):
            if re.search(r"pytest\.mark\.gpu\b", path.read_text(encoding="utf-8")):
                found.append(str(path.relative_to(REPO)))
    return found


def run_tier(dry: bool) -> dict[str, Any]:
    files = gpu_test_files()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        cmd += ["-p", "gpu_check.import_guard"] if dry else []
        cmd += ["--collect-only"] if dry else [f"--junitxml={report}", "--durations=10"]
        timeout = DRY_TIMEOUT_S if dry else PART_TIMEOUT_S["tier"]
        try:
            proc = subprocess.run(
                [*cmd, *files], cwd=REPO, capture_output=True, text=True, check=False,
                timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"files": files, "ok": False, "error": f"timed out after {timeout} s"}
        counts = _junit_counts(report) if report.is_file() else {}
    tail = (proc.stdout + proc.stderr)[-4000:]
    collected = re.search(r"(\d+) tests? collected", proc.stdout)
    ok = proc.returncode == 0 and (not dry or collected is not None)
    if not dry:
        ok = ok and counts.get("tests", 0) > 0 and counts.get("skipped", 0) == 0
    return {
        "files": files,
        "returncode": proc.returncode,
        "collected": int(collected.group(1)) if collected else None,
        **counts,
        "ok": ok,
        "output_tail": tail,
    }


def _junit_counts(path: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suite = root.find("testsuite") if root.tag == "testsuites" else root
    if suite is None:
        return {}
    return {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}


def import_all() -> dict[str, Any]:
    """Import every module of the packages the GPU run uses; failures are listed."""
    names = list(GPU_MODULES) + [f"echo_server.{s}" for s in SERVER_SUBPACKAGES]
    imported, failed = [], {}
    for name in names:
        package = importlib.import_module(name)
        walk = pkgutil.walk_packages(package.__path__, prefix=f"{name}.")
        for mod in [name, *(m.name for m in walk)]:
            if mod in NOT_ON_GPU_PATH:
                continue
            try:
                importlib.import_module(mod)
                imported.append(mod)
            except ImportError as err:
                failed[mod] = str(err)
    return {"imported": len(imported), "failed": failed, "ok": not failed}


def run_part(part: str, dry: bool) -> dict[str, Any]:
    """One part in this process (called in the part's subprocess)."""
    import torch

    if dry:
        from gpu_check import import_guard

        import_guard.install()
    device = torch.device("cpu" if dry else "cuda")
    if not dry and not torch.cuda.is_available():
        return {"ok": False, "error": "torch.cuda.is_available() is False"}
    if part == "imports":
        return import_all()
    if part == "engine":
        from gpu_check.engine_check import CPU_SIZE, GPU_SIZE, run_engine_check

        return run_engine_check(device, CPU_SIZE if dry else GPU_SIZE, torch.float32)
    if part == "attention":
        from gpu_check.attention_bench import CPU_CASES, GPU_CASES, run_attention_bench

        cases, dtype = (CPU_CASES, torch.float32) if dry else (GPU_CASES, torch.bfloat16)
        return run_attention_bench(device, cases, dtype, reps=1 if dry else 20)
    if part == "tiles":
        from gpu_check.tile_sweep import CPU_SHAPES, CPU_TILES, GPU_SHAPES, TILES, run_tile_sweep

        if dry:  # the Triton launcher itself, interpreted (set before triton is imported)
            os.environ["TRITON_INTERPRET"] = "1"
            return run_tile_sweep(device, CPU_SHAPES, CPU_TILES, torch.float32, reps=1)
        return run_tile_sweep(device, GPU_SHAPES, TILES, torch.bfloat16, reps=20)
    if part == "schedule":
        from gpu_check.schedule_time import CPU_BATCHES, GPU_BATCHES, TRACES, run_schedule_time

        if dry:
            return run_schedule_time(device, CPU_BATCHES, 3, TRACES[:1])
        return run_schedule_time(device, GPU_BATCHES, 20)
    if part == "fixed":
        from gpu_check.fixed_step import CPU_BATCHES, GPU_BATCHES, TRACES, run_fixed_step

        if dry:
            return run_fixed_step(device, CPU_BATCHES, 3, TRACES[:1])
        return run_fixed_step(device, GPU_BATCHES)
    if part == "fixed-compiled":
        from gpu_check.fixed_step import COMPILED_BATCHES, CPU_BATCHES, run_fixed_compiled

        if dry:
            return run_fixed_compiled(device, CPU_BATCHES, 3)
        return run_fixed_compiled(device, COMPILED_BATCHES)
    if part in ("cost", "cost-triton"):
        from gpu_check.cost_profile import LLAMA31_8B, TINY, run_cost_profile

        attention = "triton" if part == "cost-triton" else "sdpa"
        if dry:
            return run_cost_profile(device, TINY, torch.float32, 2, 1, attention=attention)
        return run_cost_profile(device, LLAMA31_8B, torch.bfloat16, 3, 5, attention=attention)
    raise ValueError(f"unknown part {part!r}")


def _spawn(part: str, dry: bool, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{part}.json"
        cmd = [sys.executable, "-m", "gpu_check", "--part", part, "--part-out", str(out)]
        cmd += ["--dry-run"] if dry else []
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout} s"}
        if out.is_file():
            result: dict[str, Any] = json.loads(out.read_text())
        else:
            tail = (proc.stdout + proc.stderr)[-4000:]
            result = {"ok": False, "returncode": proc.returncode, "output_tail": tail}
        result.setdefault("wall_s", round(time.perf_counter() - start, 2))
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU: collect, import, tiny sizes")
    ap.add_argument("--out", type=Path, default=None, help="JSON summary path")
    ap.add_argument(
        "--parts", nargs="+", choices=ALL_PARTS, default=None, help="default: all, in this order"
    )
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if args.part:
        try:
            result = run_part(args.part, args.dry_run)
        except Exception as err:  # recorded in the summary: the point is to see what breaks
            import traceback

            result = {"ok": False, "error": repr(err), "traceback": traceback.format_exc()[-4000:]}
        args.part_out.write_text(json.dumps(result, indent=1, default=str))
        return 0
    parts = tuple(args.parts) if args.parts else ALL_PARTS
    if args.dry_run:  # the dry run also imports every module, first after the tier
        parts = ("tier", "imports", *(p for p in parts if p != "tier"))
    return _orchestrate(args.dry_run, args.out, parts)


def _report(part: str, result: dict[str, Any], out: Path) -> None:
    """Print one part's result; the cost part's profile is also written beside ``out``."""
    print(f"{part}: ok={result['ok']} ({result.get('wall_s')} s)", flush=True)
    if part == "attention" and "cases" in result:
        from gpu_check.attention_bench import format_table

        print(format_table(result), flush=True)
    if part == "engine" and "batches" in result:
        for b, r in result["batches"].items():
            print(
                f"  batch {b}: {r['identical']}/{r['requests']} identical, "
                f"{len(r['near_ties'])} near ties, {len(r['mismatches'])} mismatches, "
                f"accepted length {r['mean_accepted_length']}, "
                f"host syncs/step {r['host_syncs_per_step']}, "
                f"device violations {r['device_violations']}, "
                f"verify passes timed {r.get('timed_passes')} (unread {r.get('untimed_passes')})",
                flush=True,
            )
    if part == "schedule" and "cells" in result:
        print(f"policy on the device ({result['device']}):", flush=True)
        print(result["header"], flush=True)
        for cell in result["cells"]:
            print(cell["line"], flush=True)
        print(f"policy on the host ({result['host_cpu']}, one torch thread):", flush=True)
        for cell in result["host_cells"]:
            print(cell["line"], flush=True)
        from echo_lab.replay.hosttime import format_comparison

        for c in result["echo_vs_best"]:
            print(format_comparison(c), flush=True)
        for n, t in result["transfer"].items():
            print(f"  pool of {n} nodes: d2h {t['d2h_ms']} ms, h2d {t['h2d_ms']} ms", flush=True)
    if part == "fixed" and "cells" in result:
        from gpu_check.fixed_step import format_cells

        print(f"ECHO's fixed-layout step on {result['device']}:", flush=True)
        for line in format_cells(result):
            print(line, flush=True)
    if part == "fixed-compiled" and "cells" in result:
        from gpu_check.fixed_step import format_compiled

        print(f"ECHO's fixed-layout step compiled, on {result['device']}:", flush=True)
        for line in format_compiled(result):
            print(line, flush=True)
    if part == "tiles" and "shapes" in result:
        from gpu_check.tile_sweep import format_sweep

        print(format_sweep(result), flush=True)
    if part.startswith("cost") and result.get("ok"):
        import platform

        import torch
        from gpu_check.cost_profile import as_cost_file

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
        machine = {
            "device": name or "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "script": "scripts/gpu_check/cost_profile.py",
        }
        tag = re.sub(r"[^a-z0-9]+", "-", str(machine["device"]).lower()).strip("-") or "cpu"
        suffix = "-triton" if part == "cost-triton" else ""
        path = out.parent / f"cost-gpu-{tag}-llama8b{suffix}.json"
        path.write_text(json.dumps(as_cost_file(result, machine), indent=1) + "\n")
        for b, v in result["verify"].items():
            print(f"  verify B={b}: rows {v['rows']} ms {v['raw_ms']}", flush=True)
            if "skewed_raw_ms" in v:
                print(f"    skewed: rows {v['skewed_rows']} ms {v['skewed_raw_ms']}", flush=True)
        for b, d in result["draft_by_batch"].items():
            print(
                f"  draft B={b}: call {1e3 * d['per_call_s']:.3f} ms, "
                f"node {1e6 * d['per_node_s']:.2f} us ({d['raw_ms']} ms)",
                flush=True,
            )
        print(
            f"  attention={result['sdpa_backend']} graphs={result['graphs_captured']} "
            f"capture errors={result['capture_errors']} profile: {path}",
            flush=True,
        )


def _orchestrate(dry: bool, out: Path | None, parts: tuple[str, ...] = ALL_PARTS) -> int:
    import torch

    start = time.perf_counter()
    summary: dict[str, Any] = {
        "dry_run": dry,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "parts": {},
    }
    if out is None:
        out = Path(tempfile.gettempdir()) / ("gpu_check_dry.json" if dry else "gpu_check.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for part in parts:
        if part == "tier":
            summary["parts"]["tier"] = run_tier(dry)
            print(f"tier: ok={summary['parts']['tier']['ok']}", flush=True)
        else:
            timeout = DRY_TIMEOUT_S if dry else PART_TIMEOUT_S[part]
            summary["parts"][part] = _spawn(part, dry, timeout)
            _report(part, summary["parts"][part], out)
        out.write_text(json.dumps(summary, indent=1, default=str))
    summary["ok"] = all(p["ok"] for p in summary["parts"].values())
    summary["seconds"] = round(time.perf_counter() - start, 2)
    out.write_text(json.dumps(summary, indent=1, default=str))
    print(f"gpu_check: ok={summary['ok']} in {summary['seconds']} s; summary: {out}", flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
