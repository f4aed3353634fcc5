# What the demo's parts share, sourced by each (not run): the latentctl binary, the data
# directory and the demo inputs in it (written on first use), a temporary spec file, the model
# and token specs, and result JOB FIELD, the value of FIELD (a.b.c) in job JOB's result.
LATENTCTL=${LATENTCTL:-bazel-bin/client/latentctl}
data_dir=${LATENTD_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/latentd}
inputs="$data_dir/demo-inputs"
[[ -f "$inputs/vocab.json" ]] || /usr/bin/python3 scripts/make_demo_inputs.py "$inputs" --sequences 64
spec=$(mktemp --suffix=.json)
trap 'rm -f "$spec"' EXIT
model='{"reference": {"dModel": 256, "nLayers": 4, "nHeads": 4, "dMlp": 1024, "vocabSize": 4096,
                      "contextLength": 128, "seed": 0}}'
tokens="{\"path\": \"$inputs/tokens.npy\", \"contextLength\": 128}"
result() {
  $LATENTCTL --json get "$1" |
    /usr/bin/python3 -c 'import json,sys; v=json.load(sys.stdin)["result"]
for k in sys.argv[1].split("."): v=v[int(k)] if k.isdigit() else v[k]
print(v)' "$2"
}
