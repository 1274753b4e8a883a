"""The device-discipline modes (echo_core.testing), and the layout's host-sync budget."""

from __future__ import annotations

import pytest
import torch

from echo_core.layouts import to_sglang
from echo_core.random_trees import random_tree_batch
from echo_core.testing import DeviceDisciplineError, DeviceGuard, HostSyncCounter

LAYOUT_SYNCS = 3
"""to_sglang's host reads: the size check, the mask width and the depth (none per node)."""


def test_every_kind_of_host_read_is_counted_once() -> None:
    x, s = torch.tensor([1, 2, 3]), torch.tensor(2)
    with HostSyncCounter() as syncs:
        s.item(), x.tolist(), bool(s), int(s), float(s), [0, 1, 2][s], f"{s}"
        x.cpu(), x.numpy(), x.to("cpu"), x.nonzero(), torch.where(x > 1), torch.unique(x)
        x[x > 1], torch.repeat_interleave(x, x)
    assert syncs.counts == {
        "item": 1, "tolist": 1, "__bool__": 1, "__int__": 1, "__float__": 1, "__index__": 1,
        "__format__": 1, "cpu": 1, "numpy": 1, "to": 1, "nonzero": 1, "where": 1, "unique": 1,
        "__getitem__": 1, "repeat_interleave": 1,
    }  # fmt: skip
    assert syncs.total == 15
    assert all(site.startswith("test_testing.py:") for _, site in syncs.sites)


def test_device_resident_ops_are_not_host_syncs() -> None:
    x = torch.tensor([1, 2, 3])
    with HostSyncCounter() as syncs:
        y = torch.where(x > 1, x, 0).cumsum(0)[torch.tensor([0, 2])]
        y = torch.repeat_interleave(x, x, output_size=6) + x.to(x.device).sum()
        x[torch.tensor([0])] = 5
    assert syncs.total == 0
    assert y.numel() == 6


@pytest.mark.parametrize("batch", [8, 48])
@pytest.mark.parametrize("nodes", [4, 16])
def test_sglang_layout_syncs_do_not_grow_with_batch_or_tree(batch: int, nodes: int) -> None:
    gen = torch.Generator().manual_seed(batch * nodes)
    tree = random_tree_batch(gen, batch, nodes, allow_empty=False)
    root, cache = torch.arange(batch), torch.arange(batch) * 3
    with HostSyncCounter() as syncs:
        to_sglang(tree, root, cache, num_draft_tokens=nodes + 1)
    assert syncs.total == LAYOUT_SYNCS, syncs.sites


def test_factory_without_device_is_a_violation() -> None:
    with DeviceGuard() as guard:
        torch.zeros(2, device="cpu"), torch.arange(3, device=torch.device("cpu"))
        torch.ones(2, device="cpu").new_zeros(3), torch.empty_like(torch.ones(1, device="cpu"))
    assert guard.violations == []
    expected = r"arange at test_testing.py:\d+: .*device="
    with pytest.raises(DeviceDisciplineError, match=expected), DeviceGuard():
        torch.arange(3)


def test_mixed_devices_are_reported_before_torch_sees_them() -> None:
    cpu, meta = torch.ones(3), torch.ones(3, device="meta")
    with DeviceGuard(strict=False) as guard:
        _ = meta + torch.tensor(2.0, device="cpu")  # a CPU scalar mixes legally
        with pytest.raises(RuntimeError):
            _ = cpu + meta
    assert len(guard.violations) == 1
    assert "['cpu', 'meta']" in guard.violations[0]


def test_device_only_counter_ignores_host_tensors() -> None:
    """On a GPU the engine keeps the policy on the host: reads of CPU tensors are not syncs
    there, so ``device_only`` counts none of them (and the default counts all)."""
    x = torch.arange(6)
    with HostSyncCounter(device_only=True) as host_side, HostSyncCounter() as every:
        _ = int(x.sum())
        _ = x[x > 2]
        _ = x.to(torch.device("cpu"))
        _ = x.tolist()
    assert host_side.total == 0
    assert every.total == 3  # int(), the mask index, tolist(); to(torch.device) is never counted


@pytest.mark.gpu
def test_device_only_counter_counts_reads_of_device_tensors() -> None:
    x = torch.arange(6, device="cuda")
    with HostSyncCounter(device_only=True) as syncs:
        _ = int(x.sum())
        _ = x[x > 2]
        _ = x.to(torch.device("cpu"))
        _ = x.cpu()
    assert syncs.total == 4


def test_indexing_with_a_zero_dim_integer_tensor_counts_as_a_read() -> None:
    """torch reads a 0-dim integer index as a Python int (``item``): a sync on a GPU, which a
    CUDA graph capture refuses; a 1-element index tensor (``gather``) is not."""
    x = torch.arange(6)
    i = torch.tensor(2)
    with HostSyncCounter() as syncs:
        _ = x[i]
        _ = x.gather(0, i.view(1))
        _ = x[torch.tensor([1, 2])]
    assert syncs.total == 1
