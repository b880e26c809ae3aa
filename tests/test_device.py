"""Device placement helpers (lite_verl/device.py)."""

from __future__ import annotations

import torch

from lite_verl.device import nccl_env, visible_devices_env


def test_visible_devices_follow_the_parents_mapping(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert visible_devices_env((1, 3)) == {"CUDA_VISIBLE_DEVICES": "5,7"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_devices_env((0, 2)) == {"CUDA_VISIBLE_DEVICES": "0,2"}


def test_nccl_p2p_is_disabled_only_where_peers_cannot_reach_each_other(monkeypatch):
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    peers = {(0, 1), (1, 0)}  # 0 and 1 are linked (e.g. NVLink), 2 reaches nobody (an RTX 4090)
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda a, b: (a, b) in peers)
    assert nccl_env((0,)) == {}
    assert nccl_env((0, 1)) == {}
    assert nccl_env((0, 1, 2)) == {"NCCL_P2P_DISABLE": "1"}
    monkeypatch.setenv("NCCL_P2P_DISABLE", "0")  # the user's choice stands
    assert nccl_env((0, 2)) == {}


def test_offloaded_state_is_pinned_only_where_pinning_is_exact(capsys):
    """FSDP2/DeepSpeed offload pins host memory only where torch allocates it at its size; the probe never
    claims exactness it did not measure (a GPU run checks a second, larger size against the stats)."""
    import pytest
    from conftest import has_cuda

    from lite_verl.device import OFFLOAD_PAGEABLE, exact_pinned_memory, pin_host_memory

    pin_host_memory.cache_clear()
    if not has_cuda():
        assert (
            not exact_pinned_memory()
            and not pin_host_memory(OFFLOAD_PAGEABLE)
            and not capsys.readouterr().err
        )
        return
    exact = exact_pinned_memory()
    assert (
        pin_host_memory(OFFLOAD_PAGEABLE) == exact
        and ("rounds pinned host memory" in capsys.readouterr().err) != exact
    )
    if not exact:
        pytest.skip(f"torch {torch.__version__} rounds pinned allocations up to powers of two")
    before = torch.cuda.host_memory_stats()["active_bytes.current"]
    block = torch.empty(9 * 2**20 + 4096, dtype=torch.uint8).pin_memory()
    assert torch.cuda.host_memory_stats()["active_bytes.current"] - before < 16 * 2**20
    del block
