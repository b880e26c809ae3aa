#!/bin/bash
# The recipes' proof on the GPU machine (bench/recipes.py), longer than one 10-minute call: it runs in the
# background from its own copy of the tree (/tmp/lv: later calls re-copy the checkout) and each call waits
# on it for up to WAIT_S seconds. Stage with `bash bench/gpu_stage.sh` here (vLLM + gguf wheels in .stage/cK,
# the GGUFs and GSM8K in .stage/mK; its header lists the calls), then on the machine:
#   LITE_VERL_COMMIT=<sha> bash bench/gpu_recipes.sh start   # assemble, import the GGUFs, launch, wait
#   bash bench/gpu_recipes.sh wait                          # wait more; results when done
# Without vLLM's wheels (scarce device time): carry only gguf/datasets (STAGE_SET=small bash bench/gpu_stage.sh) and
# run with EXTRA_SETS=rollout.engine=hf (HF generate on the GPU; same maths).
# SmolLM2-135M-Instruct's chain (gsm8k, largest: the ones not yet measured; 2 jobs at a time) runs; Gemma-3-270M base's
# (GEMMA_JOBS=gemma:arithmetic-base, the recipe for base models: a Question/Answer frame with two worked examples, no chat
# template, a stop at the blank line) only when asked. JOB_SETS adds per-job settings, e.g. to try another frame over a recipe
# (the 2026-12-07 Gemma runs did so over `arithmetic`; bench/RESULTS.md recipes).
# Each model is imported first by `lite-verl import-gguf`. Hardware knobs only
# (--set): bf16 rollout (the AWQ set is not carried), eager vLLM (fast starts), 0.1 of the GPU per engine.
# $OUT gets recipes.log, results_new.jsonl (the rows it appended) and extra.tgz (logs, curves, eval JSON).
set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/lv:${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export LITE_VERL_CACHE=/tmp/lite-verl-cache HF_HUB_OFFLINE=1 LITE_VERL_DEBUG=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WAIT_S=${WAIT_S:-450}  # the call limit is 600 s: room for the doctor, the copy and the results
case "${1:-}" in
  start)
    shift
    mkdir -p /tmp/models
    cat $(ls /tmp/mparts/models.tar.part.* | sort) > /tmp/models.tar
    (cd /tmp && sha256sum -c /tmp/mparts/models.tar.sha256 >/dev/null) || { echo "model chunks: checksum mismatch" >&2; exit 1; }
    tar xf /tmp/models.tar -C /tmp/models && rm /tmp/models.tar && ls -la /tmp/models
    [ -n "$(ls /tmp/models/gsm8k 2>/dev/null)" ] && rm -rf /tmp/gsm8k && mv /tmp/models/gsm8k /tmp/gsm8k  # GSM8K may travel in the model tar
    # transformers 5.19 for import-gguf only (bench/gpu_stage.sh says why)
    ls /tmp/models/transformers-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index --target /tmp/tf-import /tmp/models/transformers-*.whl
    PYTHONPATH=/tmp/tf-import:$PYTHONPATH python3 -c 'import transformers' 2>/dev/null || { echo "transformers 5.19 does not import here: the machine's imports"; rm -rf /tmp/tf-import; }
    rm -rf /tmp/lv && mkdir /tmp/lv && tar -C "$PWD" --exclude=./.stage -cf - . | tar -C /tmp/lv -xf - && cd /tmp/lv
    cp bench/results.jsonl /tmp/results.before
    echo "${LITE_VERL_COMMIT:-unknown}" > /tmp/lv.commit
    export LITE_VERL_COMMIT=$(cat /tmp/lv.commit)
    # SMOLLM2_JOBS / GEMMA_JOBS pick the jobs (empty: that chain is skipped), STEPS overrides the recipes' steps,
    # PARALLEL the jobs of one chain at once (default 2), JOB_SETS per-job settings 'JOB:KEY=VALUE;JOB:KEY=VALUE'
    # (e.g. a base model's prompt template, one job's steps)
    if [ -n "${SMOLLM2_JOBS-x}" ]; then
      (setsid nohup bash bench/gpu_recipes.sh chain smollm2 SmolLM2-135M-Instruct.Q4_1.gguf \
         "${SMOLLM2_JOBS-smollm2:gsm8k,smollm2:largest}" > /tmp/recipes_smollm2.log 2>&1; echo $? > /tmp/recipes_smollm2.rc) &
    else echo skipped > /tmp/recipes_smollm2.rc; fi
    if [ -n "${GEMMA_JOBS-}" ]; then
      (setsid nohup bash bench/gpu_recipes.sh chain gemma gemma-3-270m-q4_k_m.gguf \
         "${GEMMA_JOBS-}" > /tmp/recipes_gemma.log 2>&1; echo $? > /tmp/recipes_gemma.rc) &
    else echo skipped > /tmp/recipes_gemma.rc; fi
    # #24's acceptance (bench/gpu_signals.sh) on the imported SmolLM2, beside the proofs (SIGNALS=0: not run,
    # less load on a short call); and lite-verl doctor
    [ "${SIGNALS:-1}" = 1 ] || echo 0 > /tmp/signals.rc
    [ "${SIGNALS:-1}" = 1 ] && (setsid nohup bash -c 'until [ -f /tmp/models/smollm2/config.json ]; do sleep 5; done;
       bash bench/gpu_signals.sh /tmp/models/smollm2' > /tmp/signals.log 2>&1; echo $? > /tmp/signals.rc) &
    # #24 item 9: ANOMALY=N trains the arithmetic recipe N steps under torch's anomaly detection (the first
    # backward op that makes a NaN raises, naming itself and its forward), beside the proofs
    [ "${ANOMALY:-0}" -gt 0 ] && (setsid nohup bash -c 'until [ -f /tmp/models/smollm2/config.json ]; do sleep 5; done; sleep 20;
       LITE_VERL_DETECT_ANOMALY=1 python3 -m lite_verl train --preset 4090x1 --recipe arithmetic --set model.path=/tmp/models/smollm2 \
         --set rollout.quantization=none --set rollout.enforce_eager=true --set rollout.gpu_memory_utilization=0.08 \
         --set trainer.total_steps='"$ANOMALY"' --set data.val_size=0 --set trainer.progress=false --run-dir /tmp/anomaly' \
       > /tmp/anomaly.log 2>&1; echo $? > /tmp/anomaly.rc) &
    [ "${DOCTOR:-1}" = 1 ] && { python3 -m lite_verl doctor > "$OUT/doctor.txt" 2>&1; echo "doctor exit $?" >> "$OUT/doctor.txt"; }
    ;;
  wait) ;;
  chain)  # NAME GGUF JOBS: import the model, then its jobs (run by start, in the background)
    PYTHONPATH=/tmp/tf-import:$PYTHONPATH python3 -m lite_verl import-gguf "/tmp/models/$3" "/tmp/models/$2" || exit 1
    JS=(); IFS=';' read -ra parts <<< "${JOB_SETS:-}"; for p in "${parts[@]}"; do [ -n "$p" ] && JS+=(--job-set "$p"); done
    # EXTRA_SETS: more hardware knobs for every command, space-separated (e.g. rollout.engine=hf: HF generate on
    # the GPU, where vLLM's wheels were not carried)
    for x in ${EXTRA_SETS:-}; do JS+=(--set "$x"); done
    exec python3 -m bench.recipes "${JS[@]}" --model "$2=/tmp/models/$2" --jobs "$4" --gsm8k /tmp/gsm8k --steps "${STEPS:-0}" --parallel "${PARALLEL:-2}" \
      --set rollout.quantization=none --set rollout.enforce_eager=true --set rollout.gpu_memory_utilization=0.1 ;;
  *) sed -n '2,9p' "$0"; exit 2 ;;
esac
start=$SECONDS
done_all() { [ -f /tmp/recipes_smollm2.rc ] && [ -f /tmp/recipes_gemma.rc ]; }
while ! done_all && [ $((SECONDS - start)) -lt "$WAIT_S" ]; do
  sleep 15
  echo "[$((SECONDS - start)) s] $(ls /tmp/lite-verl-recipes/*/run/metrics.jsonl 2>/dev/null | while read f; do echo -n "$(basename $(dirname $(dirname $f))):$(wc -l < $f) "; done)"
done
cp /tmp/recipes_*.log /tmp/signals.log /tmp/sig/*.log "$OUT/" 2>/dev/null; grep -v "INFO\|WARNING\|^(" /tmp/signals.log | tail -25
for f in /tmp/lite-verl-recipes/*/run/metrics.jsonl /tmp/sig/*/metrics.jsonl; do  # #24 item 9: none with cuDNN attention off
  [ -f "$f" ] && echo "steps skipped (non-finite): $(grep -c '"actor/skipped_step": 1' "$f") of $(grep -c '"actor/skipped_step"' "$f") in $f"
done
[ -f /tmp/anomaly.log ] && { grep -v "^INFO\|^(" /tmp/anomaly.log > "$OUT/anomaly.log"; echo "== anomaly: $(cat /tmp/anomaly.rc 2>/dev/null || echo running)";
  grep -E "nan|NaN|non-finite|skipped|Function '|Error" /tmp/anomaly.log | head -8; }
X=/tmp/recipes_extra; rm -rf $X; mkdir -p $X
for d in /tmp/lite-verl-recipes/*/; do
  n=$(basename $d); mkdir -p $X/$n
  cp $d/log.txt $d/*.json $d/run/metrics.jsonl $d/run/summary.json $d/run/config.yaml $X/$n/ 2>/dev/null
done
cp /tmp/lv/bench/runs/recipes_curve_*.jsonl $X/ 2>/dev/null
tar czf "$OUT/extra.tgz" -C $X . 2>/dev/null
diff /tmp/results.before /tmp/lv/bench/results.jsonl | sed -n 's/^> //p' > "$OUT/results_new.jsonl"
for m in smollm2 gemma; do
  echo "== $m: $(cat /tmp/recipes_$m.rc 2>/dev/null || echo running)"; grep -E "greedy accuracy|FAILED|Error" /tmp/recipes_$m.log | tail -5
done
done_all || { echo "still running"; tail -2 /tmp/recipes_*.log; }
