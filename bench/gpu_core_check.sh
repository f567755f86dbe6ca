#!/usr/bin/env bash
# One GPU-machine call for the model core (issue "Open the model core"): references made with transformers
# (the objective fixtures, the sft trajectory), the GPU tests, soltrain's LoRA against PEFT (fp32 and PEFT's
# bf16 autocast), and the benchmark next to transformers and the previous build. Binaries come in .devbin
# (bench/NOTES.md: "How these runs were made"); logs and fixtures go to $OUT.
#   bash bench/gpu_core_check.sh [refs] [tests] [dp] [probe] [peft] [bench] [bench8b] [bench4b] [quant] [qlora8b] [dpo] [fp8]
#     [pyapi] [ckptcuda] [outputs29] [grpo] [grpo2] [grpobeta] [train16k] [ckpt] [memory] [full8b] [conv] [offloadact] [long256k] [offloadw] [offloadw1] [full4b40] [attnfused] [zero1] [fp8dp] [splitorder] [off8b] [attne2e] [attnq] [attnprof] [attn] [peers8b] [peers4b] [moe] [moetests] [narrowdw] [moebench] [moeqlora] [moe48] [moe48q] [offgrads] [fullmoe] [moe48lowmem] [fp8qlora] [policy] [prefs] [reward] [prm] [addedtokens] [muon] [normuon] [decode] [grpocorr] [grpooverlap] [grpotrl] [qat] [nvfp4] [qwen3vl] [zero8]
#   (no argument: refs tests peft bench)
set -u
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(refs tests peft bench)
mkdir -p /work && ln -sfn "$PWD" /work/main
for d in build build-cuda; do mkdir -p $d && ln -sf "$PWD/.devbin/soltrain" $d/soltrain; done  # the tests' compiled-in binary path (either build folder)
# NCCL lives in the Python environment there (nvidia.nccl)
NCCL_LIB=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)/lib
# Only soltrain's own binaries see the carried libraries (.devbin/soltrain is a wrapper that sets them):
# exported, they would shadow what torch loads.
TESTS_ENV="LD_LIBRARY_PATH=$PWD/.devbin/lib:/usr/local/cuda/lib64:$NCCL_LIB"
B=$PWD/.devbin
# One `soltrain bench` run on a generated model (made once per machine; with --random-weights among the args only
# its config.json): its JSON in $OUT/<tag>.json and a line of the figures, or the tail of its error.
bench_one() {  # tag size bench-args...
  local tag=$1 size=$2 dir=$2 config_only=False
  shift 2
  case " $* " in *" --random-weights "*) dir=$size-config config_only=True ;; esac
  [ -d /tmp/soltrain-bench-models/$dir ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import run_bench; run_bench.save_model('$size', '/tmp/soltrain-bench-models', config_only=$config_only)"
  timeout "${BENCH_TIMEOUT:-150}" "$B/soltrain" bench --model /tmp/soltrain-bench-models/$dir "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], round(j['tokens_per_s']), 'tok/s,', round(j['memory_gib'], 2), 'GiB, loss', j['loss'], ', streamed layers', j.get('streamed_layers'))" \
    "$OUT/$tag.json" "$tag" || tail -3 "$OUT/$tag.err"
}
# One `soltrain bench-decode` run on a config-only model (random weights drawn there): its JSON in $OUT/<tag>.json
# and a line of the figures with the largest ops of the op-by-op profile.
decode_one() {  # tag size bench-decode-args...
  local tag=$1 size=$2
  shift 2
  [ -d /tmp/soltrain-bench-models/$size-config ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import run_bench; run_bench.save_model('$size', '/tmp/soltrain-bench-models', config_only=True)"
  # the bound at the datasheet's HBM rate: H200 4.8 TB/s, H100 3.35
  local hbm=3350
  nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && hbm=4800
  timeout "${BENCH_TIMEOUT:-150}" "$B/soltrain" bench-decode --model /tmp/soltrain-bench-models/$size-config --random-weights \
    --hbm-gbps $hbm "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"
  python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
top = sorted(j['profile_ms_per_step'].items(), key=lambda kv: -kv[1])[:7]
print(sys.argv[2], round(j['tokens_per_s']), 'tok/s, step', round(j['step_ms'], 3), 'ms, bound', round(j['bound_ms'], 3), 'ms =', round(100 * j['share_of_bound'], 1), '%, recorded', j['recorded'], j['why_not_recorded'], 'fused', j.get('fused_projections'))
print('   ops/step:', ', '.join(f'{k} {v:.3f}' for k, v in top))" "$OUT/$tag.json" "$tag" || tail -3 "$OUT/$tag.err"
}
moe_tests() {
  timeout 220 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaMoe*' > "$OUT/moe-tests.log" 2>&1
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/moe-tests.log"
  timeout 300 python3 tests/tools/check_moe_cuda.py "$B/soltrain" > "$OUT/moe-check.log" 2>&1
  grep -E "^(ok|FAIL)|passed|FAILED|Error" "$OUT/moe-check.log" | head -12
}
for s in "${steps[@]}"; do
  echo "== $s $(date +%T)"
  case $s in
    refs)
      timeout 200 python3 tests/tools/make_objective_reference.py tests/fixtures/models tests/fixtures/objective
      timeout 200 python3 tests/tools/make_sft_trajectory_reference.py "$B/soltrain" tests/fixtures/sft_trajectory
      tar czf "$OUT/fixtures.tgz" tests/fixtures/objective tests/fixtures/sft_trajectory/expected.json ;;
    pyapi)  # issue 27: the Python module built there (bench/gpu_module), imported, and Model.step next to bench
      { cmake -S bench/gpu_module -B /tmp/pymod -DDEVBIN="$B" && cmake --build /tmp/pymod -j 16; } > "$OUT/pymod.log" 2>&1 ||
        tail -30 "$OUT/pymod.log"
      PYTHONPATH=python SOLTRAIN_BUILD_DIR="$B" python3 -c "import soltrain; print('import soltrain:', soltrain.Model)"
      PYTHONPATH=python SOLTRAIN_BUILD_DIR="$B" timeout 520 python3 bench/python_api_bench.py --soltrain "$B/soltrain" \
        --models /tmp/soltrain-bench-models --steps "${PYAPI_STEPS:-15}" --out "$OUT" ;;
    moetests)  # issue 31: the MoE ops against their CPU twins, tiny Qwen3-MoE / Qwen2-MoE (+ PEFT) against
      # transformers in bf16
      moe_tests ;;
    moe)  # moetests, and the grouped GEMM next to a dense GEMM of the same FLOPs and a cuBLASLt GEMM per expert
      moe_tests
      for form in mma wgmma tma; do  # SOLTRAIN_GROUPED_GEMM: mma.sync, cp.async wgmma, TMA (the default)
        for shape in "--hidden 2048 --width 768" "--hidden 768 --width 2048"; do
          for skew in 0 1; do
            echo -n "$form "
            SOLTRAIN_GROUPED_GEMM=$form timeout 60 "$B/soltrain" bench-grouped-gemm $shape --skew $skew |
              tee -a "$OUT/grouped-gemm-$form.jsonl"
          done
        done
      done ;;
    narrowdw)  # issue 31: the LoRA factors' gradients on the A3B's shapes (dA: R x W, dB: W x R per expert), the
      # 128- and 64-wide tiles of the wide side (SOLTRAIN_NARROW_DW), uniform and skewed routing
      for tile in 128 64; do
        for shape in "--hidden 2048 --width 32" "--hidden 768 --width 16" "--hidden 32 --width 768" "--hidden 16 --width 2048"; do
          for skew in 0 1; do
            echo -n "dw$tile "
            SOLTRAIN_NARROW_DW=$tile timeout 60 "$B/soltrain" bench-grouped-gemm $shape --skew $skew |
              tee -a "$OUT/narrow-dw.jsonl" | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print(j['in'], '->', j['out'], 'skew', j['skew'], 'dw', round(j['grouped_dw_ms'] * 1e3), 'us', round(j['grouped_dw_gb_per_s']), 'GB/s; fwd', round(j['grouped_fwd_ms'] * 1e3), 'us, dx', round(j['grouped_dx_ms'] * 1e3), 'us')"
          done
        done
      done ;;
    moebench)  # issue 31: Qwen3-30B-A3B with 12 of its 48 layers, LoRA r16 on attention and experts, 2 x 2048,
      # next to transformers + PEFT with gradient checkpointing (the issue's peer)
      timeout 560 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes "${MOE_SIZE:-30B-A3B-L12}" --lora-rank 16 \
        --steps "${MOE_STEPS:-5}" --variant "recompute full=--recompute full" --peers "${MOE_PEERS:-lowmem}" \
        --attention "" --out "$OUT" > "$OUT/moebench.log" 2>&1
      grep -E "^\| Qwen|^  [a-z_]+ +[0-9.]+ ms|error" "$OUT/moebench.log" | head -60 ;;
    moe48)  # issue 31's target: the whole Qwen3-30B-A3B (48 layers), LoRA r16 on attention and experts, 2 x 2048,
      # soltrain's weights drawn from config.json alone (--random-weights: 61 GB would not fit the disk), next to
      # transformers + PEFT with gradient checkpointing (built from the same config on the GPU)
      # (MOE48_ARGS: other run_bench.py arguments, e.g. --baseline; MOE48_VARIANTS=none: no recompute variants)
      variants=(--variant "recompute full=--recompute full"
        --variant "recompute full, 8-bit AdamW=--recompute full --optimizer adamw_8bit")
      [ "${MOE48_VARIANTS:-}" = none ] && variants=()
      timeout 590 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 30B-A3B --random-weights --lora-rank 16 \
        --steps "${MOE_STEPS:-5}" "${variants[@]}" ${MOE48_ARGS:-} --peers "${MOE_PEERS:-lowmem}" \
        --attention "" --out "$OUT" > "$OUT/moe48.log" 2>&1
      grep -E "^\| Qwen|^  [a-z_]+ +[0-9.]+ ms|error" "$OUT/moe48.log" | head -60 ;;
    policy)  # GRPO's policy loss on the device against its CPU twin (with a top_entropy_quantile mask: cases 4-5)
      timeout 120 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaPolicy*' > "$OUT/policy-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/policy-tests.log" ;;
    prefs)  # issue 32: SimPO, ORPO and KTO on the device: the preference op against its CPU twin, then the demo's
      # word reversal trained with each (LoRA and full), the held-out loss and margin before and after
      timeout 120 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaPreference*' > "$OUT/pref-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/pref-tests.log"
      "$B/soltrain" demo-setup --out runs/demo-data > /dev/null 2>&1
      python3 - <<'PY'
import json, re
for split in ("train", "validation"):  # KTO's unpaired examples: each pair's chosen (desirable) and rejected
    with open(f"runs/demo-data/dpo_{split}.jsonl") as f, open(f"runs/demo-data/kto_{split}.jsonl", "w") as o:
        for line in f:
            r = json.loads(line)
            o.write(json.dumps({"prompt": r["prompt"], "completion": r["chosen"], "label": True}) + "\n")
            o.write(json.dumps({"prompt": r["prompt"], "completion": r["rejected"], "label": False}) + "\n")
y = open("examples/dpo-demo.yaml").read()
y = re.sub(r"(?m)^(loss_type|rpo_alpha|label_smoothing):.*\n", "", y)
for rl in ("orpo", "simpo", "kto"):
    z = y.replace("dpo_train", "kto_train").replace("dpo_validation", "kto_validation") if rl == "kto" else y
    open(f"examples/{rl}-demo.yaml", "w").write(f"rl: {rl}\n" + z)
PY
      for rl in orpo simpo kto; do
        for lora in true false; do
          timeout 120 "$B/soltrain" dpo examples/$rl-demo.yaml --set device=cuda --set lora=$lora \
            --set output_dir=../runs/$rl-demo-$lora > "$OUT/$rl-demo-lora-$lora.log" 2>&1
          echo "$rl lora=$lora: $(grep -E "^dpo: $rl|validation loss .* ->|error" "$OUT/$rl-demo-lora-$lora.log" | cut -c1-160 | tr '\n' ' ')"
        done
      done ;;
    reward)  # issue 32: reward models on the device: the reward op and the padded embedding backward against their CPU
      # twins; `dump --reward` on CUDA against the CPU (the score head's one-column GEMMs); the demo's reward model
      # trained with LoRA and in full (held-out loss, accuracy, margin)
      timeout 120 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaPreference*:CudaOps.Embedding*' \
        > "$OUT/reward-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/reward-tests.log"
      "$B/soltrain" demo-setup --out runs/demo-data > /dev/null 2>&1
      timeout 120 python3 tests/tools/check_reward_cuda.py "$B/soltrain" runs/demo-data/model > "$OUT/reward-check.log" 2>&1
      cat "$OUT/reward-check.log" | tail -16
      for lora in true false; do
        timeout 150 "$B/soltrain" dpo examples/reward-demo.yaml --set device=cuda --set lora=$lora \
          --set output_dir=../runs/reward-demo-$lora > "$OUT/reward-demo-lora-$lora.log" 2>&1
        echo "reward lora=$lora: $(grep -E "^step (0|100):|validation loss .* ->|error|tok/s" "$OUT/reward-demo-lora-$lora.log" | tail -4 | cut -c1-160 | tr '\n' ' ')"
      done ;;
    prm)  # issue 32: process reward models and Muon on the device: the Muon ops and the linear/cross-entropy ops against
      # their CPU twins; `dump --token-labels 2` on CUDA against the CPU (a biased two-column head); the demo trained
      # with optimizer: muon (full fine-tune) next to AdamW, and the LoRA reward model (not run on the GPU before)
      timeout 120 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOps.Muon*:CudaOps.AdamW4bit*:CudaOps.Linear*:CudaOps.CrossEntropy*' \
        > "$OUT/prm-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/prm-tests.log"
      "$B/soltrain" demo-setup --out runs/demo-data > /dev/null 2>&1
      timeout 120 python3 tests/tools/check_prm_cuda.py "$B/soltrain" runs/demo-data/model > "$OUT/prm-check.log" 2>&1
      tail -16 "$OUT/prm-check.log"
      for opt in muon adamw_torch; do
        timeout 150 "$B/soltrain" sft examples/demo.yaml --set device=cuda --set lora=false --set optimizer=$opt \
          --set learning_rate=0.002 --set output_dir=../runs/muon-demo-$opt > "$OUT/muon-demo-$opt.log" 2>&1
        echo "demo full $opt: $(grep -E "^step (0|100):|validation loss .* ->|error|tok/s" "$OUT/muon-demo-$opt.log" | tail -4 | cut -c1-160 | tr '\n' ' ')"
      done
      timeout 150 "$B/soltrain" dpo examples/reward-demo.yaml --set device=cuda --set lora=true \
        --set output_dir=../runs/reward-demo-lora > "$OUT/reward-demo-lora.log" 2>&1
      echo "reward lora: $(grep -E "validation loss .* ->|error|tok/s" "$OUT/reward-demo-lora.log" | tail -3 | cut -c1-160 | tr '\n' ' ')" ;;
    muon)  # issue 32: Muon's update at real sizes next to AdamW's (bench --optimizer muon; plan 83 estimated ~0.6
      # PFLOP of Newton–Schulz per update at 8B): Qwen3-0.6B and Qwen3-4B full fine-tuning, 2 x 2048
      for size in 0.6B 4B; do
        for opt in adamw muon; do
          BENCH_TIMEOUT=240 bench_one "muon-$size-$opt" $size --random-weights --batch-size 2 --seq-len 2048 \
            --recompute full --optimizer $opt --steps 6 --warmup 2
        done
      done ;;
    normuon)  # issue 32: NorMuon's CUDA ops against their CPU twin (and Muon's), then its update at real sizes beside
      # Muon's and AdamW's (bench --optimizer normuon), Qwen3-0.6B and 4B full fine-tuning, 2 x 2048
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOps.NorMuon*:CudaOps.Muon*' > "$OUT/normuon-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/normuon-tests.log"
      for size in 0.6B 4B; do
        for opt in adamw muon normuon; do
          BENCH_TIMEOUT=240 bench_one "normuon-$size-$opt" $size --random-weights --batch-size 2 --seq-len 2048 \
            --recompute full --optimizer $opt --steps 6 --warmup 2
        done
      done ;;
    addedtokens)  # issue 32: added tokens on the device: the live transformers/PEFT comparisons of
      # python/tests/test_added_tokens.py with device: cuda (resized vocabularies of 263 and 288 rows: LM-head GEMMs and
      # cross-entropy over a vocabulary no multiple of 8)
      SOLTRAIN_TEST_DEVICE=cuda SOLTRAIN_BIN=$B/soltrain timeout 300 python3 -m pytest -q -p no:cacheprovider \
        python/tests/test_added_tokens.py > "$OUT/addedtokens.log" 2>&1
      tail -5 "$OUT/addedtokens.log" ;;
    offgrads)  # offload_grads: the CUDA tests (bitwise the resident run), then Qwen3-8B full fine-tuning with 8-bit
      # AdamW, the masters and moments offloaded, with and without the layers' gradients (device memory and speed)
      timeout 240 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOffload*' > "$OUT/offgrads-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/offgrads-tests.log"
      for off in both all; do
        BENCH_TIMEOUT=200 bench_one "offgrads-8B-$off" 8B --random-weights --batch-size 2 --seq-len 2048 \
          --recompute full --optimizer adamw_8bit --offload $off --steps 3 --warmup 1
      done ;;
    fullmoe)  # issue 31: full fine-tuning of the whole Qwen3-30B-A3B on one GPU with 8-bit AdamW: bf16 weights
      # rounded stochastically (bf16_stochastic_round: no fp32 masters) and each layer updated as its backward ends
      # (optimizer_in_backward: no whole-model gradients); the moments offloaded on a card under 120 GiB. First the
      # CUDA tests of both, then Qwen3-8B full 8-bit: the ordinary update (masters and moments offloaded: they do not
      # fit an H100 otherwise) next to in-backward + bf16 SR (resident, and moments offloaded).
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOps.AdamW*:CudaOffload.*' \
        > "$OUT/fullmoe-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" "$OUT/fullmoe-tests.log"
      if [ "${FULLMOE_8B:-1}" = 1 ]; then
        for v in "ordinary-offload-both:--offload both" "inbwd-sr:--optimizer-in-backward --bf16-stochastic-round" \
          "inbwd-sr-offload-opt:--optimizer-in-backward --bf16-stochastic-round --offload optimizer"; do
          BENCH_TIMEOUT=150 bench_one "full8b-${v%%:*}" 8B --random-weights --batch-size 2 --seq-len 2048 \
            --recompute full --optimizer adamw_8bit --steps 3 --warmup 1 ${v#*:}
        done
      fi
      mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      off=""
      [ "$mem" -lt 120000 ] && off="--offload optimizer"
      BENCH_TIMEOUT=${FULLMOE_TIMEOUT:-330} bench_one "fullmoe-a3b" 30B-A3B --random-weights --batch-size 2 \
        --seq-len 2048 --recompute full --optimizer adamw_8bit --bf16-stochastic-round --optimizer-in-backward $off \
        --steps 3 --warmup 1 ;;
    fp8qlora)  # recipe fp8-hybrid over a QLoRA base (each frozen quantised projection dequantised once into its FP8
      # copies): the FP8 GPU tests, then Qwen3-4B LoRA r16 2 x 2048 over an NF4 base in bf16 and under the recipe, and
      # over the bf16 base under the recipe, in one call
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*Fp8*:CudaOps.Dequant*:*Qlora*' \
        > "$OUT/fp8qlora-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/fp8qlora-tests.log"
      for v in "nf4-bf16:--qlora nf4" "nf4-fp8:--qlora nf4 --recipe fp8-hybrid" "fp8blocks-fp8:--qlora fp8 --recipe fp8-hybrid" \
        "bf16base-fp8:--recipe fp8-hybrid"; do
        bench_one "fp8qlora-${v%%:*}" 4B --random-weights --batch-size 2 --seq-len 2048 --lora-rank 16 --steps 5 \
          --warmup 2 ${v#*:}
      done ;;
    moe48lowmem)  # issue 31's memory item: the whole A3B LoRA r16 (all linear incl. experts), 2 x 2048, with the
      # adapters' state cut down (8-bit AdamW, bf16 adapters rounded stochastically, each layer updated in backward)
      # at recompute selective (plan 69.5 GiB); on a card of 120 GiB or more also recompute none that way (90.4) and
      # the ordinary fp32-AdamW run at none (run 80: 18.5k tok/s in 104.8 GiB) as the baseline in the same call
      low="--optimizer adamw_8bit --optimizer-in-backward --bf16-stochastic-round"
      mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
      variants=("selective-lowmem:--recompute selective $low")
      [ "$mem" -ge 120000 ] && variants+=("none-lowmem:--recompute none $low" "none-baseline:--recompute none")
      for v in "${variants[@]}"; do
        BENCH_TIMEOUT=${MOE48_TIMEOUT:-200} bench_one "moe48-${v%%:*}" 30B-A3B --random-weights --batch-size 2 \
          --seq-len 2048 --lora-rank 16 --steps 5 --warmup 2 ${v#*:}
      done ;;
    moe48q)  # the whole A3B under QLoRA (NF4 and FP8 experts), weights drawn from config.json alone
      for q in ${MOE_QLORA:-nf4 fp8}; do
        BENCH_TIMEOUT=280 bench_one "moe48-qlora-$q" 30B-A3B --random-weights --batch-size 2 --seq-len 2048 \
          --lora-rank 16 --qlora $q --recompute full --steps 4 --warmup 2 ${MOE_QLORA_ARGS:-}
      done ;;
    moeqlora)  # issue 31: the same 12-layer A3B, LoRA r16 over an NF4 / FP8 base (experts dequantised per
      # projection into one scratch, E launches each: the per-expert dequant is the cost to look at)
      for q in nf4 fp8; do
        bench_one "moe-qlora-$q" "${MOE_SIZE:-30B-A3B-L12}" --batch-size 2 --seq-len 2048 --lora-rank 16 --qlora $q \
          --recompute full --steps 5 --warmup 2
      done ;;
    tests)
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*Cuda*:Shapes/*:*Objective*:LayerHooks*:SftTrajectory*:Fixtures/*:AdamW8bit*:-CudaDataParallel*:*AttentionFused*' \
        > "$OUT/gpu-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/gpu-tests.log" ;;
    probe)
      timeout 300 python3 tests/tools/probe_lora_precision.py "$B/soltrain" --cases 6 > "$OUT/probe.log" 2>&1
      tail -8 "$OUT/probe.log" ;;
    dp)  # the NCCL communicator: world size 1 bitwise as one process; 2 GPUs when this machine has them
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaDataParallel*' > "$OUT/dp-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]|OK \]|SKIPPED \]" "$OUT/dp-tests.log" ;;
    bench4b)  # Qwen3-4B full: the data-parallel path's cost at world size 1, and 8-bit AdamW
      timeout 500 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 4B \
        --variant "data parallel ZeRO-2 (NCCL, 1 rank)=--data-parallel 2" \
        --variant "8-bit AdamW=--optimizer adamw_8bit" \
        --peers none --attention "" --out "$OUT" > "$OUT/bench4b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/bench4b.log" ;;
    zero1)  # issue 14: the data-parallel path at world size 1 (NCCL, in place) next to the plain step, on Qwen3-4B
      # full and Qwen3-8B LoRA r16 at 2 x 2048; the plain step again last, to bound the drift within the call
      for z in plain 2 3 plain2; do
        case $z in plain*) dp=() ;; *) dp=(--data-parallel "$z") ;; esac
        bench_one "zero1-4B-$z" 4B --batch-size 2 --seq-len 2048 --steps 8 --warmup 3 "${dp[@]}"
      done
      for z in plain 0 2 3 plain2; do
        case $z in plain*) dp=() ;; *) dp=(--data-parallel "$z") ;; esac
        bench_one "zero1-8B-lora-$z" 8B --batch-size 2 --seq-len 2048 --lora-rank 16 --steps 8 --warmup 3 "${dp[@]}"
      done ;;
    fp8dp)  # FP8 under the data-parallel path at world size 1 (the amax max-reduction, NCCL): Qwen3-0.6B full 8 x 2048
      for z in plain 2 3 plain2; do
        case $z in plain*) dp=() ;; *) dp=(--data-parallel "$z") ;; esac
        bench_one "fp8dp-0.6B-$z" 0.6B --batch-size 8 --seq-len 2048 --recipe fp8-hybrid --steps 8 --warmup 3 "${dp[@]}"
      done ;;
    splitorder)  # the split backward's launch order (SOLTRAIN_ATTENTION_ORDER): shortest first (the default) against
      # longest first, bwd TFLOP/s by device events at T = 2k .. 64k (Qwen3-8B heads), each twice, interleaved
      for shape in 8x2048 4x4096 2x8192 1x16384 1x65536; do
        for order in shortest longest shortest longest; do
          r=$(timeout 60 env SOLTRAIN_ATTENTION_BACKWARD=split SOLTRAIN_ATTENTION_ORDER=$order "$B/soltrain" bench-attention \
            --batch "${shape%x*}" --heads 32 --kv-heads 8 --seq-len "${shape#*x}" 2>&1 | tail -1)
          echo "$shape split $order: $(echo "$r" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print("bwd", round(j["bwd_tflops"]), round(j["bwd_ms"], 3), "ms")' 2>/dev/null || echo "$r")"
        done
      done ;;
    off8b)  # Qwen3-8B full, 8-bit AdamW with masters and moments offloaded, 4 x 2048, accumulation 8 (run 52: 9886 tok/s)
      bench_one off8b 8B --batch-size 4 --seq-len 2048 --optimizer adamw_8bit --recompute elementwise --offload both \
        --gradient-accumulation 8 --steps 3 --warmup 1 ;;
    quant)  # QLoRA formats against torch (writes tests/fixtures/quant), then the GPU tests that read them
      timeout 300 python3 tests/tools/check_quant.py "$B/soltrain" --cuda > "$OUT/quant.log" 2>&1
      grep -E "^FAIL|passed|failed" "$OUT/quant.log"
      [ -d tests/fixtures/quant ] && tar czf "$OUT/quant-fixtures.tgz" tests/fixtures/quant
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaQuant*:Quant*:CudaOps*:CudaLora*' \
        > "$OUT/quant-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/quant-tests.log" ;;
    qat)  # Axolotl's qat: block on the GPU against the CPU twin (bench/qat_cuda_check.sh), then a qat run
      timeout 300 bash bench/qat_cuda_check.sh "$OUT" 2>&1 | tail -14 ;;
    zero8)  # issue 34: 8-bit moments and offloaded state under ZeRO 1-3 over NCCL at world size 1 (bitwise the
      # single process: tests/gpu/test_cuda_data_parallel.cpp), then Qwen3-4B full 2 x 2048 with 8-bit moments: the
      # previous build (.devbin/soltrain-before: pack_devbin.sh's baseline) plain and ZeRO-3 at world size 1, and this
      # one plain, ZeRO-3 (its store allocated by slices: whole at one rank), offloaded alone and at ZeRO-3, plain again
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" \
        --gtest_filter='CudaDataParallel.Nccl*:-*NeverFinishes*:CudaOffload*:CudaOps.AdamW*:AdamW8bit*' > "$OUT/zero8-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/zero8-tests.log"
      if [ -x "$B/soltrain-before" ]; then
        mkdir -p /tmp/before && ln -sf "$B/soltrain-before" /tmp/before/soltrain
        (B=/tmp/before; bench_one zero8-plain-before 4B --random-weights --batch-size 2 --seq-len 2048 --optimizer adamw_8bit --steps 5 --warmup 2)
        (B=/tmp/before; bench_one zero8-z3-before 4B --random-weights --batch-size 2 --seq-len 2048 --optimizer adamw_8bit --steps 5 --warmup 2 --data-parallel 3)
      fi
      for v in "plain:" "z3:--data-parallel 3" "off:--offload both" "z3off:--data-parallel 3 --offload both" "plain2:"; do
        bench_one "zero8-${v%%:*}" 4B --random-weights --batch-size 2 --seq-len 2048 --optimizer adamw_8bit --steps 5 --warmup 2 ${v#*:}
      done ;;
    qwen3vl)  # Qwen3-VL's language model (LoRA) on cuda next to the CPU and PEFT (tests/tools/check_qwen3_vl_cuda.py)
      timeout 200 python3 tests/tools/check_qwen3_vl_cuda.py "$B/soltrain" "$OUT/qwen3vl" 2>&1 | tail -4 ;;
    nvfp4)  # the NVFP4 base (qlora_fp4) next to NF4: Qwen3-4B LoRA r16 2 x 2048, bf16 GEMMs over the dequantised base
      for v in "nf4:--qlora nf4" "nvfp4:--qlora nvfp4" "nvfp4-fp8:--qlora nvfp4 --recipe fp8-hybrid"; do
        bench_one "nvfp4-${v%%:*}" 4B --random-weights --batch-size 2 --seq-len 2048 --lora-rank 16 --steps 5 \
          ${v#*:}
      done ;;
    qlora8b)  # Qwen3-8B LoRA r16 at 1 x 2048 with full recompute: bf16 base, NF4, FP8 (issue 10's QLoRA targets)
      timeout 330 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 8B --batch 8B=1 --lora-rank 16 \
        --recompute full --variant "QLoRA NF4=--qlora nf4" --variant "QLoRA FP8=--qlora fp8" \
        --peers none --attention "" --out "$OUT" > "$OUT/qlora8b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/qlora8b.log" ;;
    grpo)  # issue 30: the CUDA policy loss against its CPU twin, the decoder and generation tests, the CPU task
      # (python/tests/test_grpo_run.py's) on the GPU, and rollout / step throughput on Qwen3 shapes
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*PolicyLoss*:*Generate*:*Decoder*:CudaModel*:CudaLora*' \
        > "$OUT/grpo-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/grpo-tests.log"
      for lora in false true; do
        timeout 400 python3 bench/grpo_bench.py --soltrain "$B/soltrain" --out "$OUT" --shapes ${GRPO_SHAPES:-0.6B 1.7B} \
          --concurrency ${GRPO_CONCURRENCY:-64 256} --steps 3 $([ $lora = true ] && echo --lora) 2>&1 | tail -8
        [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/grpo-bench-lora-$lora.json"
      done ;;
    grpo2)  # issue 30 with sampling on the device: the sampling, decoder and generation tests, then rollouts and
      # steps with the real Qwen3 vocabulary (random weights, the Qwen3 tokenizer): 0.6B full, 8B LoRA
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*Sampling*:*PolicyLoss*:*Generate*:*Decoder*' \
        > "$OUT/grpo2-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/grpo2-tests.log"
      for spec in ${GRPO2_RUNS:-0.6B:false 8B:true}; do  # shape:lora
        set -- ${spec/:/ }
        timeout ${GRPO2_TIMEOUT:-300} python3 bench/grpo_bench.py --soltrain "$B/soltrain" --out "$OUT" --shapes $1 \
          --real "$B/../build-cuda/tokenizers/qwen3" --concurrency ${GRPO_CONCURRENCY:-64 256} --steps 3 \
          $([ $2 = true ] && echo --lora) 2>&1 | tail -4
        [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/grpo2-bench-$1-lora-$2.json"
      done ;;
    decode)  # issue 30: the decode step recorded as a CUDA graph, the grouped decode attention, the paged cache:
      # the decoder's GPU tests, then bench-decode as GRPO decodes (64-token prompts shared by groups of 8, 256 new
      # tokens) at 64 and 256 rows, and at 64 rows op by op (SOLTRAIN_DECODE_GRAPH=0) and with the per-head
      # attention kernel (SOLTRAIN_DECODE_ATTENTION=rows)
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" \
        --gtest_filter='CudaDecode*:*RecordedDecode*:*FusedDecode*:*CudaGenerate*:*DecodeWithLora*:*Sampling*' > "$OUT/decode-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure|recorded" "$OUT/decode-tests.log" | head -20
      for spec in ${DECODE_RUNS:-0.6B:0 8B:16}; do  # shape:lora rank
        set -- ${spec/:/ }
        for rows in ${DECODE_ROWS:-64 256}; do
          decode_one decode-$1-r$2-$rows $1 --rows $rows --group 8 --lora-rank $2 ${DECODE_ARGS:-}
        done
        for v in ${DECODE_VARIANTS:-nograph rowsattn topp}; do  # at 64 rows
          case $v in
            nograph) SOLTRAIN_DECODE_GRAPH=0 decode_one decode-$1-r$2-64-$v $1 --rows 64 --group 8 --lora-rank $2 ;;
            rowsattn) SOLTRAIN_DECODE_ATTENTION=rows decode_one decode-$1-r$2-64-$v $1 --rows 64 --group 8 --lora-rank $2 ;;
            topp) decode_one decode-$1-r$2-64-$v $1 --rows 64 --group 8 --lora-rank $2 --top-p 0.95 --top-k 50 ;;
            unfused) SOLTRAIN_DECODE_FUSED=0 decode_one decode-$1-r$2-64-$v $1 --rows 64 --group 8 --lora-rank $2 ;;
            unsplit) SOLTRAIN_SAMPLE_SPLIT=0 decode_one decode-$1-r$2-64-$v $1 --rows 64 --group 8 --lora-rank $2 ;;
          esac
        done
      done
      for f in "$OUT"/decode-*-64.json "$OUT"/decode-*-256.json; do  # each projection's GEMM alone
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], ' '.join(f\"{g['name']} {g['us']:.1f}us/{100*g['share_of_bound']:.0f}%\" for g in j['gemms']))" "$f"
      done
      timeout 120 python3 bench/decode_gemm_torch.py --rows 64 256 --shapes 0.6B 8B ;;
    grpocorr)  # TRL's importance-sampling correction (use_vllm: true) on the GPU: the bf16 decoder's log-probs
      # against the bf16 trainer's (sampling/* metrics), and what the extra forward costs a step, next to the same run
      # without it (Qwen3-1.7B real vocabulary, 8 x 8 x 512, full fine-tuning)
      for corr in false true; do
        timeout 300 python3 bench/grpo_bench.py --soltrain "$B/soltrain" --out "$OUT" --shapes 1.7B \
          --real "$B/../build-cuda/tokenizers/qwen3" --concurrency 64 --completion 512 --steps 3 \
          --sampling "{\"use_vllm\": $corr}" 2>&1 | tail -2
        [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/grpocorr-$corr.json"
      done ;;
    grpooverlap)  # generation_overlap (one step off-policy) against the serial step at the real Qwen3-1.7B shape (8 x 8 x
      # 512, full fine-tuning) and 0.6B; the threaded run against the same schedule on one thread
      # (SOLTRAIN_GRPO_OVERLAP_INLINE=1): losses and rewards equal if the update waits for the generation as it must
      # (a reward that varies on random weights and a learning rate that moves them: equal losses mean something)
      for shape in ${OVERLAP_SHAPES:-1.7B 0.6B}; do
        for mode in ${OVERLAP_MODES:-serial overlap inline}; do  # noprio: overlap at the default stream priority
          ov=false; [ $mode != serial ] && ov=true
          SOLTRAIN_GRPO_OVERLAP_INLINE=$([ $mode = inline ] && echo 1 || echo 0) \
          SOLTRAIN_BESIDE_PRIORITY=$([ $mode = noprio ] && echo 0 || echo 1) timeout 300 python3 bench/grpo_bench.py \
            --soltrain "$B/soltrain" --out "$OUT" --shapes $shape --real "$B/../build-cuda/tokenizers/qwen3" \
            --concurrency 64 --completion 512 --steps 5 --sampling "{\"generation_overlap\": $ov, \"learning_rate\": 1e-5, \"reward_funcs\": [\"bench.grpo_length_reward:text_length\"]}" 2>&1 | tail -1
          [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/overlap-$shape-$mode.json"
          grep -iE "error|not built" "$OUT/grpo-$shape-64.log" | tail -2
        done
        [ -f "$OUT/overlap-$shape-inline.json" ] && python3 -c "import json,sys; a,b=(json.load(open(f))[0] for f in sys.argv[1:]); print('threaded == inline:', a['losses']==b['losses'] and a['rewards']==b['rewards'], a['losses'], b['losses'])" \
          "$OUT/overlap-$shape-overlap.json" "$OUT/overlap-$shape-inline.json"
      done ;;
    grpotrl)  # issue 30's whole-step comparison at the real Qwen3-1.7B shape and vocabulary (random weights): 8 prompts
      # x 8 generations, 512-token completions, full fine-tuning, next to TRL's GRPOTrainer with transformers'
      # generate on the same model folder (TRL, datasets and their pure-Python needs carried as wheels in .gl/wheels)
      timeout 300 python3 bench/grpo_bench.py --soltrain "$B/soltrain" --out "$OUT" --shapes 1.7B \
        --real "$B/../build-cuda/tokenizers/qwen3" --concurrency 64 --completion 512 --steps 3 2>&1 | tail -2
      [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/grpotrl-soltrain.json"
      pip install -q --no-index --no-deps --find-links .gl/wheels --target /tmp/trlpy trl datasets dill multiprocess \
        xxhash fsspec 2>&1 | tail -2
      PYTHONPATH=/tmp/trlpy timeout ${TRL_TIMEOUT:-360} python3 bench/trl_grpo_step.py \
        --model /tmp/soltrain-grpo-models/real/1.7B --prompts 8 --generations 8 --completion 512 --steps 3 \
        > "$OUT/grpotrl-trl.json" 2> "$OUT/grpotrl-trl.err"
      tail -1 "$OUT/grpotrl-trl.json"; grep -v Warning "$OUT/grpotrl-trl.err" | tail -3 ;;
    grpobeta)  # full fine-tuning with beta > 0: the reference a frozen copy of the starting weights (KL 0 at step 1,
      # > 0 after), its memory and the step's cost next to grpo2's beta-0 run
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*Grpo*:*PolicyLoss*' 2>&1 | grep -E "^\[  (PASSED|FAILED)"
      timeout 300 python3 bench/grpo_bench.py --soltrain "$B/soltrain" --out "$OUT" --shapes 0.6B \
        --real "$B/../build-cuda/tokenizers/qwen3" --concurrency 64 --steps 3 \
        --sampling '{"beta": 0.04, "learning_rate": 1e-5, "reward_funcs": ["bench.grpo_length_reward:text_length"]}' 2>&1 | tail -2
      [ -f "$OUT/grpo-bench.json" ] && mv "$OUT/grpo-bench.json" "$OUT/grpobeta-bench.json"
      grep -E "reference|generation memory" "$OUT/grpo-0.6B-64.log"
      python3 -c "import json,sys; [print('step', r['step'], 'kl', r.get('kl'), 'entropy', r.get('entropy'), 'loss', r['loss']) for r in map(json.loads, open(sys.argv[1])) if 'reward' in r]" \
        /tmp/soltrain-grpo-models/run-real-0.6B-64/metrics.jsonl ;;
    train16k)  # issue 30's trainer-side figures: a training step at 16k tokens per sequence (SFT's step: the same
      # forward and backward as GRPO's, the loss op aside)
      bench_one train16k-0.6B-full 0.6B --batch-size 1 --seq-len 16384 --steps 8 --device cuda --recompute none
      bench_one train16k-4B-lora 4B --batch-size 1 --seq-len 16384 --steps 8 --device cuda --lora-rank 16 ;;
    dpo)  # preference training: the torch reference fixture, CPU/GPU tests, the demo task on the GPU, throughput
      timeout 200 python3 tests/tools/make_dpo_reference.py tests/fixtures/models tests/fixtures/dpo > "$OUT/dpo-ref.log" 2>&1
      tail -2 "$OUT/dpo-ref.log"; [ -d tests/fixtures/dpo ] && tar czf "$OUT/dpo-fixtures.tgz" tests/fixtures/dpo
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*Dpo*:*Preference*:CudaModel*:CudaLora*:*Objective*' \
        > "$OUT/dpo-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/dpo-tests.log"
      "$B/soltrain" demo-setup --out runs/demo-data > /dev/null 2>&1
      for lora in true false; do
        timeout 120 "$B/soltrain" dpo examples/dpo-demo.yaml --set device=cuda --set lora=$lora \
          --set output_dir=../runs/dpo-demo-$lora > "$OUT/dpo-demo-lora-$lora.log" 2>&1
        grep -E "validation|acc|error" "$OUT/dpo-demo-lora-$lora.log" | tail -4
        cp runs/dpo-demo-$lora/metrics.jsonl "$OUT/dpo-demo-lora-$lora.metrics.jsonl" 2>/dev/null
      done
      timeout 240 python3 bench/dpo_bench.py --soltrain "$B/soltrain" --size 8B --pairs 1 --seq 2048 --steps 4 \
        > "$OUT/dpo-bench.log" 2>&1
      tail -12 "$OUT/dpo-bench.log" ;;
    fp8)  # the fp8-hybrid recipe: its GPU tests against the CPU twin, then speed next to bf16 in one call
      timeout 300 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaFp8*:Fp8*:CudaOps*:CudaTest*' \
        > "$OUT/fp8-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/fp8-tests.log"
      timeout 400 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 8B --batch 8B=2 --lora-rank 16 \
        --variant "fp8-hybrid=--recipe fp8-hybrid" --variant "fp8-hybrid current=--recipe fp8-hybrid --fp8-scaling current" \
        --peers "${PEERS:-none}" --attention "" --out "$OUT" > "$OUT/fp8-8b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/fp8-8b.log"
      timeout 300 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 0.6B \
        --variant "fp8-hybrid=--recipe fp8-hybrid" --peers "${PEERS:-none}" --attention "" --out "$OUT" \
        > "$OUT/fp8-06b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/fp8-06b.log" ;;
    memory)  # recompute elementwise with fp32 and 8-bit AdamW on 0.6B and 4B full (issue 10: 4B 8-bit <= 60 GiB)
      timeout 240 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 0.6B,4B --recompute elementwise \
        --variant "8-bit AdamW=--optimizer adamw_8bit" --peers none --attention "" --out "$OUT" > "$OUT/memory.log" 2>&1
      grep -E "^\| Qwen" "$OUT/memory.log" ;;
    full8b)  # Qwen3-8B full fine-tuning on one GPU with 8-bit AdamW (issue 12: >= 10k tok/s); the model from qlora8b
      # (run_bench's table would start with fp32 moments, which do not fit: 8B x 16 bytes of state alone)
      [ -d /tmp/soltrain-bench-models/8B ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import run_bench; run_bench.save_model('8B', '/tmp/soltrain-bench-models')"
      timeout 240 "$B/soltrain" bench --model /tmp/soltrain-bench-models/8B --batch-size 2 --seq-len 2048 --steps 6 \
        --optimizer adamw_8bit --recompute elementwise > "$OUT/full8b.json" 2> "$OUT/full8b.err"
      python3 -c "import json; r = json.load(open('$OUT/full8b.json')); print({k: r[k] for k in ('tokens_per_s', 'memory_gib', 'step_s', 'optimizer_gib', 'activation_gib')})" ;;
    conv)  # convergence of the precision variants on the Markov task, 3 seeds (issue 10)
      timeout 540 bash bench/convergence.sh --soltrain "$B/soltrain" --device cuda --seeds 42,43,44 --steps "${CONV_STEPS:-1500}" ${CONV_ONLY:+--only "$CONV_ONLY"} \
        --out "$OUT/convergence" > "$OUT/convergence.log" 2>&1
      tail -30 "$OUT/convergence.log"
      rm -rf "$OUT"/convergence/data "$OUT"/convergence/prepared "$OUT"/convergence/runs/*/model \
        "$OUT"/convergence/runs/*/checkpoint-* "$OUT"/convergence/runs/*/adapter ;;
    offloadact)  # offload_activations: the CUDA tests, then Qwen3-4B LoRA at 32k tokens with and without it
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOffloadActivations*' > "$OUT/offloadact-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/offloadact-tests.log"
      timeout 300 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 4B --batch 4B=1 --seq 32768 --steps 3 \
        --lora-rank 16 --recompute full --variant "offload_activations=--offload-activations" \
        --peers none --attention "" --out "$OUT" > "$OUT/offloadact.log" 2>&1
      grep -E "^\| Qwen" "$OUT/offloadact.log" ;;
    long256k)  # issue 12: one full Qwen3-8B LoRA step at 1 x 262144 tokens, checkpoints offloaded (~240 s, run 44)
      # bf16 residual: fp32 checkpoints would take 140 GiB of host memory (128 GiB on the 1-GPU machine)
      [ -d /tmp/soltrain-bench-models/8B ] || python3 -c "import sys; sys.path.insert(0, 'bench'); import run_bench; run_bench.save_model('8B', '/tmp/soltrain-bench-models')"
      timeout 420 "$B/soltrain" bench --model /tmp/soltrain-bench-models/8B --batch-size 1 --seq-len 262144 \
        --lora-rank 16 --recompute full --offload-activations --residual-dtype bf16 --warmup 0 --steps 1 --no-profile \
        > "$OUT/long256k.json" 2> "$OUT/long256k.err"
      tail -2 "$OUT/long256k.err"; cat "$OUT/long256k.json" ;;
    offloadw)  # issue 12: offload_weights. CUDA tests, then Qwen3-8B LoRA r16 at 8 x 2048, recompute full: the base
      # resident vs streamed (target: <= 16 GiB at >= 90% of the resident speed), with and without offloaded checkpoints
      timeout 200 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='CudaOffloadWeights*' > "$OUT/offloadw-tests.log" 2>&1
      grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/offloadw-tests.log"
      for v in "resident:" "streamed:--offload-weights" "streamed_ckpt:--offload-weights --offload-activations"; do
        bench_one "offloadw-${v%%:*}" 8B --batch-size 8 --seq-len 2048 --lora-rank 16 --recompute full --warmup 2 \
          --steps 4 ${v#*:}
      done ;;
    offloadw1)  # the same at 1 x 2048: all layers streamed (copy-bound), or 24 / 26 of 36 kept on the GPU (run 46: 24
      # kept gave 89.7% of resident in 15.0 GiB; 26 should pass 90% at ~15.7 GiB)
      for v in "resident:" "streamed:--offload-weights" "kept24:--offload-weights --offload-weights-resident-layers 24" \
               "kept24_ckpt:--offload-weights --offload-weights-resident-layers 24 --offload-activations" \
               "kept26:--offload-weights --offload-weights-resident-layers 26"; do
        bench_one "offloadw-b1-${v%%:*}" 8B --batch-size 1 --seq-len 2048 --lora-rank 16 --recompute full --warmup 2 \
          --steps 5 ${v#*:}
      done ;;
    full4b40)  # issue 12: Qwen3-4B full in <= 40 GiB at >= 90% of 16.8k tok/s: 8-bit moments and the masters offloaded,
      # the update amortised over micro-batches (1, 8, 16 per update), next to the resident 8-bit run
      for v in "resident16:--gradient-accumulation 16" "offload1:--offload both" \
               "offload8:--offload both --gradient-accumulation 8" "offload16:--offload both --gradient-accumulation 16"; do
        bench_one "full4b40-${v%%:*}" 4B --batch-size 2 --seq-len 2048 --optimizer adamw_8bit --recompute elementwise \
          --warmup 1 --steps 3 --no-profile ${v#*:}
      done ;;
    peers8b)  # issue 12's rows next to the peer with its own best memory settings (gradient checkpointing): 8B LoRA
      timeout 560 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 8B --batch 8B=8 --lora-rank 16 \
        --recompute full --variant "offload_weights + offload_activations=--offload-weights --offload-activations" \
        --peers lowmem --attention "" --out "$OUT" > "$OUT/peers8b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/peers8b.log" ;;
    peers4b)  # ... and 4B full: 8-bit AdamW, masters and moments offloaded, 16 micro-batches per update
      timeout 500 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 4B --batch 4B=2 \
        --variant "8-bit, offload both, accumulation 16=--optimizer adamw_8bit --recompute elementwise --offload both --gradient-accumulation 16" \
        --peers lowmem --attention "" --out "$OUT" > "$OUT/peers4b.log" 2>&1
      grep -E "^\| Qwen" "$OUT/peers4b.log" ;;
    attnfused)  # the fused backward forms (SOLTRAIN_ATTENTION_BACKWARD=atomic, ordered) against the CPU, alone: a
      # wrong turn order would hang the ordered kernel, so a short limit
      timeout 120 env "$TESTS_ENV" "$B/soltrain_tests" --gtest_filter='*AttentionFused*' > "$OUT/attnfused-tests.log" 2>&1
      echo "exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran" "$OUT/attnfused-tests.log" ;;
    attnq)  # a quick A/B of the attention backward's forms: fwd / bwd TFLOP/s and bwd ms at 4k, 8k, 16k (Qwen3-8B heads)
      # for each form, this build and the previous one (.devbin/soltrain-before, when packed with one), and any
      # variants named in ATTNQ_BINS; ATTNQ_FORMS picks the forms
      for shape in 4x4096 2x8192 1x16384; do
        for bin in soltrain soltrain-before ${ATTNQ_BINS:-}; do
          [ -x "$B/$bin" ] || continue
          for form in ${ATTNQ_FORMS:-split atomic ordered}; do
            r=$(timeout 60 env SOLTRAIN_ATTENTION_BACKWARD=$form "$B/$bin" bench-attention \
              --batch "${shape%x*}" --heads 32 --kv-heads 8 --seq-len "${shape#*x}" 2>&1 | tail -1)
            echo "$shape $bin $form: $(echo "$r" | python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); print("fwd", round(j["fwd_tflops"]), "bwd", round(j["bwd_tflops"]), round(j["bwd_ms"], 2), "ms")' 2>/dev/null || echo "$r")"
          done
        done
      done ;;
    attne2e)  # the backward's forms in whole training steps: Qwen3-0.6B full fine-tuning at 1 x 16384 (attention's
      # share of a step grows with the sequence), split, ordered and atomic (`--attention-backward`)
      for form in split ordered atomic; do
        bench_one "e2e-0.6B-16k-$form" 0.6B --batch-size 1 --seq-len 16384 --recompute selective --steps 5 --warmup 2 \
          --attention-backward $form
        python3 -c "import json,sys; p=json.load(open(sys.argv[1])).get('profile_ms',{}); print('  attention_backward', round(p.get('attention_backward',0),1), 'ms of', round(sum(p.values()),1), 'ms profiled')" "$OUT/e2e-0.6B-16k-$form.json" 2>/dev/null
      done ;;
    attnprof)  # the attention backward's kernels under Nsight Compute at 2 x 8192 (Qwen3-8B heads): each kernel's
      # time for split and atomic, the fused kernel's full section set (stall reasons, pipe use), and the SASS
      NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      echo "ncu: ${NCU:-none}"
      for form in split atomic; do
        timeout 120 env SOLTRAIN_ATTENTION_BACKWARD=$form "$NCU" --metrics gpu__time_duration.sum -k 'regex:dkdv|dq_|attention' \
          "$B/soltrain" bench-attention --batch 2 --heads 32 --kv-heads 8 --seq-len 8192 --iters 1 > "$OUT/attnprof-$form-times.log" 2>&1
        grep -E "^  [a-z_]+.*\(|gpu__time_duration" "$OUT/attnprof-$form-times.log" | sed -E 's/\(CUtensorMap.*//' | tail -24
      done
      timeout 240 env SOLTRAIN_ATTENTION_BACKWARD=atomic "$NCU" --set full --import-source no -k 'regex:dkdv' -c 1 -s 2 \
        -o "$OUT/attnprof-atomic" "$B/soltrain" bench-attention --batch 2 --heads 32 --kv-heads 8 --seq-len 8192 --iters 1 > "$OUT/attnprof-full.log" 2>&1
      "$NCU" --import "$OUT/attnprof-atomic.ncu-rep" --page details > "$OUT/attnprof-atomic-details.txt" 2>&1
      "$NCU" --import "$OUT/attnprof-atomic.ncu-rep" --page raw --csv > "$OUT/attnprof-atomic-raw.csv" 2>&1
      grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Pipe" "$OUT/attnprof-atomic-details.txt" | head -30
      CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
      "$CUOBJ" -sass "$B/soltrain.bin" 2>/dev/null | xz -3 > "$OUT/all.sass.xz"
      ls -la "$OUT" | grep attnprof ;;
    attn)  # issue 12 item 3: the attention table next to torch's flash and cuDNN backends at T = 2k .. 64k (Qwen3-8B heads)
      timeout 400 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes "" --peers none \
        --attention 8x32x8x2048,4x32x8x4096,2x32x8x8192,1x32x8x16384,1x32x8x65536 \
        --attention-engines "${ATTN_ENGINES:-split,split-longest,atomic,ordered,portable}" --out "$OUT" > "$OUT/attn.log" 2>&1
      grep -E "^\| " "$OUT/attn.log" ;;
    peft)
      timeout 300 python3 tests/tools/check_peft.py "$B/soltrain" --cases 12 --cuda > "$OUT/peft.log" 2>&1
      grep -E "CUDA LoRA|^case|failures" "$OUT/peft.log" | tail -40 ;;
    bench)
      timeout 400 python3 bench/run_bench.py --soltrain "$B/soltrain" --baseline "$B/soltrain-before" --sizes 0.6B \
        --variant "fp32 residual=--residual-dtype fp32" \
        --peers eager --attention "" --out "$OUT" > "$OUT/bench.log" 2>&1
      tail -40 "$OUT/bench.log" ;;
    outputs29)  # issue 29 on CUDA: a full fine-tune of a bf16 base saved in bf16 = the fp32 masters rounded; an
      # adapter checkpoint loads in PEFT as saved; serve's n=3 greedy choices (one batch on the GPU) = generate's text
      d=/tmp/out29 && rm -rf $d && mkdir -p $d && (cd $d && "$B/soltrain" demo-setup --out data > /dev/null 2>&1)
      python3 -c "
import json, shutil, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained('$d/data/model', dtype=torch.bfloat16); m.save_pretrained('$d/bf16')
for f in ('tokenizer.json', 'tokenizer_config.json'): shutil.copy('$d/data/model/' + f, '$d/bf16')"
      printf 'model: bf16\ndatasets: [{path: data/train.jsonl, type: conversation}]\ndevice: cuda\nsequence_len: 64\nper_device_train_batch_size: 8\nmax_steps: 6\nsave_steps: 6\nlearning_rate: 1e-3\n' > $d/c.yaml
      (cd $d && "$B/soltrain" sft c.yaml --set output_dir=full > full.log 2>&1 &&
        "$B/soltrain" sft c.yaml --set output_dir=lora --set lora=true --set lora_rank=8 > lora.log 2>&1) || tail -5 $d/*.log
      python3 -c "
import torch, transformers, peft
from safetensors.torch import load_file
saved, masters = load_file('$d/full/model/model.safetensors'), load_file('$d/full/checkpoint-6/model.safetensors')
bad = [n for n, w in masters.items() if saved[n].dtype != torch.bfloat16 or not torch.equal(saved[n], w.to(torch.bfloat16))]
print('outputs29: bf16 save = masters rounded:', 'yes' if not bad else bad[:3])
base = transformers.AutoModelForCausalLM.from_pretrained('$d/bf16', dtype=torch.float32)
ck = peft.PeftModel.from_pretrained(base, '$d/lora/checkpoint-6')
a = load_file('$d/lora/adapter/adapter_model.safetensors')
same = all(torch.equal(w, a[n.replace('.default', '')]) for n, w in ck.state_dict().items() if 'lora_' in n)
print('outputs29: PEFT loads checkpoint-6 as saved, = the final adapter:', same)"
      # (the untrained demo model: its greedy answer is a non-empty string of bytes, where the trained one ends at once)
      "$B/soltrain" serve --model $d/data/model --device cuda --port 0 2> $d/serve.log &
      sp=$!; for i in $(seq 60); do grep -q "/v1 " $d/serve.log && break; sleep 1; done
      url=$(grep -o "http://[0-9.:]*/v1" $d/serve.log | head -1)
      want=$("$B/soltrain" generate --model $d/data/model --device cuda --chat hello --max-new-tokens 12 2>/dev/null)
      python3 -c "
import json, sys, urllib.request
q = urllib.request.Request('$url/chat/completions', json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hello'}], 'max_tokens': 12, 'temperature': 0, 'n': 3}).encode(), {'Content-Type': 'application/json'})
got = [c['message']['content'] for c in json.load(urllib.request.urlopen(q))['choices']]
print('outputs29: serve n=3 on cuda = generate:', got == [sys.argv[1]] * 3 and len(got[0]) > 0, repr(got[0][:40]))" "$want"
      kill $sp; cp $d/*.log "$OUT/" 2>/dev/null ;;
    ckptcuda)  # issue 28 on CUDA: a background checkpoint (host snapshot) holds the bytes a direct one does, and a
      # resume from one finishes bitwise the model of an uninterrupted run
      d=/tmp/ckptcuda && rm -rf $d && mkdir -p $d && (cd $d && "$B/soltrain" demo-setup --out data > /dev/null 2>&1)
      printf 'model: data/model\ndatasets: [{path: data/train.jsonl, type: conversation}]\ndevice: cuda\nsequence_len: 64\nper_device_train_batch_size: 8\nmax_steps: 12\nsave_steps: 4\nlogging_steps: 4\n' > $d/c.yaml
      (cd $d && "$B/soltrain" sft c.yaml --set output_dir=bg > bg.log 2>&1 &&
        "$B/soltrain" sft c.yaml --set output_dir=fg --set background_checkpoints=false > fg.log 2>&1 &&
        "$B/soltrain" sft c.yaml --set output_dir=re > re.log 2>&1 && rm -rf re/checkpoint-8 re/checkpoint-12 re/model &&
        "$B/soltrain" sft c.yaml --set output_dir=re --set resume_from_checkpoint=true > re2.log 2>&1) || tail -5 $d/*.log
      for f in model.safetensors optimizer.safetensors soltrain_state.json; do
        cmp -s $d/bg/checkpoint-8/$f $d/fg/checkpoint-8/$f && echo "ckptcuda: background == direct: $f" || echo "ckptcuda: DIFFER $f"
      done
      cmp -s $d/bg/model/model.safetensors $d/re/model/model.safetensors && echo "ckptcuda: resume bitwise" || echo "ckptcuda: resume DIFFERS"
      grep -h "resuming" $d/re2.log
      # A kill -9 while checkpoint-8 is being written (the seam holds the writer 3 s): checkpoint-4 stays the
      # newest, and the resume from it finishes the uninterrupted run's model bitwise.
      (cd $d && { SOLTRAIN_TEST_SLOW_SAVE_MS=3000 "$B/soltrain" sft c.yaml --set output_dir=kill > kill.log 2>&1 & pid=$!
        for i in $(seq 1 600); do
          if [ -d kill/checkpoint-4 ] && ls -d kill/.checkpoint-8.partial-* > /dev/null 2>&1; then kill -9 $pid; echo "ckptcuda: killed mid-write of checkpoint-8"; break; fi
          sleep 0.05
        done; wait $pid 2>/dev/null
        ls -d kill/checkpoint-* | tr '\n' ' '; echo
        "$B/soltrain" sft c.yaml --set output_dir=kill --set resume_from_checkpoint=true > kill2.log 2>&1; } )
      grep -h "resuming" $d/kill2.log
      cmp -s $d/bg/model/model.safetensors $d/kill/model/model.safetensors && echo "ckptcuda: kill -9 mid-write, resume bitwise" || echo "ckptcuda: kill -9 resume DIFFERS"
      cp $d/*.log "$OUT/" ;;
    ckpt)  # issue 28: the step time with a checkpoint every CKPT_EVERY (10) steps (background, direct) next to
      # none; CKPT_CASES "size kind saves bench-args...;..."; each case's models and checkpoints removed after it
      # (the disk holds 64 GiB: one 4B full checkpoint is 48 GB).
      IFS=';' read -ra cases <<< "${CKPT_CASES:-8B lora 1 --lora-rank 16 --batch-size 2;0.6B full 2 --batch-size 8;4B full 1 --batch-size 2}"
      for c in "${cases[@]}"; do
        set -- $c
        size=$1 kind=$2 saves=$3
        shift 3
        every=${CKPT_EVERY:-10}
        steps=$((every * saves + every))
        for mode in none background direct; do
          rm -rf /tmp/soltrain-bench-checkpoints
          extra=()
          [ $mode != none ] && extra=(--save-steps $every --save-mode $mode)
          BENCH_TIMEOUT=420 bench_one ckpt-$size-$kind-$mode $size --steps $steps --warmup 3 --seq-len 2048 --no-profile "$@" "${extra[@]}"
          python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'median', round(j['step_s'],4), 'mean', round(j['mean_step_s'],4), 's, saves', j['saves'], 'in', round(j['save_s'],2), 's on the training thread')" \
            "$OUT/ckpt-$size-$kind-$mode.json" "ckpt-$size-$kind-$mode" 2>/dev/null
        done
        du -sh /tmp/soltrain-bench-checkpoints 2>/dev/null
        rm -rf /tmp/soltrain-bench-checkpoints /tmp/soltrain-bench-models/$size
      done ;;
    bench8b)
      timeout 550 python3 bench/run_bench.py --soltrain "$B/soltrain" --sizes 8B \
        --variant "data parallel ZeRO-0 (NCCL, 1 rank)=--data-parallel 0" \
        --batch 8B=2 --lora-rank 16 --peers "${PEERS:-eager}" --attention "" --out "$OUT" > "$OUT/bench8b.log" 2>&1
      tail -40 "$OUT/bench8b.log" ;;
  esac
done
echo "== done $(date +%T)"
