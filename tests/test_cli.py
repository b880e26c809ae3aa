"""The real CLI in a subprocess: the laptop run learns, resume continues exactly, bad input exits 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED_GSM8K

from lite_verl.run.rundir import read_metrics

FAST = [
    "--set",
    "trainer.batch_size=4",
    "--set",
    "rollout.n=4",
    "--set",
    "data.val_size=8",
    "--set",
    "data.task_size=64",
]


def cli(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "lite_verl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_help_explains_itself(tmp_path):
    out = cli("--help", cwd=tmp_path)
    assert out.returncode == 0 and "train" in out.stdout and "validate" in out.stdout
    out = cli("train", "--help", cwd=tmp_path)
    assert "--preset" in out.stdout and "--resume" in out.stdout and "--set" in out.stdout


def test_validate_and_presets(tmp_path):
    out = cli("validate", "--preset", "laptop", "--set", "trainer.total_steps=3", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "total_steps: 3" in out.stdout and "config OK" in out.stderr
    out = cli("presets", cwd=tmp_path)
    assert "4090x4" in out.stdout and "laptop" in out.stdout
    out = cli("validate", "--keys", cwd=tmp_path)
    assert "trainer.total_steps" in out.stdout
    lines = out.stdout.splitlines()
    assert (
        lines[lines.index(next(x for x in lines if x.startswith("trainer.total_steps "))) + 1].strip()
        == "= 100"
    )
    out = cli("validate", "--keys", "--recipe", "gsm8k", "--set", "train.lr=2e-5", cwd=tmp_path)
    assert "= [openai/gsm8k]" in out.stdout and "= 2.0e-05" in out.stdout  # the values of that config
    out = cli("validate", "--set", "data.val_files=[tset.jsonl]", cwd=tmp_path)  # a dry run checks the paths
    assert out.returncode == 2 and "data.val_files: 'tset.jsonl' does not exist" in out.stderr


@pytest.mark.slow
def test_laptop_preset_learns(tmp_path):
    """Acceptance 1: the default laptop run; last 10% of steps beat the first 10% by >= 0.3."""
    out = cli("train", "--preset", "laptop", "--run-dir", "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reward_last_10pct"] - summary["reward_first_10pct"] >= 0.3, summary
    assert "The bill" in out.stdout and "train reward" in out.stdout
    run = tmp_path / "run"
    for name in ["config.yaml", "env.json", "metrics.jsonl", "summary.json"]:
        assert (run / name).is_file(), name
    # the preset's gradient_checkpointing=auto, decided by the plan before loading: the tiny model fits without
    assert "gradient_checkpointing: false" in (run / "config.yaml").read_text()
    assert list((run / "tb").iterdir()), "no TensorBoard events"
    ckpt = Path(summary["checkpoint"])
    assert (ckpt / "adapter" / "adapter_model.safetensors").is_file() and (ckpt / "optimizer.pt").is_file()
    row = metrics(run)[1]
    for key in [
        "reward/mean",
        "reward/std",
        "response_length/mean",
        "actor/loss",
        "actor/kl_loss",
        "actor/entropy",
        "actor/grad_norm",
        "perf/tokens_per_s",
        "timing/rollout_s",
        "timing/reward_s",
        "timing/update_s",
        "timing/experience_s",
        "timing/optimizer_s",
    ]:
        assert key in row, key
    # the update's parts are inside it
    assert 0 < row["timing/experience_s"] + row["timing/optimizer_s"] < row["timing/update_s"]
    # the resolved config re-runs as it is
    again = cli(
        "train",
        "--config",
        "run/config.yaml",
        "--run-dir",
        "again",
        "--set",
        "trainer.total_steps=2",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.slow
def test_resume_continues_step_count_and_data_order(tmp_path):
    """Acceptance 4: 2 steps + resume to 4 == 4 steps uninterrupted (same data order, same numbers)."""
    full = cli("train", "--run-dir", "full", *FAST, "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    # 2 steps given as epochs (TRL's num_train_epochs): 0.125 x 64 prompts / 4 a step; the run keeps the steps
    part = cli("train", "--run-dir", "part", *FAST, "--set", "trainer.total_epochs=0.125", cwd=tmp_path)
    assert part.returncode == 0, part.stderr[-2000:]
    assert "trainer.total_epochs=0.125 over 64 prompts at 4 a step: trainer.total_steps=2" in part.stderr
    kept = (tmp_path / "part" / "config.yaml").read_text()
    assert "total_steps: 2\n" in kept and "total_epochs: 0.0\n" in kept
    resumed = cli("train", "--resume", "part", "--set", "trainer.total_steps=4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = [m for m in metrics(tmp_path / "full") if "reward/mean" in m]
    b = [m for m in metrics(tmp_path / "part") if "reward/mean" in m]
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x["reward/mean"] == y["reward/mean"]
        assert x["actor/loss"] == pytest.approx(y["actor/loss"], rel=1e-5, abs=1e-7)
    state = json.loads((tmp_path / "part" / "checkpoints" / "step_00000004" / "state.json").read_text())
    assert state["step"] == 4 and state["consumed"] == 16


def test_real_model_directory_and_data_files(tmp_path):
    """model.path = a directory written by make-tiny-model (real from_pretrained); data from jsonl."""
    out = cli("make-tiny-model", "model", "--arch", "llama", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    from lite_verl.data.schema import write_jsonl
    from lite_verl.data.tasks import arithmetic_rows

    write_jsonl(arithmetic_rows(16, 0), tmp_path / "train.jsonl")
    out = cli(
        "train",
        "--run-dir",
        "run",
        *FAST,
        "--set",
        "model.path=model",
        "--set",
        "data.train_files=[train.jsonl]",
        "--set",
        "trainer.total_steps=2",
        "--set",
        "data.val_files=[train.jsonl]",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert [m["step"] for m in metrics(tmp_path / "run") if "reward/mean" in m] == [1, 2]


@pytest.mark.skipif(
    not (SHARED_GSM8K / "test.jsonl").is_file(), reason="../shared/data/gsm8k is not beside this checkout"
)
def test_prepare_gsm8k_cli(tmp_path):
    out = cli("prepare-gsm8k", str(SHARED_GSM8K / "test.jsonl"), "gsm8k.jsonl", cwd=tmp_path)
    assert out.returncode == 0 and "1319" in out.stdout


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "bad.jsonl").write_text('{"prompt": [{"role": "user", "content": "hi"}], "data_source": "x"}\n')
    (tmp / "notjson.jsonl").write_text("{oops\n")
    (tmp / "cfg.yaml").write_text("trainer:\n  total_steps: [1\n")
    (tmp / "rw.py").write_text("def f(*a):\n    raise RuntimeError('bad reward')\n")
    return {
        "unknown key": (["--set", "trainer.totl_steps=3"], "did you mean 'trainer.total_steps'"),
        "wrong type": (["--set", "trainer.total_steps=many"], "trainer.total_steps must be an int"),
        "missing model": (
            ["--set", "model.path=/no/such/model"],
            "model.path='/no/such/model' does not exist",
        ),
        "missing dataset": (["--set", "data.train_files=[nope.jsonl]"], "'nope.jsonl' does not exist"),
        "malformed row": (
            ["--set", "data.train_files=[bad.jsonl]"],
            "bad.jsonl:1: missing field 'reward_model.ground_truth'",
        ),
        "not json": (["--set", "data.train_files=[notjson.jsonl]"], "notjson.jsonl:1: not valid JSON"),
        "bad yaml": (["--config", "cfg.yaml"], "is not valid YAML"),
        "unknown preset": (["--preset", "4090x3"], "unknown preset '4090x3'"),
        "gpu not present": (
            ["--preset", "4090x1", "--set", "rollout.engine=hf", "--set", "rollout.quantization=none"],
            "this machine has no CUDA GPU",
        ),
        "reward raises": (
            ["--set", "reward.function=rw.py:f", "--set", "trainer.total_steps=2"],
            "raised RuntimeError: bad reward",
        ),
    }


def test_a_reward_that_fails_after_some_steps_leaves_a_run_to_resume(tmp_path):
    """No periodic checkpoint (trainer.save_every=0: only at the end), a reward that raises in step 3: the
    two finished steps' metrics stay, step 2 is saved before the run stops, the exit code is not 0 and the
    message says how to resume; with the reward fixed, --resume finishes the run from step 3."""
    (tmp_path / "late.py").write_text(
        "from pathlib import Path\n"
        "def f(*a, **k):\n"
        "    n = Path(__file__).with_suffix('.calls')\n"
        "    calls = int(n.read_text()) + 1 if n.exists() else 1\n"
        "    n.write_text(str(calls))\n"
        "    if calls > 32:  # 4 prompts x 4 samples per step, one call each: step 3\n"
        "        raise RuntimeError('reward service went away')\n"
        "    return 1.0\n"
    )
    sets = [
        "reward.function=late.py:f",
        "trainer.total_steps=5",
        "rollout.n=4",
        "data.val_size=0",
        "trainer.save_every=0",
    ]
    out = cli("train", "--run-dir", "run", *FAST, *[a for s in sets for a in ("--set", s)], cwd=tmp_path)
    assert out.returncode != 0 and "reward service went away" in out.stderr, out.stderr[-2000:]
    run = tmp_path / "run"
    steps = [m["step"] for m in read_metrics(run) if "reward/mean" in m]
    assert steps == [1, 2] and not (run / "FAILED").exists()
    assert (run / "checkpoints" / "step_00000002" / "state.json").is_file()
    assert f"resume with: lite-verl train --resume {run}" in out.stderr.replace(
        str(tmp_path) + "/", str(tmp_path) + "/"
    )
    (tmp_path / "late.py").write_text("def f(*a, **k):\n    return 1.0\n")
    resumed = cli("train", "--resume", "run", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [m["step"] for m in read_metrics(run) if "reward/mean" in m] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("case", list(_bad_inputs(Path("/tmp")).keys()))
def test_bad_input_one_line_exit_2_no_run_dir(tmp_path, case):
    """Acceptance 5: one-line error naming the fix, exit code 2, no traceback, no run directory."""
    from conftest import has_cuda

    if case == "gpu not present" and has_cuda():
        pytest.skip("this machine has a GPU")
    args, message = _bad_inputs(tmp_path)[case]
    out = cli("train", "--run-dir", "run", *FAST, *args, cwd=tmp_path)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("lite-verl: error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "runs").exists()


def test_readme_test_command_is_what_ci_runs():
    repo = Path(__file__).resolve().parent.parent
    ci = (repo / ".ci" / "run").read_text()
    command = ci.split("TEST_CMD='", 1)[1].split("'", 1)[0]
    readme = (repo / "README.md").read_text()
    assert command in readme
    assert "pip install torch==2.13.0 && pip install -e . && lite-verl train --preset laptop" in readme


def test_imports_stay_light(tmp_path):
    """`import lite_verl` (and the loop) must not import vLLM, DeepSpeed, bitsandbytes or AWQ."""
    code = (
        "import sys, lite_verl, lite_verl.loop, lite_verl.cli, lite_verl.algos\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'deepspeed', 'bitsandbytes', 'awq')]\n"
        "assert not heavy, heavy\n"
        "import subprocess\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", "import sys, lite_verl; assert 'torch' not in sys.modules"],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


def test_export_merges_the_trained_adapter(tmp_path):
    """export --format hf: the merged model's log-probs equal the trainer's (base + adapter) ones."""
    run = cli("train", "--run-dir", "run", *FAST, "--set", "trainer.total_steps=3", "--set", "train.lr=0.02",
              "--set", "trainer.save_every=1", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    out = cli("export", "run", "merged", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lite_verl.model.load import resolve_model_path
    from lite_verl.run.rundir import load_run_config

    base_path = resolve_model_path(load_run_config(tmp_path / "run", []).model)
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), ckpt / "adapter")(
            ids
        ).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_path)(ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(base, want, atol=1e-3)  # training moved the policy: the merge matters
    # the adapter alone (Unsloth's save_method="lora"), loadable by peft; an earlier step; another dtype
    out = cli("export", "run", "adapter", "--format", "adapter", "--step", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "adapter" / "adapter_config.json").is_file() and (
        tmp_path / "adapter" / "tokenizer.json"
    ).is_file()
    step2 = tmp_path / "run" / "checkpoints" / "step_00000002" / "adapter"
    with torch.no_grad():
        mine = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_path), tmp_path / "adapter"
        )(ids).logits
        theirs = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), step2)(ids).logits
    assert torch.equal(mine, theirs)
    out = cli("export", "run", "bf16", "--dtype", "bfloat16", cwd=tmp_path)
    assert (
        out.returncode == 0
        and json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    )
    out = cli("export", "run", "nope", "--step", "9", cwd=tmp_path)
    assert out.returncode == 2 and "--step 9: " in out.stderr and "it has: " in out.stderr, out.stderr[-500:]


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None,
    reason="bitsandbytes is not installed: pip install 'lite-verl[qlora]'",
)
def test_a_pre_quantized_4bit_checkpoint_trains_as_qlora_and_exports_dequantized(tmp_path):
    """Unsloth's *-bnb-4bit checkpoints: LoRA on them is refused in one line before anything loads (it
    crashed at the first update); QLoRA trains; export dequantizes the base, merges, and saves a plain model
    whose logits are the trained policy's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from lite_verl.model.tiny import resolve_tiny

    plain = resolve_tiny("tiny:qwen2", init_std=0.02)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    AutoModelForCausalLM.from_pretrained(plain, quantization_config=quant).save_pretrained(tmp_path / "bnb4")
    AutoTokenizer.from_pretrained(plain).save_pretrained(tmp_path / "bnb4")
    model = ["--set", f"model.path={tmp_path / 'bnb4'}", *FAST, "--set", "trainer.total_steps=2"]
    refused = cli("train", "--run-dir", "lora", *model, cwd=tmp_path)
    assert refused.returncode == 2 and "pre-quantized (bitsandbytes)" in refused.stderr, refused.stderr[
        -1500:
    ]
    assert "train.backend=qlora" in refused.stderr and not (tmp_path / "lora").exists()
    run = cli(
        "train",
        "--run-dir",
        "run",
        *model,
        "--set",
        "train.backend=qlora",
        "--set",
        "train.lr=0.02",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = cli("export", "run", "merged", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "quantization_config" not in json.loads((tmp_path / "merged" / "config.json").read_text())
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    ids = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "bnb4").dequantize()
        want = PeftModel.from_pretrained(base, ckpt / "adapter")(ids).logits
        got = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")(ids).logits
    assert torch.allclose(got, want, atol=1e-4)


@pytest.mark.skipif(
    importlib.util.find_spec("awq") is None, reason="autoawq is not installed: pip install 'lite-verl[awq]'"
)
def test_quantize_cli_writes_a_vllm_awq_model_with_its_recipe(tmp_path):
    from lite_verl.model.tiny import resolve_tiny

    out = cli(
        "quantize",
        str(resolve_tiny("tiny:qwen2")),
        "q",
        "--group-size",
        "64",
        "--max-prompts",
        "64",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert (
        config["quantization_config"]["quant_method"] == "awq"
        and config["quantization_config"]["group_size"] == 64
    )
    assert (tmp_path / "q" / "lite_verl_awq_recipe.st").is_file()
    bad = cli("quantize", str(tmp_path / "nope"), "q2", cwd=tmp_path)
    assert bad.returncode == 2 and "no config.json" in bad.stderr and not (tmp_path / "q2").exists()


def test_report_prints_the_bill_and_writes_png_plots(tmp_path):
    run = cli("train", "--run-dir", "run", *FAST, "--set", "trainer.total_steps=3", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    out = cli("report", "run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (
        "The bill" in out.stdout and "step time by phase: rollout" in out.stdout and "what-if" in out.stdout
    )
    if importlib.util.find_spec("matplotlib") is not None:
        for name in ("reward.png", "tokens_per_s.png", "timeline.png", "cost.png"):
            assert (tmp_path / "run" / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "run" / "report.txt").is_file()
    bad = cli("report", "nowhere", cwd=tmp_path)
    assert bad.returncode == 2 and "nowhere" in bad.stderr and "Traceback" not in bad.stderr
    # an interrupted run (no summary.json): what its metrics say, marked not finished, plots too
    (tmp_path / "run" / "summary.json").unlink()
    partial = cli("report", "run", cwd=tmp_path)
    assert partial.returncode == 0, partial.stderr[-2000:]
    assert "run NOT finished (3 steps done" in partial.stdout and "step time by phase" in partial.stdout


def test_what_if_prices_the_other_placement():
    from lite_verl.config import load_config
    from lite_verl.tools.report import what_if

    rows = [
        {"timing/rollout_s": 2.0, "timing/reward_s": 0.5, "timing/update_s": 3.0, "timing/sync_s": 0.1}
    ] * 10
    colocated = what_if(load_config("4090x1"), rows)
    assert "split" in colocated and "~36 s of steps on 2 GPU(s)" in colocated  # max(2, 3.5) + 0.1 per step
    split = what_if(load_config("3090x2"), rows)
    assert "colocated" in split and "~56 s of steps on 1 GPU(s)" in split  # 2 + 0.5 + 3 + 0.1 per step
