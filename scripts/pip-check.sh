#!/usr/bin/env bash
# CI's packaging check: `pip install .` into a fresh virtual environment (scikit-build-core + nanobind from PyPI,
# the C++ core built with CMake; the CPU backend where nvcc has no cuBLAS beside it), then `import soltrain` and
# the installed `soltrain` command there. About 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check .
(cd "$venv" && bin/python -c "import soltrain; print('pip-check: import soltrain from', soltrain.__file__)")
"$venv/bin/soltrain" config-keys > /dev/null
echo "pip-check: pip install . gives the package and the soltrain command"
