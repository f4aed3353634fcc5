#!/usr/bin/env bash
# The EXTRACT part of the demo: a small X1-style run of the built-in reference transformer with a
# TopK SAE over 64 x 128 Zipf tokens (two hooks from one forward pass, a dataset each), then the
# stored latents queried back.
set -euo pipefail
cd "$(dirname "$0")/.."
LATENTCTL=${LATENTCTL:-bazel-bin/client/latentctl}
data_dir=${LATENTD_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/latentd}
inputs="$data_dir/demo-inputs"
[[ -f "$inputs/vocab.json" ]] || /usr/bin/python3 scripts/make_demo_inputs.py "$inputs" --sequences 64
name="demo-$(date +%Y%m%d-%H%M%S)"
spec=$(mktemp --suffix=.json)
cat > "$spec" <<JSON
{
  "model": {"reference": {"dModel": 256, "nLayers": 4, "nHeads": 4, "dMlp": 1024,
                          "vocabSize": 4096, "contextLength": 128, "seed": 0}},
  "hookName": "blocks.2.hook_resid_post",
  "tokens": {"path": "$inputs/tokens.npy", "contextLength": 128},
  "sae": {"path": "$inputs/sae"},
  "mode": "SPARSE",
  "commitRows": 2048,
  "datasetName": "$name",
  "moreOutputs": [{"hookName": "blocks.1.hook_resid_post", "sae": {"path": "$inputs/sae"}}]
}
JSON
echo
echo "demo: EXTRACT job (reference transformer, TopK SAE k=32 on blocks.2.hook_resid_post, and on"
echo "blocks.1.hook_resid_post from the same forward pass into a second dataset)"
job=$($LATENTCTL submit --type=EXTRACT --spec="$spec" --label=demo-extract)
rm -f "$spec"
$LATENTCTL watch "$job"
$LATENTCTL get "$job"
read -r dataset layer1 < <($LATENTCTL --json get "$job" | /usr/bin/python3 -c 'import json,sys; e=json.load(sys.stdin)["result"]["extract"]; print(e["datasetId"], e["moreOutputs"][0]["datasetId"])')
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
echo "demo: the latents of the layer-1 dataset that fire where layer-2 latent $latent fires"
$LATENTCTL cofiring "$dataset" "$latent" --in_dataset="$layer1" --rank=lift --min_count=5 --limit=5
$LATENTCTL token "$dataset" " the" --vocab="$inputs/vocab.json" --rank=lift --min_count=20 --limit=5
echo
echo "demo: the SAE at a glance (most frequent latents; --plot=FILE.png draws the density histogram)"
$LATENTCTL latents "$dataset" --order=frequent --limit=5
