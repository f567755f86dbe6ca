#!/usr/bin/env bash
# Convergence of soltrain's precision variants (issue 10): trains one task with each variant of
# bench/convergence_variants.txt (same seed, same data, same steps), then prints and writes a summary table
# (final eval loss, difference to the variant's baseline, PASS/FAIL against its criterion) and one SVG of eval
# and train loss per comparison. With --seeds, every variant is trained once per seed (runs/<name>-s<seed>) and
# the criteria are judged on the means over the seeds, next to each variant's spread.
#
# --task markov (the default): pretraining (`soltrain pt`) of a random Qwen3-shaped model (`soltrain demo-setup
# --model-only`, byte tokenizer; 512 hidden, 4 layers, 8 heads, 1536 intermediate: 12.8M parameters) on text
# from a random order-2 Markov chain over 26 letters (bench/markov_task.py): its floor, the best achievable eval
# loss, is computed exactly from the chain (about 1.6 nats per token), and the training data is larger than
# steps × batch, so no document is seen twice and nothing can be memorised: a relative criterion near the floor
# means something. Batch 16 × 256 tokens, lr 1e-3 cosine, warmup 100, an evaluation every --steps / 20.
# --task reverse: the demo's task (`soltrain demo-setup`: a random 0.8M-parameter model, reverse a 3-6 letter
# word; batch 4 × 256, lr 3e-3, `soltrain sft`) with label noise: a fraction P of the answers (train and validation) are random words of the same
# length, so the floor is 0.6 nats per token at P = 0.2 (bench/task_floor.py). Full fine-tuning from random init
# is chaotic there (bench/NOTES.md, run 30).
# The LoRA variants start from a base made here first (per seed): the random model fully trained for
# --base-steps on the same task, so the adapters have most of the way still to go.
#
# Usage: bench/convergence.sh --out DIR [--task markov|reverse] [--soltrain BIN] [--device cuda|cpu]
#          [--steps N] [--base-steps N] [--eval-steps N] [--seed N | --seeds N,N,...] [--train N]
#          [--validation N] [--hidden-size N] [--layers N] [--heads N] [--intermediate-size N]
#          [--label-noise P] [--variants FILE] [--only a,b] [--set key=value ...]
#   --seed: the training seed of every run (42); --seeds: each variant once per seed, runs/<name>-s<seed>;
#   --steps: 2000; --base-steps: markov 3/20 of --steps (300), reverse 600;
#   --train: training tokens (markov: default steps x batch x sequence_len x 1.25, no epoch repeats) or
#   conversations (reverse: 20000); --validation: documents (markov: 500) or conversations (reverse: 1000);
#   the model shape: markov 512 / 4 / 8 / 1536, reverse the demo's 128 / 4 / 4 / 384;
#   --label-noise: reverse only; --only: run these variants (and the baselines they compare with);
#   --set: extra settings for every run (e.g. --set learning_rate=5e-4).
# On the H200 (3 seeds, ~5-8 min): bench/convergence.sh --soltrain .devbin/soltrain --device cuda \
#   --seeds 42,43,44 --out runs/convergence
# Here, end to end on the CPU (wiring only): bench/convergence.sh --device cpu --steps 10 --base-steps 5 \
#   --hidden-size 64 --heads 2 --intermediate-size 128 --validation 20 --out /tmp/conv
# Exit status: 0 when every comparison passes, 1 when one fails or its run failed, 2 for bad arguments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

die() { echo "convergence.sh: $*" >&2; exit 2; }
soltrain=build/soltrain device=cuda task=markov steps=2000 base_steps="" eval_steps="" noise="" train="" validation=""
out="" seed=42 seeds="" hidden="" layers="" heads="" intermediate=""
variants=$here/convergence_variants.txt only=""
extra=()
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || die "$1: needs a value"
  case $1 in
    --soltrain) soltrain=$2 ;;
    --device) device=$2 ;;
    --task) task=$2 ;;
    --steps) steps=$2 ;;
    --base-steps) base_steps=$2 ;;
    --eval-steps) eval_steps=$2 ;;
    --seed) seed=$2 ;;
    --seeds) seeds=$2 ;;
    --label-noise) noise=$2 ;;
    --train) train=$2 ;;
    --validation) validation=$2 ;;
    --hidden-size) hidden=$2 ;;
    --layers) layers=$2 ;;
    --heads) heads=$2 ;;
    --intermediate-size) intermediate=$2 ;;
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
[[ $steps =~ ^[1-9][0-9]*$ ]] || die "--steps $steps: expected a positive whole number"
# The task's settings: the model shape, batch, learning rate, warmup, evaluations and data sizes.
case $task in
  markov)
    [ -z "$noise" ] || die "--label-noise: only for --task reverse"
    : "${hidden:=512}" "${layers:=4}" "${heads:=8}" "${intermediate:=1536}" "${validation:=500}"
    : "${base_steps:=$((steps >= 7 ? steps * 3 / 20 : 1))}" # the base part of the way down: the adapters have the rest to do
    batch=16 seq_len=256 lr=1.0e-3 lora_lr=1.0e-3 command=pt data_type=text
    : "${train:=$((steps * batch * seq_len * 5 / 4))}" # tokens: more than the runs read, no epoch repeats
    warmup=$((steps >= 1000 ? 100 : steps / 10))
    : "${eval_steps:=$((steps >= 20 ? steps / 20 : 1))}"
    ;;
  reverse)
    : "${hidden:=128}" "${layers:=4}" "${heads:=4}" "${intermediate:=384}" "${validation:=1000}" "${train:=20000}"
    : "${base_steps:=600}"
    : "${noise:=0.2}"
    batch=4 seq_len=256 lr=3.0e-3 lora_lr=1.0e-2 command=sft data_type=conversation
    warmup=$((steps >= 200 ? 20 : steps / 10))
    : "${eval_steps:=$((steps >= 10 ? steps / 10 : 1))}"
    python3 -c "import sys; p = float(sys.argv[1]); sys.exit(not 0 <= p < 1)" "$noise" 2>/dev/null ||
      die "--label-noise $noise: expected a number in [0, 1)"
    ;;
  *) die "--task $task: expected markov or reverse" ;;
esac
for v in base_steps eval_steps train validation hidden layers heads intermediate; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v/_/-} ${!v}: expected a positive whole number"
done
[[ $seed =~ ^[0-9]+$ ]] || die "--seed $seed: expected a whole number"
seed_list=()
if [ -n "$seeds" ]; then
  [[ $seeds =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--seeds $seeds: expected whole numbers separated by commas"
  IFS=, read -r -a seed_list <<<"$seeds"
  [ "$(printf '%s\n' "${seed_list[@]}" | sort -u | wc -l)" = "${#seed_list[@]}" ] || die "--seeds $seeds: a seed given twice"
fi
plan=$(python3 "$here/convergence_report.py" plan "$variants" ${only:+--only "$only"}) || exit 2
soltrain=$(cd "$(dirname "$soltrain")" && pwd)/$(basename "$soltrain")
mkdir -p "$out/runs"
out=$(cd "$out" && pwd)
rm -f "$out"/runs/*.rc  # the report reads the variants with an exit status: only this invocation's
cp "$variants" "$out/variants.txt"  # the report reads this copy: the list as it was when the runs started

# The data and the model, made fresh: a changed option must not meet old files.
rm -rf "$out/data" "$out/prepared"
shape=(--hidden-size "$hidden" --layers "$layers" --heads "$heads" --intermediate-size "$intermediate")
if [ "$task" = markov ]; then
  "$soltrain" demo-setup --out "$out/data" --model-only "${shape[@]}" --seed 1 >"$out/demo-setup.log" 2>&1 ||
    { cat "$out/demo-setup.log" >&2; die "demo-setup failed"; }
  python3 "$here/markov_task.py" generate --out "$out/data" --train-tokens "$train" --validation "$validation" \
    --max-tokens "$seq_len" --seed 1 2>>"$out/demo-setup.log" ||
    { cat "$out/demo-setup.log" >&2; die "markov_task.py generate failed"; }
else
  "$soltrain" demo-setup --out "$out/data" "${shape[@]}" --train "$train" --validation "$validation" \
    --label-noise "$noise" --seed 1 >"$out/demo-setup.log" 2>&1 || { cat "$out/demo-setup.log" >&2; die "demo-setup failed"; }
fi

# The demo's settings (examples/demo.yaml) for the task, with the steps asked for. Evaluations every eval_steps,
# the loss logged every step for the curves, no checkpoints but the final model. LoRA keys are set here and
# switched on by the variants (lora=true), so each LoRA variant differs from its baseline by its own settings only.
cat >"$out/config.yaml" <<EOF
# Written by bench/convergence.sh --task $task (soltrain $command): the base config of every variant (each adds
# its settings, and its seed, with --set).
model: data/model
output_dir: runs/unused
datasets:
  - path: data/train.jsonl
    type: $data_type
validation_datasets:
  - path: data/validation.jsonl
    type: $data_type
dataset_prepared_path: prepared
sequence_len: $seq_len
sample_packing: true
per_device_train_batch_size: $batch
gradient_accumulation_steps: 1
max_steps: $steps
learning_rate: $lr
lr_scheduler_type: cosine
warmup_steps: $warmup
weight_decay: 0.01
max_grad_norm: 1.0
adamw_beta2: 0.99
seed: $seed
eval_steps: $eval_steps
save_steps: 0
logging_steps: 1
device: $device
lora: false
lora_rank: 16
lora_alpha: 32
lora_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
EOF

# run NAME [--set k=v ...]: one soltrain sft / pt into runs/NAME; its log and exit status kept next to it.
run() {
  local name=$1 t0=$SECONDS rc=0
  shift
  rm -rf "$out/runs/$name" "$out/runs/$name.rc" "$out/runs/$name.log"
  "$soltrain" "$command" "$out/config.yaml" --set output_dir="$out/runs/$name" "$@" ${extra[@]+"${extra[@]}"} \
    >"$out/runs/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$out/runs/$name.rc"
  if [ "$rc" = 0 ]; then
    echo "  $name: done in $((SECONDS - t0)) s; $(grep -o '"eval_loss":[0-9.eE+-]*' "$out/runs/$name/metrics.jsonl" | tail -1)"
  else
    echo "  $name: FAILED (exit $rc) in $((SECONDS - t0)) s: $(grep -v '^\s*$' "$out/runs/$name.log" | tail -1)"
  fi
  return 0
}

# run_seed SUFFIX SEED: the base (when a LoRA variant needs it) and every variant of the plan, at one seed,
# into runs/<name>SUFFIX.
run_seed() {
  local suffix=$1 s=$2 name start settings kv
  if grep -q $'\tbase\t' <<<"$plan"; then
    echo "  base$suffix: full training of the random model for $base_steps steps (the LoRA variants' starting point)"
    run "base$suffix" --set seed="$s" --set max_steps="$base_steps" --set warmup_steps=$((base_steps / 10))
    [ "$(cat "$out/runs/base$suffix.rc")" = 0 ] || echo "  (the LoRA variants will fail: no base model)"
  fi
  while IFS=$'\t' read -r name start settings; do
    local sets=(--set seed="$s")
    for kv in $settings; do sets+=(--set "${kv//LORA_LR/$lora_lr}"); done
    [ "$start" = base ] && sets+=(--set model="$out/runs/base$suffix/model")
    run "$name$suffix" "${sets[@]}"
  done <<<"$plan"
}

t_all=$SECONDS
echo "convergence: task $task, $steps steps per variant on $device (model: hidden $hidden, $layers layers," \
  "$heads heads, intermediate $intermediate; batch $batch x $seq_len, lr $lr${extra[*]:+, and ${extra[*]}});" \
  "results in $out"
if [ ${#seed_list[@]} -gt 0 ]; then
  for s in "${seed_list[@]}"; do
    echo " seed $s:"
    run_seed "-s$s" "$s"
  done
else
  run_seed "" "$seed"
fi
echo "  all runs: $((SECONDS - t_all)) s"

# The floor over the validation file, per token as soltrain counts them (eval_tokens of any finished run).
tokens=$(cat "$out"/runs/*/metrics.jsonl 2>/dev/null | grep -o '"eval_tokens":[0-9]*' | head -1 | cut -d: -f2 || true)
if [ "$task" = markov ]; then
  floor=$(python3 "$here/markov_task.py" floor "$out/data/chain.json" "$out/data/validation.jsonl" ${tokens:+--tokens "$tokens"})
else
  floor=$(python3 "$here/task_floor.py" "$out/data/validation.jsonl" "$noise" ${tokens:+--tokens "$tokens"})
fi
echo
python3 "$here/convergence_report.py" report "$out" "$out/variants.txt" --floor "$floor" ${seeds:+--seeds "$seeds"}
