#!/usr/bin/env bash
# latentctl tokenize against a reference implementation (@lenml/tokenizers, a port of
# transformers.js, under node) on the same text, side by side: are the ids identical over a whole
# corpus, and how fast is each (MB/s of text, tokenizer loading excluded)?
#
#   mkdir -p /tmp/ref && (cd /tmp/ref && npm install @lenml/tokenizers@3.7.2)
#   scripts/fetch-tokenizers.sh && bazel build -c opt //client:latentctl
#   NODE_PATH=/tmp/ref/node_modules bench/tokenize_bench.sh FILE...
#
# FILEs as latentctl tokenize takes them (.jsonl: a document a line; others: a document each).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${HOME}/.cache/latentd/tokenizers"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bytes=$(cat "$@" | wc -c)
printf "%-8s %-10s %-9s %-16s %-16s %-12s %s\n" TOKENIZER TOKENS IDENTICAL "LATENTCTL 1 THR" \
  "LATENTCTL $(nproc) THR" "REFERENCE" "SPEED-UP (1 THR)"
for entry in "gpt2 <|endoftext|>" "llama2 </s>" "llama3 <|end_of_text|>" "gemma <eos>" \
             "qwen2_5 <|endoftext|>" "gpt4 <|endoftext|>" "gpt4o <|endoftext|>" \
             "deepseek_v3 <｜end▁of▁sentence｜>" "mistral_nemo </s>" "gemma3 <eos>" \
             "llama3_1 <|end_of_text|>"; do
  read -r name separator <<<"$entry"
  line=$(bazel-bin/client/latentctl tokenize "$@" --vocab="$dir/$name/tokenizer.json" \
    --out="$tmp/$name.npy" --separator="$separator" --threads=1 2>/dev/null)
  ours=$(sed -E 's/.* in ([0-9.]+) s .*/\1/' <<<"$line")
  line=$(bazel-bin/client/latentctl tokenize "$@" --vocab="$dir/$name/tokenizer.json" \
    --out="$tmp/$name-all.npy" --separator="$separator" 2>/dev/null)
  all=$(sed -E 's/.* in ([0-9.]+) s .*/\1/' <<<"$line")
  cmp -s "$tmp/$name.npy" "$tmp/$name-all.npy" || echo "$name: the thread counts disagree" >&2
  sep_id=$(/usr/bin/python3 -c "
import json,sys
d=json.load(open('$dir/$name/tokenizer.json'))
print(next(t['id'] for t in d['added_tokens'] if t['content']=='$separator'))")
  ref=$(node bench/tokenize_reference.mjs "$dir/$name" "$sep_id" "$tmp/$name.i32" "$@")
  /usr/bin/python3 - "$tmp/$name.npy" "$tmp/$name.i32" "$name" "$ours" "$ref" "$bytes" "$all" <<'PY'
import sys
import numpy as np
ours = np.load(sys.argv[1]).astype(np.int64)
ref = np.fromfile(sys.argv[2], dtype="<i4").astype(np.int64)
name, t_ours, t_ref, size = sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
t_all = float(sys.argv[7])
same = ours.shape == ref.shape and bool((ours == ref).all())
where = "" if same else " (first difference at %d)" % int(
    np.argmax(ours[:min(len(ours), len(ref))] != ref[:min(len(ours), len(ref))]))
print("%-8s %-10d %-9s %-16s %-16s %-12s %.2fx%s" % (name, len(ref), "yes" if same else "NO",
      "%.2f MB/s" % (size / 1e6 / t_ours), "%.2f MB/s" % (size / 1e6 / t_all),
      "%.2f MB/s" % (size / 1e6 / t_ref), t_ref / t_ours, where))
PY
done
