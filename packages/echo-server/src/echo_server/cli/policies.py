"""``echo-sd policies``: the selectable drafting policies, one line each."""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTIONS = {
    "plain": "no speculation: one token per step (the reference output)",
    "chain": "classic speculative decoding: one chain of k draft tokens per request",
    "static": "a fixed tree shape per request (EAGLE-1 / Medusa style)",
    "eagle2": "per-request dynamic tree, same size for every request (EAGLE-2, SGLang)",
    "global-topk": "one budget K over the batch, best path scores first, no gating",
    "echo": "ECHO: sparse calibrated gates, depth for confident requests, then width",
    "echo-dense": "ECHO ablation: a gate at every depth",
    "echo-fixed": "ECHO ablation: one threshold for all depths",
    "echo-history": "ECHO with each request's keys rescaled by its own recent acceptance",
    "echo-aging": "ECHO giving a request left without draft rows for 4 steps its best draft first",
}


def add_parser(sub: Any) -> None:
    sub.add_parser("policies", help="list the drafting policies")


def run(args: argparse.Namespace) -> int:
    width = max(len(n) for n in DESCRIPTIONS)
    for name, text in DESCRIPTIONS.items():
        print(f"{name:<{width}}  {text}")
    return 0
