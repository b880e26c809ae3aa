"""Device placement helpers (lite_verl/device.py)."""

from __future__ import annotations

import pytest
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


def test_one_vllm_engine_starts_per_gpu_at_a_time(monkeypatch, tmp_path):
    """vLLM sizes its KV cache from the free memory it sees while profiling: a second engine starting on
    the same card waits for the first (up to max_wait_s), engines on other cards do not."""
    import threading
    import time

    import lite_verl.device as device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(device.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    waited: dict[str, float] = {}

    def second(name: str, wait: float) -> None:
        t0 = time.monotonic()
        with device.gpu_start_lock(max_wait_s=wait):
            waited[name] = time.monotonic() - t0

    with device.gpu_start_lock():
        late = threading.Thread(target=second, args=("same card, gives up", 0.6))
        late.start()
        late.join()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-uuid/4")  # another card (a UUID-style id)
        second("other card", 30.0)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
        blocked = threading.Thread(target=second, args=("same card, waits", 30.0))
        blocked.start()
        time.sleep(0.8)
        assert blocked.is_alive()  # still waiting while the first start holds the card
    blocked.join(10)
    assert waited["same card, gives up"] >= 0.5
    assert waited["other card"] < 0.5
    assert 0.7 <= waited["same card, waits"] < 10


def test_vllm_start_is_retried_in_a_new_process_only_when_another_process_moved_the_memory(
    capsys, monkeypatch
):
    """A worker whose vLLM start failed because GPU memory moved under its measurement (device.vllm_memory_race)
    is replaced by a new worker, twice at most (vLLM's sleep-mode allocator refuses a second engine in one process)."""
    import lite_verl.rollout.vllm_engine as engine
    from lite_verl.device import vllm_memory_race

    monkeypatch.setattr(engine.time, "sleep", lambda s: None)
    race = engine.MemoryMoved(
        "vLLM could not start: AssertionError: Error in memory profiling. Initial free memory 119.35 GiB, "
        "current free memory 124.81 GiB.; rollout.engine=vllm, rollout.gpus=[0]"
    )
    assert vllm_memory_race(str(race))
    starts: list[int] = []

    def workers(errors):
        def start():
            starts.append(1)  # one worker process each
            if errors:
                raise errors.pop(0)
            return {"memory_lora": True}

        return start

    assert engine.start_retrying(workers([race])) == {"memory_lora": True} and len(starts) == 2
    assert "retrying in a new process" in capsys.readouterr().err
    starts.clear()
    real = engine.RolloutWorkerError("vLLM could not start: ValueError: max_model_len 9999 is too long")
    with pytest.raises(engine.RolloutWorkerError, match="max_model_len") as raised:  # a real error: no retry
        engine.start_retrying(workers([real]))
    assert len(starts) == 1 and "after" not in str(raised.value)
    starts.clear()
    full = engine.MemoryMoved("vLLM could not start: ValueError: No available memory for the cache blocks")
    with pytest.raises(
        engine.RolloutWorkerError,
        match="No available memory.*after 1 retry; the first start: .*Error in memory",
    ):
        engine.start_retrying(workers([race, full]), waits_s=(1,))
    assert len(starts) == 2
    starts.clear()
    with pytest.raises(engine.RolloutWorkerError, match="after 2 retries"):  # a race every time: 3 starts
        engine.start_retrying(workers([race, race, race, race]), waits_s=(1, 1))
    assert len(starts) == 3


@pytest.fixture
def cudnn_sdp_restored():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_gpu_trainer_keeps_attention_backward_off_cudnn(cudnn_sdp_restored):
    """#24 item 9: torch's cuDNN attention backward makes NaN gradients on masked, left-padded rows; a GPU
    training process turns that kernel off, a CPU one leaves the setting alone."""
    from lite_verl.device import safe_attention_backward

    torch.backends.cuda.enable_cudnn_sdp(True)
    safe_attention_backward(torch.device("cpu"))
    assert torch.backends.cuda.cudnn_sdp_enabled()
    safe_attention_backward(torch.device("cuda", 0))
    assert not torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_masked_attention_gradients_are_finite_after_the_switch(cudnn_sdp_restored):
    """pytorch/pytorch#196678's case (padded length 704 = 64 past a multiple of 128, every row's
    log-sum-exp below ln(FLT_MAX)): finite query gradients once safe_attention_backward has run."""
    import math

    import torch.nn.functional as F

    from lite_verl.device import safe_attention_backward

    safe_attention_backward(torch.device("cuda", 0))
    length, dim = 704, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    k = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    v = torch.randn(1, 1, length, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(dim)
    q.requires_grad_()
    mask = torch.ones(length, length, dtype=torch.bool, device="cuda").tril()[None, None]
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    assert q.grad is not None and bool(torch.isfinite(q.grad).all())


def test_vllm_sleep_is_retried_when_another_process_allocated_meanwhile(monkeypatch):
    """vLLM asserts the card's free memory grew over its sleep; another process allocating meanwhile fails
    a sleep that happened, unrecorded by vLLM's executor. The worker wakes the weights directly (workers'
    wake_up) and sleeps again; any other failure, or a race on every try, is raised."""
    import time

    from lite_verl.rollout.vllm_worker import _Server

    monkeypatch.setattr(time, "sleep", lambda s: None)
    race = AssertionError("Memory usage increased after sleeping.")

    class LLM:
        def __init__(self, errors):
            self.errors, self.calls = errors, []

        def sleep(self, level):
            self.calls.append(("sleep", level))
            if self.errors:
                raise self.errors.pop(0)

        def collective_rpc(self, method, kwargs=None):
            self.calls.append((method, kwargs))

    llm = LLM([race])
    _Server(llm).sleep(level=2)
    assert llm.calls == [("sleep", 2), ("wake_up", {"tags": None}), ("sleep", 2)]
    llm = LLM([race, race, race])
    with pytest.raises(AssertionError, match="Memory usage increased"):
        _Server(llm).sleep()
    assert [c[0] for c in llm.calls] == ["sleep", "wake_up", "sleep", "wake_up", "sleep"]
    llm = LLM([AssertionError("something else")])
    with pytest.raises(AssertionError, match="something else"):
        _Server(llm).sleep()
    assert llm.calls == [("sleep", 1)]
