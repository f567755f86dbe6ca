#!/usr/bin/env bash
# Probes the Python module on the GPU machine (a crash names its place): import orders, then the demo's tiny model
# on CPU and CUDA (logprobs, step) under faulthandler; a crash gets cuda-gdb's native backtrace.
B=$PWD/.devbin
export PYTHONPATH=python SOLTRAIN_BUILD_DIR="$B"
"$B/soltrain" demo-setup --out /tmp/pyprobe --train 50 --validation 10 > /dev/null
probe() {  # name python-code
  echo "== $1"
  timeout 120 python3 -X faulthandler -c "$2" > /tmp/probe.out 2>&1
  local rc=$?
  grep -v "frozen importlib" /tmp/probe.out | head -20
  if [ $rc -ne 0 ]; then
    echo "-- rc $rc; native backtrace:"
    timeout 200 cuda-gdb -batch -ex run -ex bt --args python3 -c "$2" 2>&1 | grep -E "^#|signal" | head -30
  fi
}
probe "soltrain alone" "import soltrain; print('ok')"
probe "numpy then soltrain" "import numpy, soltrain; print('ok')"
probe "soltrain then numpy" "import soltrain, numpy; print('ok')"
for dev in cpu cuda; do
  probe "$dev logprobs and step" "
import soltrain, numpy as np
m = soltrain.Model.from_pretrained('/tmp/pyprobe/model', sequence_len=64, rows=2, device='$dev')
ids = np.random.default_rng(0).integers(0, m.vocab_size, size=(2, 64), dtype=np.int32)
print('logprobs', m.logprobs(ids, np.roll(ids, -1)).ravel()[:3], flush=True)
print('step', m.step(ids, np.roll(ids, -1)), flush=True)"
done
