"""train.offload_during_rollout: the trainer's tensors parked in host memory (train/park.py) and the colocated
vLLM waking its weights for a sync before the trainer leaves, its KV cache only after (rollout/vllm_engine.py)."""

from __future__ import annotations

import json
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
    assert not park.parked  # nothing moved


def test_a_park_cut_short_comes_back_whole(monkeypatch):
    """A signal in the middle of a park: what moved comes back at unpark, and the next park is whole."""
    from lite_verl.train import park as park_mod

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    before = [p.detach().clone() for p in model.parameters()]
    put, calls = park_mod._Slot.put, []

    def put_then_signal(slot, tensor):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        put(slot, tensor)

    monkeypatch.setattr(park_mod._Slot, "put", put_then_signal)
    park = HostPark(torch.device("cpu"))
    with pytest.raises(KeyboardInterrupt):
        park.park([model], [])
    assert park.parked  # two of the four tensors moved
    park.unpark([model], [])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    monkeypatch.setattr(park_mod._Slot, "put", put)
    ptrs = [p.data_ptr() for p in model.parameters()]
    park.park([model], [])
    assert all(p.data_ptr() != q for p, q in zip(model.parameters(), ptrs))
    park.unpark([model], [])
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("nf4", [False, True])
def test_a_parked_trainer_hands_the_card_back(tmp_path, nf4):
    """On CUDA, as a run loads it (transformers puts the model into one allocator segment its size; nf4:
    QLoRA's 4-bit base, which needs bitsandbytes): with an adapter and AdamW state, parked, this process
    reserves almost nothing on the card; unparked, it computes the same logits. A QLoRA 7B once stayed
    whole on an H200 while parked (the device tensors were still referenced while the cache was emptied)."""
    if nf4:
        pytest.importorskip(
            "bitsandbytes", reason="bitsandbytes is not installed: pip install 'lite-verl[qlora]'"
        )
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lite_verl.config import load_config
    from lite_verl.device import allocator_settings, page_granular_allocator
    from lite_verl.model.load import load_model

    shape = Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=32000)  # fmt: skip
    Qwen2ForCausalLM(shape).save_pretrained(tmp_path)  # ~0.3 GiB in bf16
    device = torch.device("cuda", 0)
    torch.cuda.empty_cache()
    page_granular_allocator(device)  # as build_rank_backend does for an offloaded adapter-synced trainer
    try:
        model = load_model(tmp_path, load_config("4090x1").model, device, nf4=nf4)
        model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, 32000, (4, 64), device=device)
        model(ids).logits.float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            before = (
                model(ids).logits.float().cpu()
            )  # on the host: the test's own tensor is not the trainer's
        held = torch.cuda.memory_reserved(device)
        park = HostPark(device)
        park.park([model], [opt])
        assert torch.cuda.memory_reserved(device) < min(64 * 2**20, held / 4)
        park.unpark([model], [opt])
        with torch.no_grad():
            assert torch.equal(model(ids).logits.float().cpu(), before)
    finally:  # CUDA IPC of later tests in this process needs the default segments
        allocator_settings("expandable_segments:False")


def _qwen(tmp_path, tied: bool):
    from lite_verl.model.tiny import TinySpec, make_tiny_model

    return make_tiny_model(tmp_path, TinySpec(tie_embeddings=tied))


def _lora(model_dir, device, on_host: bool):
    from dataclasses import replace

    from lite_verl.config import load_config
    from lite_verl.model.load import load_model
    from lite_verl.train.lora import LoraBackend

    cfg = load_config("4090x1", None, ["train.backend=lora"])
    base = load_model(model_dir, cfg.model, device, nf4=False)
    return LoraBackend(base, replace(cfg.train, embeddings_on_host=on_host), device, seed=0)


def test_a_tied_or_cpu_embedding_table_stays_where_it_is(tmp_path, capsys):
    """train.embeddings_on_host: nothing to move on the CPU; a tied table is the LM head's weight as well,
    which the head needs on the card: it stays, with one line saying so (for a CUDA trainer)."""
    from lite_verl.train.park import embeddings_to_host

    cpu = torch.device("cpu")
    backend = _lora(_qwen(tmp_path / "untied", tied=False), cpu, on_host=True)
    assert not embeddings_to_host(backend.model, cpu)  # already in host memory
    tied = _lora(_qwen(tmp_path / "tied", tied=True), cpu, on_host=False).model
    embed = tied.get_input_embeddings()
    hooks = len(embed._forward_hooks) + len(embed._forward_pre_hooks)  # checkpointing's input-grad hook
    capsys.readouterr()
    assert not embeddings_to_host(tied, torch.device("cuda", 0))  # tied: refused before anything moves
    assert len(embed._forward_hooks) + len(embed._forward_pre_hooks) == hooks
    assert "input embeddings are its LM head (tied)" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_untied_embedding_table_in_host_memory_frees_the_card_and_computes_the_same(tmp_path):
    """On CUDA: the table leaves the card; the log-probs, the reference policy's and the adapters' gradients
    are what they were with the table on the card."""
    device = torch.device("cuda", 0)
    model_dir = _qwen(tmp_path, tied=False)
    spec = json.loads((model_dir / "config.json").read_text())
    table = spec["vocab_size"] * spec["hidden_size"] * 2  # bf16 in the 4090x1 preset
    ids = torch.randint(0, spec["vocab_size"], (4, 48), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    results = []
    for on_host in (False, True):
        torch.cuda.empty_cache()
        backend = _lora(model_dir, device, on_host)
        held = torch.cuda.memory_allocated(device)
        with backend.autocast():
            logp, _ = backend.forward(ids, mask, 16, 1.0)
            ref, _ = backend.forward(ids, mask, 16, 1.0, reference=True)
        backend.backward(logp.float().mean())
        grads = [p.grad.float().cpu() for p in backend.params]
        results.append((held, logp.detach().float().cpu(), ref.float().cpu(), grads))
        del backend
    (on_card, *a), (on_host_, *b) = results
    assert on_card - on_host_ >= 0.99 * table
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # the same rows reach the same kernels
    for x, y in zip(a[2], b[2]):  # attention's backward may sum in another order from run to run
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize(
    ("sets", "order"),
    [
        (["train.offload_during_rollout=true"], ["sleep", "load", "park", "sync 3"]),
        (["train.offload_during_rollout=true", "sync.mode=merged"], ["sleep", "load", "sync 3", "park"]),
        ([], ["load", "sync 3"]),
    ],
)
def test_a_checkpoint_is_served_in_the_order_of_a_steps_end(tmp_path, sets, order):
    """--resume and `lite-verl eval RUN`: vLLM sleeps while the parked trainer loads the checkpoint back onto
    the card; an adapter sync follows the park (through host memory), a merged sync precedes it."""
    import json

    from lite_verl.config import load_config
    from lite_verl.loop import serve_checkpoint

    (tmp_path / "state.json").write_text(json.dumps({"step": 3}))
    calls: list[str] = []
    backend = SimpleNamespace(load=lambda d: calls.append("load"), park=lambda: calls.append("park"))
    engine = SimpleNamespace(
        sleep=lambda: calls.append("sleep"), sync_weights=lambda s: calls.append(f"sync {s}")
    )
    cfg = load_config("4090x1", None, ["train.backend=qlora", *sets])
    assert serve_checkpoint(SimpleNamespace(cfg=cfg, backend=backend, engine=engine), tmp_path)["step"] == 3
    assert calls == order
