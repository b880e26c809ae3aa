"""The trainer and the HF rollout engine on a tiny model: invariants that must hold on every machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import SMALL

from lite_verl.config import load_config
from lite_verl.loop import prepare, train_step
from lite_verl.rollout.base import SamplingSettings
from lite_verl.rollout.hf import left_pad, response_mask_after_eos
from lite_verl.train.lora import keep_input_dtype


def test_response_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 9, 7, 9], [5, 6, 7, 8]])
    assert response_mask_after_eos(ids, {9}).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_left_pad():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_rollout_log_probs_equal_trainer_log_probs():
    """The sampled tokens' log-probs from generate (KV cache, left padding) match a full forward."""
    session = prepare(load_config("laptop", None, SMALL + ["rollout.temperature=0.7"]))
    prompts = [session.train_set.token_ids[i] for i in range(6)]
    rollout = session.engine.generate(
        prompts, SamplingSettings(n=2, temperature=0.7, max_new_tokens=12), seed=3
    )
    assert rollout.response_ids.shape[0] == 12
    with torch.no_grad():
        lp, _ = session.backend.forward(
            rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1], 0.7
        )
    gap = ((lp - rollout.rollout_log_probs).abs() * rollout.response_mask).max().item()
    assert gap < 1e-4, gap
    # same seed, same samples
    again = session.engine.generate(
        prompts, SamplingSettings(n=2, temperature=0.7, max_new_tokens=12), seed=3
    )
    assert torch.equal(again.response_ids, rollout.response_ids)


def test_streamed_rollout_log_probs_equal_those_of_every_steps_logits():
    """The engine turns each step's logits into the sampled token's log-prob as generate goes; keeping all
    of them (transformers' output_logits, [B, R, V]) gives the same numbers, bit for bit."""
    from lite_verl.algos import log_probs_from_logits

    session = prepare(load_config("laptop", None, SMALL))
    engine, prompts = session.engine, [session.train_set.token_ids[i] for i in range(4)]
    sampling = SamplingSettings(n=2, temperature=0.7, max_new_tokens=10)
    rollout = engine.generate(prompts, sampling, seed=5)
    rows = [p for p in prompts for _ in range(2)]
    ids, mask = left_pad(rows, engine.pad_id)
    torch.manual_seed(5)
    engine.model.eval()
    with torch.no_grad():
        out = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_k=0,
                                    top_p=1.0, repetition_penalty=1.0, max_new_tokens=10, eos_token_id=sorted(engine.eos_ids),
                                    pad_token_id=engine.pad_id, output_logits=True, return_dict_in_generate=True)  # fmt: skip
    engine.model.train()
    tokens = out.sequences[:, ids.shape[1] :]
    assert torch.equal(tokens * rollout.response_mask, rollout.response_ids * rollout.response_mask)
    kept = torch.stack([log_probs_from_logits(s.float() / 0.7, t) for s, t in zip(out.logits, tokens.T)], 1)
    assert torch.equal(kept * rollout.response_mask, rollout.rollout_log_probs)


def _two_steps(micro: int) -> list[dict[str, float]]:
    from lite_verl.data.loader import PromptSampler
    from lite_verl.run.cost import Ledger

    cfg = load_config("laptop", None, SMALL + [f"train.micro_batch_size={micro}"])
    session = prepare(cfg)
    sampler = PromptSampler(len(session.train_set), cfg.trainer.batch_size, cfg.trainer.seed, True)
    ledger = Ledger.from_config(cfg)
    return [train_step(session, sampler, step, ledger) for step in (1, 2)]


def test_micro_batch_size_does_not_change_the_maths():
    """Acceptance: same seed and global batch, micro_batch_size 1 vs 4 -> same step-1 loss (1e-5 rel),
    same gradient norm, and therefore the same step-2 rollout and loss."""
    one, four = _two_steps(1), _two_steps(4)
    assert one[0]["actor/loss"] == pytest.approx(four[0]["actor/loss"], rel=1e-5, abs=1e-7)
    assert one[0]["actor/grad_norm"] == pytest.approx(four[0]["actor/grad_norm"], rel=1e-4)
    assert one[0]["actor/grad_norm"] > 0
    assert one[1]["reward/mean"] == four[1]["reward/mean"]
    assert one[1]["actor/loss"] == pytest.approx(four[1]["actor/loss"], rel=1e-4, abs=1e-6)
    assert one[1]["actor/kl_loss"] == pytest.approx(four[1]["actor/kl_loss"], rel=1e-3, abs=1e-8)


def _corrected_steps(monkeypatch, separate_pass: bool, level: str) -> list[dict[str, float]]:
    """Two steps with rollout correction against an engine whose log-probs are off by noise."""
    from dataclasses import replace

    from lite_verl import update
    from lite_verl.data.loader import PromptSampler
    from lite_verl.run.cost import Ledger

    if (
        separate_pass
    ):  # the old path: a no-grad "experience" forward gives old, weights formed before the update
        monkeypatch.setattr(update, "on_policy", lambda cfg: False)
    cfg = load_config(
        "laptop", None, SMALL + [f"algorithm.rollout_correction={level}", "train.micro_batch_size=2"]
    )
    session = prepare(cfg)
    generate = session.engine.generate

    def noisy(*args, **kwargs):
        out = generate(*args, **kwargs)
        noise = torch.randn(out.rollout_log_probs.shape, generator=torch.Generator().manual_seed(1)) * 0.3
        return replace(out, rollout_log_probs=out.rollout_log_probs + noise * out.response_mask)

    session.engine.generate = noisy
    forward, no_grad = session.backend.forward, [0]

    def counted(*args, **kwargs):  # the experience pass is the no-grad forwards (reference, old)
        no_grad[0] += not torch.is_grad_enabled()
        return forward(*args, **kwargs)

    session.backend.forward = counted
    sampler = PromptSampler(len(session.train_set), cfg.trainer.batch_size, cfg.trainer.seed, True)
    ledger = Ledger.from_config(cfg)
    steps = []
    for step in (1, 2):
        no_grad[0] = 0
        steps.append({**train_step(session, sampler, step, ledger), "no_grad_forwards": no_grad[0]})
    return steps


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_correction_in_the_update_equals_a_separate_pass(monkeypatch, level):
    """On-policy (one epoch, one mini-batch): the IS weights formed from the update's own forward give the
    loss, gradient and IS metrics of the separate no-grad pass they replace (#29 goal 6)."""
    fast = _corrected_steps(monkeypatch, False, level)
    slow = _corrected_steps(monkeypatch, True, level)
    for a, b in zip(fast, slow):
        assert a["rollout/is_weight_mean"] != pytest.approx(1.0, abs=1e-3)  # the weights matter here
        for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "rollout/is_weight_mean",
                    "rollout/is_weight_max", "rollout/is_truncated_frac", "reward/mean"):  # fmt: skip
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    # the old log-probs' own pass is gone: only the reference's no-grad forwards remain (counted, not timed)
    assert 0 < fast[0]["no_grad_forwards"] < slow[0]["no_grad_forwards"]


def test_update_changes_the_policy_and_reference_stays():
    cfg = load_config("laptop", None, SMALL)
    session = prepare(cfg)
    rollout = session.engine.generate(
        session.train_set.token_ids[:2], SamplingSettings(n=2, max_new_tokens=8), 1
    )
    args = (rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1], 1.0)
    with torch.no_grad():
        before, _ = session.backend.forward(*args)
        ref_before, _ = session.backend.forward(*args, reference=True)
    assert torch.allclose(before, ref_before)  # LoRA B starts at zero: policy == reference
    from lite_verl.data.loader import PromptSampler
    from lite_verl.run.cost import Ledger

    train_step(session, PromptSampler(64, 4, 0, True), 1, Ledger.from_config(cfg))
    with torch.no_grad():
        after, _ = session.backend.forward(*args)
        ref_after, _ = session.backend.forward(*args, reference=True)
    assert not torch.allclose(after, before)
    assert torch.allclose(ref_after, ref_before)


def test_response_texts_decode_only_valid_tokens(tiny_dir):
    """Padding may be an ordinary token of a real tokenizer (id 0 is '!' in Qwen's): never decode it."""
    from transformers import AutoTokenizer

    from lite_verl.batch import RolloutBatch

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    word = tok("cccc", add_special_tokens=False)["input_ids"]
    filler = tok("a", add_special_tokens=False)["input_ids"][0]  # a normal token used as padding
    ids = torch.tensor([word + [filler] * 3])
    mask = torch.tensor([[1] * len(word) + [0] * 3])
    batch = RolloutBatch(ids[:, :1], torch.ones(1, 1, dtype=torch.long), ids, mask, torch.zeros(ids.shape))
    assert batch.response_texts(tok) == ["cccc"]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_flat_safetensors_file_reads_back_with_safetensors(tmp_path, dtype):
    from safetensors.torch import load_file

    from lite_verl.tensorfile import save_flat

    tensors = {"a.lora_A.weight": torch.randn(3, 4), "b": torch.randn(5), "c": torch.randn(2, 2, 2)}
    save_flat(tensors, tmp_path / "x.safetensors", dtype)
    back = load_file(str(tmp_path / "x.safetensors"))
    assert list(back) == list(tensors)
    for k, v in tensors.items():
        assert torch.equal(back[k], v.to(dtype or v.dtype))


def test_fp32_head_matches_a_float64_reference_forward_and_backward():
    from lite_verl.train import head

    torch.manual_seed(0)
    h = torch.randn(2, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.bfloat16, requires_grad=True)
    old, head.CHUNK_ROWS = head.CHUNK_ROWS, 7  # several chunks, the last one short
    try:
        out = head.fp32_logits(h, w)
        (out * torch.arange(40.0)).sum().backward()
    finally:
        head.CHUNK_ROWS = old
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = h64 @ w64.t()
    (ref * torch.arange(40.0, dtype=torch.float64)).sum().backward()
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-5)
    assert torch.allclose(h.grad.double(), h64.grad.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(w.grad.double(), w64.grad.to(torch.bfloat16).double(), rtol=1e-2, atol=1e-2)


def test_flat_file_writer_reuses_its_buffers_and_writes_current_values(tmp_path):
    from safetensors.torch import load_file

    from lite_verl.tensorfile import FlatFileWriter

    a, b = torch.zeros(4, 3), torch.ones(7)
    writer = FlatFileWriter()
    for step in range(3):
        a += step
        writer.write({"a": a, "b": b}, tmp_path / "x.safetensors", torch.bfloat16)
        back = load_file(str(tmp_path / "x.safetensors"))
        assert torch.equal(back["a"], a.bfloat16()) and torch.equal(back["b"], b.bfloat16())


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="bitsandbytes is not installed: pip install 'lite-verl[qlora]'",
)
def test_qlora_trains_its_adapter_and_stays_near_the_full_precision_base():
    from lite_verl.loop import prepare
    from lite_verl.model.tiny import resolve_tiny

    smooth = resolve_tiny("tiny:qwen2", init_std=0.02)  # a smooth model: 4-bit error stays small
    sessions = {b: prepare(load_config("laptop", None, [*SMALL, f"model.path={smooth}", f"train.backend={b}"]))
                for b in ("lora", "qlora")}  # fmt: skip
    q = sessions["qlora"]
    assert (
        type(q.backend.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer).__name__
        == "Linear4bit"
    )
    assert q.cfg.algorithm.rollout_correction == "token"  # auto: the trainer's base is quantized
    ids = torch.randint(3, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp = {b: s.backend.forward(ids, torch.ones_like(ids), 12, 1.0)[0] for b, s in sessions.items()}
    assert (lp["qlora"] - lp["lora"]).abs().mean() < 0.05  # NF4 error on a smooth model: small
    before = {n: p.detach().clone() for n, p in q.backend.model.named_parameters() if p.requires_grad}
    from lite_verl.data.loader import PromptSampler
    from lite_verl.run.cost import Ledger

    metrics = train_step(q, PromptSampler(len(q.train_set), 4, 0, True), 1, Ledger.from_config(q.cfg))
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    changed = [
        n for n, p in q.backend.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])
    ]
    assert changed and all("lora_" in n for n in changed)
    merged = [w for group in q.backend.merged_linears() for _, w, _ in group]
    assert merged and all(
        w.dtype == torch.float32 and w.dim() == 2 for w in merged
    )  # NF4 dequantized for a sync


def test_micro_batches_drop_common_padding_and_keep_the_numbers():
    """Rows of different prompt and response lengths: micro-batches are cut in length order and lose the
    columns that are padding in all their rows; the log-probs equal one forward of the padded batch."""
    from lite_verl.batch import Experience, RolloutBatch, Split, micro_batch_rows
    from lite_verl.update import _micro_batches, batched_log_probs

    session = prepare(load_config("laptop", None, SMALL))
    g = torch.Generator().manual_seed(0)
    n, p, r = 6, 10, 12
    prompt_len, response_len = [10, 3, 7, 2, 10, 4], [12, 2, 5, 1, 9, 3]
    prompt_mask = torch.tensor([[0] * (p - k) + [1] * k for k in prompt_len])
    response_mask = torch.tensor([[1] * k + [0] * (r - k) for k in response_len])
    rollout = RolloutBatch(
        prompt_ids=torch.randint(3, 300, (n, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, 300, (n, r), generator=g) * response_mask,
        response_mask=response_mask,
        rollout_log_probs=torch.zeros(n, r),
    )
    with torch.no_grad():
        whole, _ = session.backend.forward(rollout.input_ids, rollout.attention_mask, r, 1.0)
    got = batched_log_probs(session.backend, rollout, Split(2), 1.0, reference=False)
    assert torch.allclose(got, whole * response_mask, atol=1e-5)
    exp = Experience(rollout.input_ids, rollout.attention_mask, response_mask.float(), None, None,
                     torch.ones(n, r), rollout.rollout_log_probs)  # fmt: skip
    shapes = [(m.num_rows, m.input_ids.shape[1], m.response_length) for m in _micro_batches(exp, Split(2))]
    # longest rows first (22, 19 | 12, 7 | 5, 3 tokens): each pair keeps only the columns its rows use
    assert shapes == [(2, 10 + 12, 12), (2, 7 + 5, 5), (2, 3 + 2, 2)], shapes
    # packed (train.pack_micro_batches): up to 2 rows x 22 tokens = 44 tokens of trimmed tensor each
    packed = [
        (m.num_rows, m.input_ids.shape[1], m.response_length) for m in _micro_batches(exp, Split(2, 44))
    ]
    assert packed == [(2, 22, 12), (3, 7 + 5, 5), (1, 2 + 1, 1)], packed
    got = batched_log_probs(session.backend, rollout, Split(2, 44), 1.0, reference=False)
    assert torch.allclose(got, whole * response_mask, atol=1e-5)
    # a row longer than the budget still gets a micro-batch of its own
    assert [len(c) for c in micro_batch_rows(exp.attention_mask, r, Split(2, 10))] == [1, 1, 1, 1, 2]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm", "seq-mean-token-mean"])
def test_trimmed_micro_batches_give_the_whole_batch_gradient(mode):
    """Every loss aggregation (Dr. GRPO's constant length included) gives the same loss and gradient
    from micro-batches of one row (each trimmed to its own length) as from one padded micro-batch."""
    from dataclasses import replace

    from lite_verl.batch import Experience, Split
    from lite_verl.update import _actor_grads

    session = prepare(load_config("laptop", None, SMALL))
    backend, g = session.backend, torch.Generator().manual_seed(1)
    n, p, r = 4, 6, 10
    prompt_mask = torch.tensor([[0] * (p - k) + [1] * k for k in (6, 2, 4, 3)])
    response_mask = torch.tensor([[1] * k + [0] * (r - k) for k in (10, 2, 6, 1)])
    ids = torch.randint(3, 300, (n, p + r), generator=g) * torch.cat([prompt_mask, response_mask], 1)
    exp = Experience(ids, torch.cat([prompt_mask, response_mask], 1), response_mask.float(), None, None,
                     torch.randn(n, r, generator=g) * response_mask, torch.zeros(n, r))  # fmt: skip
    cfg = replace(session.cfg.algorithm, loss_agg_mode=mode, use_kl_loss=False, entropy_coeff=0.01)
    norm = {"global_tokens": float(response_mask.sum()), "global_seqs": float(n), "global_length": float(r)}

    def grads(micro):
        backend.zero_grad()
        out = _actor_grads(backend, exp, cfg, micro, 1.0, norm)
        return out["actor/loss"], torch.cat([q.grad.flatten() for q in backend.params if q.grad is not None])

    (one_loss, one), (all_loss, whole) = grads(Split(1)), grads(Split(n))
    packed_loss, packed = grads(Split(1, p + r))  # one full-length row's tokens: the two short rows share one
    backend.zero_grad()
    assert one_loss == pytest.approx(all_loss, rel=1e-5, abs=1e-7)
    assert (one - whole).abs().max() < 1e-4 * whole.abs().max(), (one - whole).abs().max()
    assert packed_loss == pytest.approx(all_loss, rel=1e-5, abs=1e-7)
    assert (packed - whole).abs().max() < 1e-4 * whole.abs().max()


def test_merged_buckets_with_everything_hold_the_whole_merged_model():
    """sync.mode=merged sends only the adapted modules' linears; with `everything` (rollout.sleep_level=2,
    whose engine discarded its weights) the buckets are the whole merged model under its HF names."""
    import copy

    session = prepare(load_config("laptop", None, SMALL))
    model = session.backend.model
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    some = {n for bucket in session.backend.merged_weight_buckets(2**20, "float32") for n, _ in bucket}
    whole = {
        n: t
        for bucket in session.backend.merged_weight_buckets(2**20, "float32", everything=True)
        for n, t in bucket
    }
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    if model.config.tie_word_embeddings:
        reference.pop("lm_head.weight")
    assert some < set(whole) and set(whole) == set(reference)
    assert "model.embed_tokens.weight" in whole and "model.norm.weight" not in some
    assert all(torch.allclose(whole[n], reference[n].float(), atol=1e-6) for n in reference)


def test_every_backend_provides_the_train_backend_protocol():
    """LoRA, full fine-tuning and the multi-rank wrapper take the same arguments with the same defaults
    for every method of train/base.TrainBackend, and say their capabilities as attributes."""
    import inspect

    from lite_verl.train.base import TrainBackend
    from lite_verl.train.full import FullBackend
    from lite_verl.train.group import GroupBackend
    from lite_verl.train.lora import LoraBackend

    def params(fn) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]

    methods = [n for n, v in vars(TrainBackend).items() if inspect.isfunction(v) and not n.startswith("_")]
    flags = ["has_adapter", "supports_critic", "sharded"]
    assert {"forward", "merged_weight_buckets", "save", "load", "critic_step"} <= set(methods)
    for cls in (LoraBackend, FullBackend, GroupBackend):
        for name in methods:
            assert params(getattr(cls, name)) == params(getattr(TrainBackend, name)), (cls.__name__, name)
    assert [getattr(LoraBackend, f) for f in flags] == [True, True, False]
    assert [getattr(FullBackend, f) for f in flags] == [False, False, True]
    session = prepare(load_config("laptop", None, SMALL))
    assert isinstance(session.backend, TrainBackend) and session.backend.device == torch.device("cpu")


def test_host_peak_memory_without_the_posix_resource_module(monkeypatch):
    """Windows has no `resource`: the run's summary says None instead of crashing at its end."""
    import builtins as py_builtins

    from lite_verl.loop import host_peak_gib

    assert host_peak_gib() > 0
    real_import = py_builtins.__import__

    def no_resource(name, *args, **kwargs):
        if name == "resource":
            raise ImportError("no resource on this platform")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(py_builtins, "__import__", no_resource)
    assert host_peak_gib() is None


def test_bf16_model_runs_its_adapters_in_bf16_with_fp32_master_weights():
    """A bf16 model: the LoRA matmuls compute in bf16 under autocast (not peft's fp32 upcast), the adapter
    weights, their gradients and AdamW's state stay fp32, and the log-probs match the fp32-adapter forward
    to bf16 precision (#29: bf16 compute, fp32 master weights)."""
    cfg = load_config("laptop", None, SMALL + ["model.dtype=bfloat16"])
    session = prepare(cfg)
    backend = session.backend
    assert backend.compute_dtype == torch.bfloat16
    seen = []
    lora_a = next(m for n, m in backend.model.named_modules() if n.endswith("lora_A.default"))
    lora_a.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    inputs = []
    lora_a.register_forward_pre_hook(lambda mod, args: inputs.append(args[0].dtype))
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    lp, _ = backend.forward(ids, torch.ones_like(ids), 12, 1.0, True)
    assert seen and set(seen) == {torch.bfloat16}
    lp.sum().backward()
    assert all(
        p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
        for p in backend.params
    )
    # the adapters' inputs stay bf16 (no fp32 copy by peft that autocast casts back): the same numbers
    grads = [p.grad.clone() for p in backend.params]
    backend.zero_grad()
    keep_input_dtype(backend.model, False)  # peft's input cast back on, autocast as before
    with_casts, _ = backend.forward(ids, torch.ones_like(ids), 12, 1.0, True)
    with_casts.sum().backward()
    assert inputs == [torch.bfloat16, torch.float32]
    assert torch.equal(lp, with_casts)
    assert all(torch.allclose(g, p.grad, rtol=1e-6, atol=1e-8) for g, p in zip(grads, backend.params))
    backend.compute_dtype = None  # peft's own way: the adapters in fp32
    seen.clear()
    with torch.no_grad():
        fp32_adapters, _ = backend.forward(ids, torch.ones_like(ids), 12, 1.0)
    assert set(seen) == {torch.float32}
    assert (lp.detach() - fp32_adapters).abs().max() < 0.1  # bf16 rounding of the adapters' small products
    backend.compute_dtype = torch.bfloat16
    keep_input_dtype(backend.model)
    seen.clear()  # the HF rollout engine samples under the same autocast: its log-probs are the trainer's
    session.engine.generate(session.train_set.token_ids[:1], SamplingSettings(n=2, max_new_tokens=4), 1)
    assert seen and set(seen) == {torch.bfloat16}


def _three_steps(
    offload: bool, sync: str = "adapter"
) -> tuple[list[dict[str, float]], list[bool], list[str]]:
    """Three steps of the laptop run, the trainer parked between its updates or not; -> the metrics, per
    park whether every tensor the trainer holds moved to other storage, and the order of parks and syncs."""
    from dataclasses import replace

    from lite_verl.data.loader import PromptSampler
    from lite_verl.run.cost import Ledger

    cfg = load_config("laptop", None, SMALL)
    # a CPU run has no card to hand over (validation refuses the key): the swap runs all the same
    cfg = replace(
        cfg, train=replace(cfg.train, offload_during_rollout=offload), sync=replace(cfg.sync, mode=sync)
    )
    session = prepare(cfg)
    backend, moved, order = session.backend, [], []
    park, sync_weights = backend.park, session.engine.sync_weights
    session.engine.sync_weights = lambda step: order.append("sync") or sync_weights(step)

    def watched_park() -> None:
        ptrs = [p.data_ptr() for p in backend.model.parameters()]
        ptrs += [v.data_ptr() for s in backend.optimizer.state.values() for v in s.values() if v.dim()]
        park()
        order.append("park")
        after = [p.data_ptr() for p in backend.model.parameters()]
        after += [v.data_ptr() for s in backend.optimizer.state.values() for v in s.values() if v.dim()]
        moved.append(all(a != b for a, b in zip(ptrs, after)) and len(after) == len(ptrs))

    backend.park = watched_park
    sampler = PromptSampler(len(session.train_set), cfg.trainer.batch_size, cfg.trainer.seed, True)
    ledger = Ledger.from_config(cfg)
    return [train_step(session, sampler, step, ledger) for step in (1, 2, 3)], moved, order


def test_a_trainer_parked_between_updates_computes_the_same_steps():
    """train.offload_during_rollout moves every weight and AdamW state out and back around each rollout:
    the same rollouts, losses and gradients as a trainer that stays (fresh storage each time, so a stale
    view of the old one, such as a cached adapter, would show). An adapter sync follows the park (the
    adapter goes through host memory: the card never holds vLLM's weights beside the trainer's); a merged
    sync precedes it (it merges on the card)."""
    parked, moved, order = _three_steps(True)
    resident, none, _ = _three_steps(False)
    assert moved == [True, True, True] and none == []
    assert order == ["park", "sync"] * 3
    assert _three_steps(True, "merged")[2] == ["sync", "park"] * 3
    for a, b in zip(parked, resident):
        for key in ("reward/mean", "actor/loss", "actor/grad_norm", "response_length/mean"):
            assert a[key] == b[key], key
    assert parked[2]["actor/grad_norm"] > 0


def test_all_linear_adapts_every_decoder_linear_and_not_the_head():
    """train.target_modules=[all-linear] (TRL's and verl's peft shorthand) reaches peft as such."""
    from lite_verl.errors import ConfigError

    session = prepare(load_config("laptop", None, SMALL + ["train.target_modules=all-linear"]))
    names = [n for n, _ in session.backend.model.named_parameters() if "lora_A" in n]
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n in names}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= adapted
    assert "lm_head" not in adapted
    with pytest.raises(ConfigError, match="all-linear already means every linear layer"):
        load_config("laptop", None, ["train.target_modules=[all-linear,q_proj]"])


def test_truncated_completions_count_in_advantages_but_not_in_the_loss():
    """algorithm.mask_truncated_completions (TRL's): GRPO's group statistics still hold the cut responses,
    the loss does not. On-policy the ratio is 1, so the token-mean policy loss is minus the mean advantage
    over the kept tokens: computed here from the advantages and masks alone."""
    from lite_verl.batch import UpdateBatch
    from lite_verl.loop import _truncated
    from lite_verl.update import run_update

    sets = SMALL + [
        "rollout.max_new_tokens=6",
        "algorithm.mask_truncated_completions=true",
        "algorithm.use_kl_loss=false",
    ]
    session = prepare(load_config("laptop", None, sets))
    cfg, n = session.cfg, session.cfg.rollout.n
    from dataclasses import replace

    rollout = session.engine.generate(
        session.train_set.token_ids[:4], SamplingSettings.of(cfg.rollout), seed=3
    )
    ended = torch.arange(len(rollout.response_ids)) % 3 == 0  # these end in an EOS at their third token
    ids, mask = rollout.response_ids.clone(), rollout.response_mask.clone()
    ids[ended, 2] = min(session.engine.eos_ids)
    mask[ended, 3:] = 0
    rollout = replace(rollout, response_ids=ids, response_mask=mask)
    cut = _truncated(session, rollout)
    lengths = rollout.response_lengths()
    assert cut.any() and (~cut).any(), "the tiny model should leave some responses cut and some ended"
    assert bool((lengths[cut] == 6).all())
    scores = torch.arange(len(cut), dtype=torch.float32) % 3
    group_ids = torch.arange(4).repeat_interleave(n)
    firsts: list[torch.Tensor] = []
    batch = UpdateBatch(rollout, scores, group_ids, None, 1, cut)
    metrics = run_update(
        session.backend, batch, cfg, session.kl_ctrl, session.micro, on_advantages=firsts.append
    )
    grouped = scores.view(4, n)  # GRPO over every response of a group, cut ones included
    expected_adv = (
        (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
    ).flatten()
    assert torch.allclose(firsts[0], expected_adv, atol=1e-5)
    keep = rollout.response_mask.float() * (~cut).float()[:, None]
    expected_loss = -float((expected_adv[:, None] * keep).sum() / keep.sum())
    assert metrics["actor/pg_loss"] == pytest.approx(expected_loss, rel=1e-4, abs=1e-6)
    assert metrics["actor/masked_truncated_frac"] == pytest.approx(float(cut.float().mean()))


@pytest.mark.parametrize("knob", ["rollout.top_k=1", "rollout.min_p=0.999"])
def test_top_k_and_min_p_reach_the_sampler(knob):
    """top_k=1 (or a min_p that keeps only the likeliest token) samples the greedy response at temperature 1."""
    session = prepare(load_config("laptop", None, SMALL + [knob]))
    prompts = session.train_set.token_ids[:3]
    sampled = session.engine.generate(prompts, SamplingSettings.of(session.cfg.rollout, n=2), seed=4)
    greedy = session.engine.generate(prompts, SamplingSettings.of(session.cfg.rollout, greedy=True), seed=4)
    assert torch.equal(sampled.response_ids, greedy.response_ids.repeat_interleave(2, 0))
    unset = prepare(load_config("laptop", None, SMALL))
    plain = unset.engine.generate(prompts, SamplingSettings.of(unset.cfg.rollout, n=2), seed=4)
    assert not torch.equal(plain.response_ids, sampled.response_ids)  # without the knob it samples


def test_apply_liger_passes_its_kernels_by_name_and_says_when_an_architecture_is_not_covered(
    monkeypatch, capsys
):
    """train/kernels.apply_liger against Liger's own table of per-architecture functions (a stand-in module
    here: Liger's kernels import Triton, which a CPU machine lacks; the GPU test below runs the real ones):
    each function gets the kernels it knows, the loss kernels off, and the model instance; an architecture
    missing from the table is left alone with one line."""
    import sys
    import types

    from lite_verl.model.tiny import resolve_tiny
    from lite_verl.train.kernels import apply_liger

    seen = {}

    def apply_qwen2(rope=True, fused_linear_cross_entropy=True, rms_norm=True, swiglu=True, model=None):
        seen.update(rope=rope, flce=fused_linear_cross_entropy, rms_norm=rms_norm, swiglu=swiglu, model=model)

    table = types.ModuleType("liger_kernel.transformers.monkey_patch")
    table.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen2": apply_qwen2}
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", table)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_tiny("tiny:qwen2"))
    assert apply_liger(model) is True
    assert seen == {"rope": True, "flce": False, "rms_norm": True, "swiglu": True, "model": model}
    model.config.model_type = "some_new_arch"
    assert apply_liger(model) is False
    assert "Liger has no kernels for model type 'some_new_arch'" in capsys.readouterr().err


@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
    reason="needs a CUDA GPU and liger-kernel (pip install 'lite-verl[liger]'): Triton kernels",
)
def test_liger_kernels_give_the_trainers_log_probs_and_gradients_on_a_gpu(monkeypatch):
    """train.use_liger on a bf16 model: the same log-probs and adapter gradients as without, to bf16 rounding."""
    from dataclasses import replace

    from transformers.models.qwen2 import modeling_qwen2

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):  # Liger patches them process-wide:
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))  # restored after this test

    ids = torch.randint(3, 200, (4, 32), generator=torch.Generator().manual_seed(0))
    out = {}
    for liger in (False, True):
        cfg = load_config("4090x1", None, ["rollout.engine=hf", "rollout.quantization=none", "model.path=tiny:qwen2",
                                           "cost.gpu_models=[GPU]", "cost.price_per_hour={GPU: 0.0}"])  # fmt: skip
        cfg = replace(cfg, train=replace(cfg.train, use_liger=liger, grow_micro_batch=False))
        from lite_verl.model.load import resolve_model_path
        from lite_verl.train.lora import build_lora_backend

        backend = build_lora_backend(cfg, resolve_model_path(cfg.model), torch.device("cuda:0"))
        lp, _ = backend.forward(ids, torch.ones_like(ids), 16, 1.0)
        lp.sum().backward()
        out[liger] = (lp.detach().float().cpu(), [p.grad.float().cpu() for p in backend.params])
    (lp0, g0), (lp1, g1) = out[False], out[True]
    assert (lp0 - lp1).abs().max() < 0.05
    assert all(torch.allclose(a, b, rtol=0.05, atol=1e-4) for a, b in zip(g0, g1))
