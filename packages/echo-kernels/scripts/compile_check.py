"""Compile every Triton kernel ahead of time for NVIDIA targets, without a GPU.

The interpreter (TRITON_INTERPRET=1) runs kernels as numpy and accepts programs the real
compiler rejects (loop-carried type changes, unsupported constructs, shapes tl.dot refuses).
This script lowers each kernel through Triton's full pipeline (TTIR -> TTGIR -> LLVM -> PTX ->
cubin with the bundled ptxas) for sm_90 (H100/H200) and sm_80 (A100), for every dtype and
compile-time variant the launchers use. It must run without TRITON_INTERPRET; the test suite
runs it in a subprocess (tests/test_compile_check.py).

Usage: python scripts/compile_check.py [--arch 90 80] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

KernelCase = tuple[str, Any, dict[str, str], dict[str, Any]]

SHARED_MEMORY_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
"""Largest dynamic shared memory one CTA may use, bytes (H100/H200, A100)."""


def attention_cases(kernels: Any) -> Iterator[KernelCase]:
    import torch

    from echo_kernels.tree_attention import attention_config

    ptrs = ("q_ptr", "k_new_ptr", "v_new_ptr", "k_pool_ptr", "v_pool_ptr", "out_ptr")
    ints = ("stride_q_row", "stride_q_head", "stride_new_row", "stride_new_head")
    ints2 = ("stride_pool_slot", "stride_pool_head", "stride_table", "num_words")
    # (head dim, group, largest request's rows): SmolLM2 verify, Llama-8B small-tree verify,
    # Llama-8B prefill, and an odd head dim with a wide group.
    geometries = ((64, 3, 65), (128, 4, 9), (128, 4, 2048), (80, 8, 64))
    grids = (0, 2048)  # small and large grids (attention_config's LARGE_GRID tiles)
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    for (name, dtype), (head_dim, group, rows), window, programs in itertools.product(
        dtypes.items(), geometries, (False, True), grids
    ):
        cfg = attention_config(dtype, head_dim, group, rows, programs)
        sig = {p: f"*{name}" for p in ptrs}
        sig |= {"cu_rows_ptr": "*i64", "positions_ptr": "*i64", "cache_len_ptr": "*i64"}
        sig |= {"req_to_slot_ptr": "*i64", "tree_bits_ptr": "*i32", "causal_ptr": "*i8"}
        sig |= {arg: "i64" for arg in ints + ints2}
        sig |= {"qk_scale": "fp32", "window": "i64"}
        consts = {
            "HEAD_DIM": head_dim,
            "GROUP": group,
            "BLOCK_M": cfg.block_m,
            "BLOCK_N": cfg.block_n,
            "BLOCK_D": cfg.block_d,
            "HAS_WINDOW": window,
            "UPCAST": False,
            "DOT_PRECISION": "ieee",
            "num_warps": cfg.num_warps,
        }
        label = (
            f"tree_attention {name} D={head_dim} G={group} rows={rows} window={window} "
            f"programs={programs}"
        )
        yield label, kernels.tree_attention_kernel, sig, consts


def acceptance_cases(kernels: Any) -> Iterator[KernelCase]:
    sig = {name: "*i64" for name in ("token_ptr", "parent_ptr", "depth_ptr", "cu_nodes_ptr")}
    sig |= {name: "*i64" for name in ("argmax_ptr", "accepted_ptr", "num_accepted_ptr")}
    sig |= {"bonus_ptr": "*i64", "width": "i64"}
    yield "greedy_accept", kernels.greedy_accept_kernel, sig, {"BLOCK": 64}
    sig = {name: "*i64" for name in ("req_to_slot_ptr", "req_rows_ptr", "cache_len_ptr")}
    sig |= {"row_slots_ptr": "*i64"}
    sig |= {name: "*i64" for name in ("cu_nodes_ptr", "accepted_ptr", "num_accepted_ptr")}
    sig |= {"keep_ptr": "*i8", "new_len_ptr": "*i64", "stride_table": "i64", "width": "i64"}
    yield "kv_commit", kernels.kv_commit_kernel, sig, {"BLOCK": 64}
    sig = {name: "*i64" for name in ("token_ptr", "parent_ptr", "depth_ptr", "cu_nodes_ptr")}
    sig |= {"sampled_ptr": "*i8", "target_ptr": "*fp32", "draft_ptr": "*fp32"}
    sig |= {name: "*fp32" for name in ("u_node_ptr", "u_bonus_ptr", "scratch_ptr")}
    sig |= {name: "*i64" for name in ("accepted_ptr", "num_accepted_ptr", "bonus_ptr")}
    sig |= {"vocab": "i64", "width": "i64"}
    for has_draft in (True, False):
        consts = {"HAS_DRAFT": has_draft, "BLOCK_V": 1024}
        name = f"stochastic_accept draft={has_draft}"
        yield name, kernels.stochastic_accept_kernel, sig, consts


def cases(quick: bool) -> Iterator[KernelCase]:
    from echo_kernels import triton_kernels as kernels

    attention = list(attention_cases(kernels))
    # --quick: one fp16 and one bf16 variant (the engine's dtypes), windowed, GQA, D=64/128.
    yield from (attention[1], attention[11]) if quick else attention
    yield from acceptance_cases(kernels)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90], choices=[80, 90])
    parser.add_argument("--quick", action="store_true", help="a few variants per kernel")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_check: unset TRITON_INTERPRET first", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = 0
    for arch in args.arch:
        for name, fn, sig, consts in cases(args.quick):
            options = {"num_warps": consts.pop("num_warps", 4)}
            sig = sig | {k: "constexpr" for k in consts}
            t0 = time.perf_counter()
            try:
                src = ASTSource(fn=fn, signature=sig, constexprs=consts)
                target = GPUTarget("cuda", arch, 32)
                compiled = triton.compile(src, target=target, options=options)
                shared = int(compiled.metadata.shared)
                if shared > SHARED_MEMORY_LIMIT[arch]:
                    failures += 1
                    status = f"FAILED: {shared} B shared memory > {SHARED_MEMORY_LIMIT[arch]}"
                else:
                    status = f"ok, {shared // 1024} KiB shared"
            except Exception as exc:  # report every failing variant, not just the first
                failures += 1
                status = f"FAILED: {type(exc).__name__}: {exc}"
            print(f"sm_{arch} {name}: {status} ({time.perf_counter() - t0:.1f}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
