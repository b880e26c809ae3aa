#!/bin/bash
# #24's acceptance on the GPU machine: a 4090x1 run stopped the ways users stop it, then resumed.
#   bash bench/gpu_signals.sh MODEL_DIR      (after bench/gpu_recipes.sh has installed vLLM; ~3 min)
# 1. `timeout -s TERM` on the command (systemd, Slurm, docker stop, Kubernetes): SIGTERM to the controller only.
# 2. Ctrl-C in a terminal: SIGINT to the whole process group (controller + vLLM worker).
# Each must exit 128+signum with "a checkpoint was written", leave no process of the run alive, and
# `--resume` must finish the run. 4. Ctrl-C during the final validation ends it at once (exit 130).
# Prints one CHECK line per fact; exits 1 if any fails.
set -uo pipefail
MODEL=$1; W=/tmp/sig; rm -rf $W; mkdir -p $W
export PYTHONPATH=${PYTHONPATH:-} VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# PRESET=laptop MODEL=- tries the script on a CPU with the laptop preset's own tiny model
SETS=(--preset ${PRESET:-4090x1} --recipe arithmetic --set trainer.total_steps=40 --set data.val_size=0
      --set trainer.progress=false)
[ "$MODEL" = - ] && SETS+=(--set model.path=tiny:qwen2) || SETS+=(--set model.path=$MODEL --set rollout.quantization=none --set rollout.enforce_eager=true
                           --set rollout.gpu_memory_utilization=0.08)
bad=0
check() { if eval "$2"; then echo "CHECK ok   $1"; else echo "CHECK FAIL $1"; bad=1; fi; }
started() { grep -q '"step": 2' $1/metrics.jsonl 2>/dev/null; }   # two steps done: past the engine start
tree() { local p; for p in $(pgrep -P $1); do echo $p; tree $p; done; }   # every descendant of a pid
alive() { local p; for p in $1; do kill -0 $p 2>/dev/null && return 0; done; return 1; }

# 1. SIGTERM to the controller only, as `timeout` sends it
( timeout -s TERM 600 python3 -m lite_verl train "${SETS[@]}" --run-dir $W/term > $W/term.log 2>&1; echo $? > $W/term.rc ) &
for i in $(seq 240); do started $W/term && break; sleep 1; done
TOP=$(pgrep -f "timeout -s TERM 600 python3 -m lite_verl train" || true)
[ -n "$TOP" ] || { echo "the SIGTERM run ended before step 2 (exit $(cat $W/term.rc 2>/dev/null)):"; grep -v "INFO\|WARNING" $W/term.log | tail -5; }
PIDS="$TOP ${TOP:+$(tree $TOP)}"; echo "run tree: $PIDS"
[ -n "$TOP" ] && kill -TERM $TOP; for i in $(seq 300); do [ -f $W/term.rc ] && break; sleep 1; done
sleep 3
check "SIGTERM: exit 143 (was $(cat $W/term.rc))" '[ "$(cat $W/term.rc)" = 143 ]'
check "SIGTERM: says a checkpoint was written" 'grep -q "a checkpoint was written" $W/term.log'
check "SIGTERM: no process of the run alive" '! alive "$PIDS"'
tail -3 $W/term.log

# Ctrl-C as a terminal sends it: run NAME (extra train args after READY) in its own process group, wait until
# the shell test READY passes, SIGINT the whole group, wait for the exit code; sets PIDS (the run's tree)
ctrl_c() {
  local name=$1 ready=$2; shift 2
  setsid bash -c "python3 -m lite_verl train ${SETS[*]} $* --run-dir $W/$name > $W/$name.log 2>&1; echo \$? > $W/$name.rc" &
  for i in $(seq 240); do eval "$ready" && break; sleep 1; done
  sleep 2
  local top; top=$(pgrep -f "^python3 -m lite_verl train.*run-dir $W/$name" || true)
  [ -n "$top" ] || { echo "the $name run ended before the signal:"; grep -v "INFO\|WARNING" $W/$name.log | tail -5; }
  PIDS="$top ${top:+$(tree $top)}"; echo "run tree: $PIDS"
  local t0=$SECONDS; [ -n "$top" ] && kill -INT -- -$(ps -o pgid= -p $top | tr -d ' ')
  for i in $(seq 300); do [ -f $W/$name.rc ] && break; sleep 1; done
  STOP_S=$((SECONDS - t0)); sleep 3   # STOP_S: seconds from the signal to the exit
}

# 2. SIGINT to the process group, as Ctrl-C does
ctrl_c int "started $W/int"
check "group SIGINT: exit 130 (was $(cat $W/int.rc))" '[ "$(cat $W/int.rc)" = 130 ]'
check "group SIGINT: says a checkpoint was written" 'grep -q "a checkpoint was written" $W/int.log'
check "group SIGINT: no process of the run alive" '! alive "$PIDS"'
tail -3 $W/int.log

# 3. resume the SIGTERM run to a near end: the first resumed step samples from the trained weights
python3 -m lite_verl train --resume $W/term --set trainer.total_steps=$(( $(grep -c '"step"' $W/term/metrics.jsonl) + 2 )) \
  > $W/resume.log 2>&1; rc=$?
check "resume: exit 0 (was $rc)" '[ $rc = 0 ]'
[ $rc = 0 ] || grep -v "WARNING\|INFO" $W/resume.log | tail -5
python3 - $W/term/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"rollout/logprob_gap_mean"' in l]
print("CHECK info logprob_gap_mean per step:", [(r["step"], round(r["rollout/logprob_gap_mean"], 5)) for r in rows])
PY

# 4. Ctrl-C during the final validation (2000 greedy prompts): cut short at once, the run is complete
ctrl_c val "[ -f $W/val/checkpoints/step_00000001/state.json ]" \
  --set trainer.total_steps=1 --set data.val_size=2000 --set trainer.val_before_train=false
check "final validation SIGINT: exit 130 (was $(cat $W/val.rc 2>/dev/null))" '[ "$(cat $W/val.rc 2>/dev/null)" = 130 ]'
check "final validation SIGINT: ended within 60 s (took $STOP_S s)" '[ $STOP_S -lt 60 ]'
check "final validation SIGINT: says every step was trained" 'grep -q "all 1 steps were trained" $W/val.log'
check "final validation SIGINT: no process of the run alive" '! alive "$PIDS"'
tail -3 $W/val.log
exit $bad
