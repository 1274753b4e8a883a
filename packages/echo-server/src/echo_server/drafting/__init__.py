"""Drafters: propose children of frontier nodes, depth by depth, for the policy to gate."""

from echo_server.drafting.base import Drafter, ExpandRequest, Proposals
from echo_server.drafting.ngram import NgramDrafter
from echo_server.drafting.null import NullDrafter

__all__ = ["Drafter", "ExpandRequest", "NgramDrafter", "NullDrafter", "Proposals"]
