"""train.offload_during_rollout: the trainer's tensors parked in host memory (train/park.py) and the colocated
vLLM waking its weights for a sync before the trainer leaves, its KV cache only after (rollout/vllm_engine.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lite_verl.train.park import HostPark


def test_parking_moves_weights_buffers_and_optimizer_state_and_brings_them_back_equal():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model[1].weight = model[0].weight  # tied: one tensor under two names
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    def tensors():
        state = [v for s in opt.state.values() for v in s.values() if v.dim()]
        return [*model.parameters(), *model.buffers(), *state]

    before = [t.detach().clone() for t in tensors()]
    ptrs = [t.data_ptr() for t in tensors()]
    park = HostPark(torch.device("cpu"))
    park.park([model], [opt])
    assert park.parked and all(t.data_ptr() != p for t, p in zip(tensors(), ptrs))
    park.park([model], [opt])  # twice: nothing more happens
    host = [t.data_ptr() for t in tensors()]
    park.unpark([model], [opt])
    assert not park.parked and all(t.data_ptr() != h for t, h in zip(tensors(), host))
    assert all(torch.equal(t, b) for t, b in zip(tensors(), before))
    assert model[1].weight is model[0].weight
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # the optimizer still holds the same Parameter objects and its moved state
    with pytest.raises(RuntimeError, match="cannot park while it holds gradients"):
        park.park([model], [opt])


def test_a_sync_before_the_trainer_leaves_wakes_vllms_weights_and_the_rollout_its_kv_cache():
    from lite_verl.rollout.vllm_engine import VLLMRolloutEngine

    calls: list[tuple] = []
    engine = object.__new__(VLLMRolloutEngine)  # no worker: the commands it would send are recorded
    engine._call = lambda command, **kw: calls.append((command, kw.get("tags", kw.get("level"))))
    engine._push_adapter = lambda step: calls.append(("push", step))
    engine.rollout, engine.mode, engine._pending = SimpleNamespace(sleep_level=1), "adapter", None
    engine.sleep_mode, engine.sleeping, engine.weights_awake, engine.kv_after_sync = True, True, False, True
    engine.sync_weights(3)
    assert calls == [("wake", ["weights"]), ("push", 3)] and engine.sleeping and engine.weights_awake
    engine.sync_weights(3)  # again (a resume's sync): the weights are awake already
    assert calls[2:] == [("push", 3)]
    engine.wake()  # the next rollout
    assert calls[3:] == [("wake", ["kv_cache"])] and not engine.sleeping and not engine.weights_awake
    engine.sleep()
    engine.kv_after_sync = False
    engine.sync_weights(4)  # the trainer stays on the card: vLLM wakes whole, as before
    assert calls[4:] == [("sleep", 1), ("wake", None), ("push", 4)] and not engine.sleeping
