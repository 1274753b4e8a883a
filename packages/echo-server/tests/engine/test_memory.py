"""Memory accounting of a node, and one copy of every packed weight (issue #20).

A projection whose 1-row calls run on ``F.linear``'s GEMV (``Linear.plain_single_row``, chosen
per CPU at load: echo_server/model/linear.py) keeps its plain copy too, and both are counted.
"""

from __future__ import annotations

from echo_server.drafting import NgramDrafter
from echo_server.drafting.eagle_drafter import eagle_drafter_for
from echo_server.engine.memory import memory_report, tensors_in, unique_bytes
from echo_server.kv.pool import KVPool
from echo_server.model.loader import LoadedModel

PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


def test_packed_projections_keep_one_copy_and_bytes_count_once(smollm: LoadedModel) -> None:
    model = smollm.model
    w = model.weights
    for layer, mm in zip(w.layers, model.linears, strict=True):
        for name in PROJECTIONS:
            linear = getattr(mm, name)
            plain = getattr(layer, name)
            if linear.packed is not None and not linear.plain_single_row:
                assert linear.weight is None  # packed only: the plain copy is released everywhere
                assert plain.numel() == 0
            elif linear.packed is not None:  # 1-row calls on the GEMV: both copies, counted once
                assert linear.weight is not None
                assert linear.weight.data_ptr() == plain.data_ptr()
            else:
                assert plain.numel() > 0
    kv = KVPool(model.config, num_slots=64, max_requests=2)
    report = memory_report(model, kv.storage, NgramDrafter())
    f32 = 4
    norms = sum(layer.attn_norm.numel() + layer.mlp_norm.numel() for layer in w.layers)
    norms += w.final_norm.numel()
    plain_projections = sum(
        getattr(layer, name).numel() for layer in w.layers for name in PROJECTIONS
    )
    tied = w.lm_head.data_ptr() == w.embed.data_ptr()
    heads = w.embed.numel() * (1 if tied else 2)
    assert report.weights == (heads + norms + plain_projections) * f32
    packed = [
        lin.packed for mm in model.linears for lin in (mm.qkv, mm.o_proj, mm.gate_up, mm.down)
    ]
    packed.append(model.lm_head.packed)
    assert report.packed == unique_bytes([p for p in packed if p is not None])
    assert report.kv_pool == kv.storage.numel() * f32
    assert report.drafter == 0  # prompt lookup holds no tensors
    assert report.rss > report.weights


def test_the_draft_head_counts_only_what_it_does_not_share(smollm: LoadedModel) -> None:
    head = eagle_drafter_for(smollm.model, None)
    kv = KVPool(smollm.model.config, num_slots=8, max_requests=1)
    report = memory_report(smollm.model, kv.storage, head)
    reachable = unique_bytes(tensors_in(head))
    shared = smollm.model.weights.embed  # the head reads the target's embedding and lm_head
    assert shared.data_ptr() in {t.data_ptr() for t in tensors_in(head)}
    assert 0 < report.drafter <= reachable - shared.numel() * shared.element_size()
    assert report.drafter < report.weights + report.packed  # a one-layer head vs the target
