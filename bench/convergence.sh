#!/usr/bin/env bash
# Convergence of soltrain's precision variants (issue 10): trains one task with each variant of
# bench/convergence_variants.txt (same seed, same data, same steps), then prints and writes a summary table
# (final eval loss, difference to the variant's baseline, PASS/FAIL against its criterion) and one SVG of eval
# and train loss per comparison.
#
# The task is the demo's (`soltrain demo-setup`: a random 0.8M-parameter Qwen3-shaped model, byte tokenizer,
# reverse a 3-6 letter word) with label noise: a fraction P of the answers (train and validation) are random
# words of the same length. No model can predict those, so the best achievable eval loss is known and far
# from 0 (0.6 nats per token at P = 0.2; bench/task_floor.py computes it from the validation file), and the
# variants are compared where precision matters instead of all reaching ~0. The LoRA variants start from a
# base made here first: the random model fully fine-tuned for --base-steps on the same task, so the adapters
# have most of the way still to go.
#
# Usage: bench/convergence.sh --out DIR [--soltrain BIN] [--device cuda|cpu] [--steps N] [--base-steps N]
#          [--eval-steps N] [--label-noise P] [--train N] [--validation N] [--variants FILE] [--only a,b]
#          [--set key=value ...]
#   --only: run these variants (and the baselines they compare with); --set: extra settings for every run.
# On the H200: bench/convergence.sh --soltrain .devbin/soltrain --device cuda --out runs/convergence
# Here, end to end on the CPU (evaluations dominate there: each runs the validation records one per 256-token
# row): bench/convergence.sh --device cpu --steps 10 --base-steps 5 --validation 100 --out /tmp/conv
# Exit status: 0 when every comparison passes, 1 when one fails or its run failed, 2 for bad arguments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "convergence.sh: $*" >&2; exit 2; }
soltrain=build/soltrain device=cuda steps=2000 base_steps=600 eval_steps="" noise=0.2 train=20000 validation=1000 out=""
variants=$here/convergence_variants.txt only=""
extra=()
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1: needs a value"
  case $1 in
    --soltrain) soltrain=$2 ;;
    --device) device=$2 ;;
    --steps) steps=$2 ;;
    --base-steps) base_steps=$2 ;;
    --eval-steps) eval_steps=$2 ;;
    --label-noise) noise=$2 ;;
    --train) train=$2 ;;
    --validation) validation=$2 ;;
    --out) out=$2 ;;
    --variants) variants=$2 ;;
    --only) only=$2 ;;
    --set) extra+=(--set "$2") ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
  shift 2
done
[ -n "$out" ] || die "--out DIR is required"
[ -x "$soltrain" ] || die "--soltrain $soltrain: not an executable (build it, or pass the binary)"
case $device in cpu | cuda) ;; *) die "--device $device: expected cpu or cuda" ;; esac
for v in steps base_steps train validation; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v/_/-} ${!v}: expected a positive whole number"
done
[ -z "$eval_steps" ] && eval_steps=$(( steps >= 10 ? steps / 10 : 1 ))
[[ $eval_steps =~ ^[1-9][0-9]*$ ]] || die "--eval-steps $eval_steps: expected a positive whole number"
python3 -c "import sys; p = float(sys.argv[1]); sys.exit(not 0 <= p < 1)" "$noise" 2>/dev/null ||
  die "--label-noise $noise: expected a number in [0, 1)"
plan=$(python3 "$here/convergence_report.py" plan "$variants" ${only:+--only "$only"}) || exit 2
soltrain=$(cd "$(dirname "$soltrain")" && pwd)/$(basename "$soltrain")
mkdir -p "$out/runs"
out=$(cd "$out" && pwd)
rm -f "$out"/runs/*.rc  # the report reads the variants with an exit status: only this invocation's
cp "$variants" "$out/variants.txt"  # the report reads this copy: the list as it was when the runs started

# The data and the model, made fresh: a changed --label-noise or --train must not meet old files.
rm -rf "$out/data" "$out/prepared"
"$soltrain" demo-setup --out "$out/data" --train "$train" --validation "$validation" --label-noise "$noise" --seed 1 \
  >"$out/demo-setup.log" 2>&1 || { cat "$out/demo-setup.log" >&2; die "demo-setup failed"; }

# The demo's settings (examples/demo.yaml), with the steps asked for. Evaluations every eval_steps, the loss
# logged every step for the curves, no checkpoints but the final model. LoRA keys are set here and switched on
# by the variants (lora=true), so each LoRA variant differs from its baseline by its own settings only.
warmup=$(( steps >= 200 ? 20 : steps / 10 ))
cat >"$out/config.yaml" <<EOF
# Written by bench/convergence.sh: the base config of every variant (each adds its settings with --set).
model: data/model
output_dir: runs/unused
datasets:
  - path: data/train.jsonl
    type: conversation
validation_datasets:
  - path: data/validation.jsonl
    type: conversation
dataset_prepared_path: prepared
sequence_len: 256
sample_packing: true
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
max_steps: $steps
learning_rate: 3.0e-3
lr_scheduler_type: cosine
warmup_steps: $warmup
weight_decay: 0.01
max_grad_norm: 1.0
adamw_beta2: 0.99
seed: 42
eval_steps: $eval_steps
save_steps: 0
logging_steps: 1
device: $device
lora: false
lora_rank: 16
lora_alpha: 32
lora_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
EOF

# run NAME [--set k=v ...]: one soltrain sft into runs/NAME; its log and exit status kept next to it.
run() {
  local name=$1 t0=$SECONDS rc=0
  shift
  rm -rf "$out/runs/$name" "$out/runs/$name.rc" "$out/runs/$name.log"
  "$soltrain" sft "$out/config.yaml" --set output_dir="$out/runs/$name" "$@" ${extra[@]+"${extra[@]}"} \
    >"$out/runs/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$out/runs/$name.rc"
  if [ "$rc" = 0 ]; then
    echo "  $name: done in $((SECONDS - t0)) s; $(grep -o '"eval_loss":[0-9.eE+-]*' "$out/runs/$name/metrics.jsonl" | tail -1)"
  else
    echo "  $name: FAILED (exit $rc) in $((SECONDS - t0)) s: $(grep -v '^\s*$' "$out/runs/$name.log" | tail -1)"
  fi
  return 0
}

echo "convergence: $steps steps per variant on $device, label noise $noise; results in $out"
if grep -q $'\tbase\t' <<<"$plan"; then
  echo "  base: full pre-train of the random model for $base_steps steps (the LoRA variants' starting point)"
  run base --set max_steps="$base_steps" --set warmup_steps=$(( base_steps / 10 ))
  [ "$(cat "$out/runs/base.rc")" = 0 ] || echo "  (the LoRA variants will fail: no base model)"
fi
while IFS=$'\t' read -r name start settings; do
  sets=()
  for s in $settings; do sets+=(--set "$s"); done
  [ "$start" = base ] && sets+=(--set model="$out/runs/base/model")
  run "$name" ${sets[@]+"${sets[@]}"}
done <<<"$plan"

# The floor over the validation file, per token as soltrain counts them (eval_tokens of any finished run).
tokens=$(cat "$out"/runs/*/metrics.jsonl 2>/dev/null | grep -o '"eval_tokens":[0-9]*' | head -1 | cut -d: -f2 || true)
floor=$(python3 "$here/task_floor.py" "$out/data/validation.jsonl" "$noise" ${tokens:+--tokens "$tokens"})
echo
python3 "$here/convergence_report.py" report "$out" "$out/variants.txt" --floor "$floor"
