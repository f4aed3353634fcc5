#!/usr/bin/env bash
# The model-diffing part of the demo. A base model and its fine-tune are stood in for by the
# reference transformer's residual stream after block 0 and after block 3 (the second is the
# first plus what blocks 1-3 write, as a fine-tune adds to its base): both stored DENSE over the
# demo's tokens; a crosscoder trained on the pair; the pair encoded with it into one dataset;
# then latent scaling's test of the latents that lean to the second side.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
name="demo-diff-$(date +%Y%m%d-%H%M%S)"

echo
echo "demo: model diffing. 1. blocks.0 and blocks.3.hook_resid_post of the reference model, DENSE"
ids=()
for hook in blocks.0.hook_resid_post blocks.3.hook_resid_post; do
  cat > "$spec" <<JSON
{"model": $model, "hookName": "$hook", "tokens": $tokens, "mode": "DENSE", "datasetName": "$name-$hook"}
JSON
  job=$($LATENTCTL submit --type=EXTRACT --spec="$spec" --label=demo-diff-dense)
  $LATENTCTL watch "$job" >/dev/null
  ids+=("$(result "$job" extract.datasetId)")
done
echo "   datasets ${ids[0]} and ${ids[1]}"
echo "demo: 2. TRAIN a BatchTopK crosscoder (2048 latents, k=32) on the pair"
cat > "$spec" <<JSON
{"crosscoderDatasetIds": ["${ids[0]}", "${ids[1]}"], "sae": {"dSae": 2048, "k": 32},
 "optimizer": {"name": "adam", "lr": 0.003}, "batchSize": 256, "steps": 300, "seed": 1,
 "telemetryEvery": 100, "artifactName": "$name-crosscoder"}
JSON
train_job=$($LATENTCTL submit --type=TRAIN --spec="$spec" --label=demo-diff-train)
$LATENTCTL watch "$train_job" >/dev/null
$LATENTCTL get "$train_job" | grep -E '^(sources|latents|relative)'
echo "demo: 3. EXTRACT the pair's latents with it (no model runs: the stored rows side by side)"
cat > "$spec" <<JSON
{"model": {"stored": {"datasetIds": ["${ids[0]}", "${ids[1]}"]}},
 "sae": {"artifactId": "$(result "$train_job" train.artifactId)"}, "datasetName": "$name"}
JSON
job=$($LATENTCTL submit --type=EXTRACT --spec="$spec" --label=demo-diff-extract)
$LATENTCTL watch "$job" >/dev/null
diff=$(result "$job" extract.datasetId)
echo
echo "demo: are the latents that lean to the second side really its own? Latent scaling (the"
echo "first side's error and other latents fitted along each one's direction; the 10 leaning most)"
$LATENTCTL scaling "$diff" --limit=10 --min_share=0.6 --plot="$data_dir/demo-scaling.png"
echo "(each latent at its two ratios: $data_dir/demo-scaling.png)"
