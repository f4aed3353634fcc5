#!/usr/bin/env bash
# The EXTRACT and TRAIN part of the demo, the loop users run, submitted at once as a pipeline:
# dense hidden states of the built-in reference transformer over 64 x 128 Zipf tokens -> a TopK
# SAE trained on them with sparse M-FAC (its memory against dense M-FAC's, live) -> sparse latents
# of two hooks from one forward pass, a dataset each, with the SAE's fit -> the stored latents
# queried back.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/demo-common.sh
name="demo-$(date +%Y%m%d-%H%M%S)"

echo
echo "demo: the loop as one pipeline, submitted at once; each job waits for the one before and"
echo "takes its dataset or SAE from that job's result when it starts (--bind):"
echo "  1. EXTRACT, DENSE: the hidden states of blocks.2.hook_resid_post"
cat > "$spec" <<JSON
{"model": $model, "hookName": "blocks.2.hook_resid_post", "tokens": $tokens,
 "mode": "DENSE", "datasetName": "$name-dense"}
JSON
dense_job=$($LATENTCTL submit --type=EXTRACT --spec="$spec" --label=demo-dense)
echo "  2. TRAIN: a TopK SAE (4096 latents, k=32) on them, optimizer sparse M-FAC at 1% density"
cat > "$spec" <<JSON
{"sae": {"architecture": "TOPK", "dSae": 4096, "k": 32},
 "optimizer": {"name": "smfac", "lr": 0.006, "window": 16, "density": 0.01},
 "batchSize": 256, "steps": 300, "seed": 1, "telemetryEvery": 50, "artifactName": "$name-sae"}
JSON
train_job=$($LATENTCTL submit --type=TRAIN --spec="$spec" --label=demo-train \
  --bind="train.dataset_id=$dense_job:extract.dataset_id")
echo "  3. EXTRACT, SPARSE: the trained SAE on blocks.2.hook_resid_post, and the same SAE on"
echo "     blocks.1.hook_resid_post from the same forward pass into a second dataset (an SAE on a"
echo "     layer it was not trained on: see its fit), then each SAE's downstream loss"
cat > "$spec" <<JSON
{"model": $model, "hookName": "blocks.2.hook_resid_post", "tokens": $tokens,
 "mode": "SPARSE", "commitRows": 2048, "datasetName": "$name", "downstreamLossSequences": 16,
 "moreOutputs": [{"hookName": "blocks.1.hook_resid_post"}]}
JSON
job=$($LATENTCTL submit --type=EXTRACT --spec="$spec" --label=demo-extract \
  --bind="extract.sae.artifact_id=$train_job:train.artifact_id,extract.more_outputs.0.sae.artifact_id=$train_job:train.artifact_id")
# (Read whole first: `head` closing the pipe early would end latentctl with SIGPIPE, which
# pipefail makes the demo's failure once the daemon has many jobs.)
listed=$($LATENTCTL list --all)
head -4 <<< "$listed"

echo
$LATENTCTL watch "$dense_job" >/dev/null
$LATENTCTL get "$dense_job" | grep '^dataset'
echo
echo "demo: the TRAIN job (each telemetry line: its state in memory against what dense M-FAC's"
echo "history would take)"
$LATENTCTL watch "$train_job" | grep --line-buffered -E 'train step|bound'
$LATENTCTL get "$train_job" | grep -E '^(artifact|final|optimizer)'
$LATENTCTL telemetry "$train_job" --plot="$data_dir/demo-train.png" >/dev/null
echo "(loss and memory against steps: $data_dir/demo-train.png)"
echo
$LATENTCTL watch "$job"
$LATENTCTL get "$job"
dataset=$(result "$job" extract.datasetId)
layer1=$(result "$job" extract.moreOutputs.0.datasetId)
echo
$LATENTCTL datasets
echo
echo "demo: the first 3 rows (latent:value pairs)"
$LATENTCTL rows "$dataset" --count=3
latent=$($LATENTCTL --json rows "$dataset" --count=1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["indices"][0])')
echo
echo "demo: latent $latent"
$LATENTCTL latent "$dataset" "$latent" --top=5 --before=8 --after_tokens=2 --tokens=3 \
  --vocab="$inputs/vocab.json" --html="$data_dir/demo-latent.html"
echo "(open $data_dir/demo-latent.html in a browser: every token shaded by the latent's value)"
echo
echo "demo: what latent $latent's weights say (the tokens its decoder direction raises and lowers"
echo "through the model's unembedding, and its nearest decoder directions)"
$LATENTCTL weights "$dataset" "$latent" --limit=5 --vocab="$inputs/vocab.json"
echo
echo "demo: a dashboard of the 20 most frequent latents"
$LATENTCTL dashboard "$dataset" "$data_dir/demo-dashboard" --order=frequent --limit=20 \
  --intervals=3 --interval_samples=3 --before=12 --after_tokens=4 --vocab="$inputs/vocab.json"
echo "(open $data_dir/demo-dashboard/index.html in a browser)"
echo
echo "demo: a new prompt through the dataset's model and SAE (tokens given as vocabulary texts)"
$LATENTCTL prompt "$dataset" " the" " baba" " of" " the" " moba" "." --limit=5 \
  --vocab="$inputs/vocab.json" --html="$data_dir/demo-dashboard/prompt.html"
echo "(open $data_dir/demo-dashboard/prompt.html: the prompt shaded by each top latent)"
echo
echo "demo: the latents that fire with latent $latent (by count), and on the token \" the\" (by lift)"
$LATENTCTL cofiring "$dataset" "$latent" --limit=5
echo "demo: the latents of the layer-1 dataset most nearly layer-2 latent $latent (by F1: they fire"
echo "where it fires, FRACTION, and little elsewhere, PRECISION)"
$LATENTCTL cofiring "$dataset" "$latent" --in_dataset="$layer1" --rank=f1 --limit=5
$LATENTCTL cofiring "$dataset" "$latent" --in_dataset="$layer1" --rank=f1 --limit=200 \
  --plot="$data_dir/demo-detectors.png" | tail -n 1
echo "(open $data_dir/demo-detectors.png: each layer-1 latent at its FRACTION and PRECISION)"
$LATENTCTL token "$dataset" " the" --vocab="$inputs/vocab.json" --rank=lift --min_count=20 --limit=5
echo "demo: rows you label, from a file (here latent $latent's firing rows among the first 4096),"
echo "against others (all of the first 4096): the latents that tell them apart"
$LATENTCTL firings "$dataset" "$latent" --count=4096 2>/dev/null | cut -d' ' -f1 >"$data_dir/labelled-rows.txt"
$LATENTCTL onrows "$dataset" --rows_file="$data_dir/labelled-rows.txt" --versus=0:4096 \
  --rank=difference --limit=5 --max_rows=4096
echo "demo: k-sparse probing: how well k layer-1 latents predict where layer-2 latent $latent"
echo "fires (those rows against the rest of the first 4096, a quarter of each held out; the rare"
echo "class weighed up, --balanced)"
awk -v rows=4096 'NR == FNR { fires[$1] = 1; next }
  END { for (r = 0; r < rows; ++r) if (!(r in fires)) print r }' \
  "$data_dir/labelled-rows.txt" /dev/null >"$data_dir/unlabelled-rows.txt"
$LATENTCTL probe "$layer1" --rows_file="$data_dir/labelled-rows.txt" \
  --versus_file="$data_dir/unlabelled-rows.txt" --ks=1,2,5,10 --balanced \
  --plot="$data_dir/demo-probe.png"
echo "(open $data_dir/demo-probe.png: held-out accuracy and F1 against k)"
echo
echo "demo: latent $latent's decoder direction on the DENSE hidden states the SAE was trained on"
echo "(cosine, a row per sequence): where the direction shows in the raw activations, whether"
echo "the SAE fires there or not"
dense=$(result "$dense_job" extract.datasetId)
$LATENTCTL project "$dense" --latent="$dataset:$latent" --cosine --distinct --top=3 --before=6 \
  --after_tokens=1 --vocab="$inputs/vocab.json" --plot="$data_dir/demo-projection.png"
echo "(open $data_dir/demo-projection.png: the cosine's histogram over the rows)"
echo
echo "demo: the SAE at a glance (most frequent latents; --plot=FILE.png draws the density histogram)"
$LATENTCTL latents "$dataset" --order=frequent --limit=5
