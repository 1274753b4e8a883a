"""The union drafter: two real prompt-lookup drafters with different reach, merged per node."""

from __future__ import annotations

import math

import torch

from echo_core.tree import ROOT
from echo_server.drafting import ExpandRequest, NgramDrafter
from echo_server.drafting.mixture import MixtureDrafter

# 3-gram (5 1 2) was followed by 9; the 1-gram (2) by 9 and by 8
CONTEXT = [5, 1, 2, 9, 7, 2, 8, 5, 1, 2]


def _mixture() -> MixtureDrafter:
    drafter = MixtureDrafter(NgramDrafter(max_n=3, min_n=3), NgramDrafter(max_n=1, min_n=1))
    drafter.begin_step([CONTEXT], ["r"])
    return drafter


def _expand(
    drafter: MixtureDrafter, topk: int, path: list[int] | None = None
) -> list[tuple[int, int, float]]:
    nodes = ExpandRequest(
        request=torch.zeros(1, dtype=torch.int64),
        node=torch.tensor([ROOT]),
        path=[path or []],
        topk=torch.tensor([topk]),
    )
    out = drafter.expand(nodes)
    return list(zip(out.source.tolist(), out.token.tolist(), out.logprob.tolist(), strict=True))


def test_a_token_proposed_by_both_keeps_the_higher_score() -> None:
    got = _expand(_mixture(), topk=4)
    assert [t for _, t, _ in got] == [9, 8]  # ranked by score
    assert math.isclose(got[0][2], math.log(1 / 2), rel_tol=1e-6)  # 3-gram: 1 / (1 + 1)
    assert math.isclose(got[1][2], math.log(1 / 3), rel_tol=1e-6)  # 1-gram: 1 / (2 + 1)


def test_each_node_keeps_its_k_best_children_of_the_union() -> None:
    assert [t for _, t, _ in _expand(_mixture(), topk=1)] == [9]


def test_nodes_neither_drafter_knows_get_no_children() -> None:
    assert _expand(_mixture(), topk=3, path=[42]) == []


def test_the_name_and_feature_layers_combine() -> None:
    drafter = _mixture()
    assert drafter.name == "ngram+ngram"
    assert drafter.aux_layers == ()


def test_each_drafter_observes_only_its_own_aux_layers() -> None:
    from echo_server.drafting.base import TargetFeedback
    from echo_server.drafting.eagle_drafter import EagleDrafter
    from echo_server.drafting.testing import HIDDEN, feedback, tiny_head

    class Layers(NgramDrafter):
        aux_layers: tuple[int, ...] = (0, 7)
        seen: tuple[torch.Tensor, ...] = ()

        def observe(self, feedback: TargetFeedback) -> None:
            self.seen = feedback.aux

    head, other = EagleDrafter(tiny_head(aux_layers=(3, 7))), Layers()
    mixture = MixtureDrafter(head, other)
    assert mixture.aux_layers == (0, 3, 7)
    a0, a3, a7 = (torch.full((2, HIDDEN), float(v)) for v in (0, 3, 7))
    mixture.observe(feedback([("r", [1, 2], torch.randn(2, HIDDEN), 0, 3)], (a0, a3, a7)))
    assert [float(t[0, 0]) for t in other.seen] == [0.0, 7.0]
    mixture.begin_step([[1, 2, 3]], ["r"])
    assert _expand(mixture, topk=2)  # the head got (a3, a7) and drafts
