"""Idle memory of a serving node built like ``echo-sd serve`` (defaults: embedded model, CPU).

Prints what the node holds (echo_server.engine.memory) and its idle RSS, and exits 1 when the
RSS exceeds the target ``1.5 x (weights + packed + kv_pool)`` (issue #20; packed copies are
the weights in the layout the projections read, so they count as weights). Extra arguments
are ``echo-sd serve``'s engine options, e.g. ``--drafter ngram`` or ``--kv-slots 4096``.

    .venv/bin/python scripts/memory_report.py [--max-batch 8 ...]
"""

from __future__ import annotations

import gc
import json
import sys
import time

from echo_lab.bench.intervals import cpu_name
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine.memory import MIB, memory_report, rss_bytes, trim_heap

TARGET = 1.5


def main(argv: list[str]) -> int:
    before = rss_bytes()
    args = build_parser().parse_args(["serve", *argv])
    loaded = load(args)
    engine = build_engine(loaded, args.policy, args)
    del loaded
    gc.collect()
    trimmed = trim_heap()  # as serve_node does before it logs node_memory
    time.sleep(1.0)
    report = memory_report(engine.model, engine.kv.storage, engine.drafter)
    fields = report.log_fields()
    fields["rss_before_load_mib"] = round(before / MIB, 1)
    fields["trimmed_mib"] = round(trimmed / MIB, 1)
    fields["unaccounted_mib"] = round((report.rss - report.accounted - before) / MIB, 1)
    print(json.dumps({"cpu": cpu_name(), **fields}, indent=1))
    ok = report.rss_over_weights_and_kv <= TARGET
    print(
        f"idle RSS / (weights + packed + KV) = {report.rss_over_weights_and_kv:.2f} "
        f"(target <= {TARGET}): {'ok' if ok else 'over'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
