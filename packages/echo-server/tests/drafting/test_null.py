"""Plain decoding is the reference of every speedup: it must not run a drafter."""

from __future__ import annotations

import argparse

import torch

from echo_server.cli.options import build_drafter
from echo_server.drafting import NullDrafter
from echo_server.drafting.base import ExpandRequest
from echo_server.drafting.eagle_drafter import EagleDrafter
from echo_server.drafting.mixture import MixtureDrafter
from echo_server.model.loader import LoadedModel


def test_null_drafter_proposes_nothing() -> None:
    nodes = ExpandRequest(
        request=torch.tensor([0, 1]),
        node=torch.tensor([-1, -1]),
        path=[[], []],
        topk=torch.tensor([4, 4]),
    )
    drafter = NullDrafter()
    drafter.begin_step([[1, 2], [3]], ["a", "b"])
    out = drafter.expand(nodes)
    assert out.token.numel() == 0
    assert out.source.numel() == 0
    assert out.logprob.numel() == 0


def test_plain_gets_no_drafter_whatever_drafter_is_asked_for(smollm: LoadedModel) -> None:
    for choice in ("eagle", "eagle+ngram", "ngram", "auto"):
        args = argparse.Namespace(drafter=choice, head=None, model=None)
        assert isinstance(build_drafter(args, smollm, "plain"), NullDrafter)
    args = argparse.Namespace(drafter="eagle", head=None, model=None)
    assert isinstance(build_drafter(args, smollm, "echo"), EagleDrafter)
    args = argparse.Namespace(drafter="eagle+ngram", head=None, model=None)
    assert isinstance(build_drafter(args, smollm, "eagle2"), MixtureDrafter)
