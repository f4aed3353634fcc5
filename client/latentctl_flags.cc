// latentctl's flags: their defaults and help texts (declared in latentctl_flags.h).
#include "client/latentctl_flags.h"

#include <limits>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "latentd address");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token");
ABSL_FLAG(bool, json, false, "print responses in the protobuf JSON mapping");
ABSL_FLAG(std::string, type, "", "submit: PROBE, EXTRACT or TRAIN");
ABSL_FLAG(std::string, spec, "", "submit: JSON file with a JobSpec or the type's spec");
ABSL_FLAG(std::string, request_id, "",
          "submit: idempotency key (the same key returns the same job)");
ABSL_FLAG(int, num_devices, 0, "submit: devices the job needs (default: the spec's, else 1)");
ABSL_FLAG(int, priority, 0, "submit: higher runs first");
ABSL_FLAG(std::string, label, "", "submit: a label shown by list; list: only jobs with this label");
ABSL_FLAG(std::string, state, "", "list: only jobs in this state");
ABSL_FLAG(int, page_size, 50, "list: jobs per page");
ABSL_FLAG(bool, all, false, "list: follow page tokens to the end");
ABSL_FLAG(int64_t, after, 0, "watch: resume after this event sequence number");
ABSL_FLAG(std::string, after_jobs, "",
          "submit: comma-separated jobs that must succeed before this one starts (a pipeline)");
ABSL_FLAG(bool, watch, false, "pipeline, export --job: follow the jobs until they end");
ABSL_FLAG(bool, job, false,
          "export: submit an EXPORT job (progress on watch, cancel, pipelines) instead of "
          "waiting for the export");
ABSL_FLAG(std::string, bind, "",
          "submit: FIELD=JOB:OUTPUT[,...]: fill a field of this spec from a job's result when it "
          "starts, e.g. train.dataset_id=5:extract.dataset_id (JOB joins --after_jobs)");
ABSL_FLAG(int64_t, start, 0, "rows/export/firings: first row");
ABSL_FLAG(int64_t, count, 0, "rows/export/firings: number of rows (0: to the end; rows: 10)");
ABSL_FLAG(int, top, 20, "latent, dashboard: top activations to show");
ABSL_FLAG(int, before, 32, "latent, dashboard: context tokens before");
ABSL_FLAG(int, after_tokens, 8, "latent, dashboard: context tokens after");
ABSL_FLAG(int, intervals, 0,
          "latent, dashboard: also sample rows from this many equal intervals of the value range");
ABSL_FLAG(int, interval_samples, 5, "latent, dashboard: rows per interval (with --intervals)");
ABSL_FLAG(int, tokens, 0,
          "latent: also the tokens the latent fires on most, this many (dashboard: default 10)");
ABSL_FLAG(bool, positions, false,
          "latent: also where in its sequences the latent fires (dashboard: always, when the "
          "dataset has sequences)");
ABSL_FLAG(bool, distinct, false,
          "latent, dashboard: top sequences (one row each, its maximum) instead of top rows");
ABSL_FLAG(std::string, vocab, "",
          "latent, rows, token, dashboard, weights, prompt: show tokens as text, decoded with this "
          "tokenizer.json, "
          "vocab.json, JSON list "
          "or one-token-a-line file");
ABSL_FLAG(std::string, html, "",
          "latent, prompt, steer, attribute: also write an HTML page here (prompt: the prompt "
          "shaded by each top latent; steer: the loss change per token, both runs' predictions "
          "and continuations, a sweep's KL plot; attribute: the prompt shaded by position and "
          "by each top latent); latent: statistics, histogram, every example's tokens "
          "shaded by the latent's value on them");
ABSL_FLAG(int, per_hook, 4, "graph: latents kept per hook (at most 64)");
ABSL_FLAG(int, ablate, 0,
          "attribute: also take each of the top N entries (at most 64) out of a run of its own "
          "and measure the metric's change beside its first-order credit; graph: N > 0 does so "
          "for the output's kept parents");
ABSL_FLAG(std::string, dot, "", "graph: also write the graph as Graphviz DOT here");
ABSL_FLAG(double, min_importance, 0,
          "graph: keep no node carrying less than this share of the output (0 to 1)");
ABSL_FLAG(double, node_threshold, 0,
          "graph: each hook keeps the fewest nodes (at most --per_hook) carrying this share of "
          "what its latents carry, e.g. 0.8 (0 or 1: --per_hook alone)");
ABSL_FLAG(std::string, node_links, "",
          "graph: link each latent of the --html page (and the --dot file) to its page, this "
          "pattern with {dataset} and {latent} replaced, e.g. board-{dataset}/latent-{latent}.html "
          "for the pages `latentctl dashboard` writes");
ABSL_FLAG(bool, node_pages, false,
          "graph: with --html=F.html, also write each latent's page (as a dashboard's) to "
          "F-pages/DATASET/latent-J.html and link its node there");
ABSL_FLAG(int, node_tokens, 3,
          "graph: label each latent with the tokens it fires on most over its dataset, this "
          "many (0: no labels)");
ABSL_FLAG(std::string, layers, "",
          "graph: the datasets of the graph's hooks, comma-separated, in any order (the forward's "
          "is used; default: the dataset's suite up to its hook, one dataset per hook)");
ABSL_FLAG(std::string, target_latent, "",
          "attribute: DATASET:LATENT@POSITION: explain that latent's value at that prompt position "
          "(an SAE on a later hook of the same model) instead of the next token: which latents "
          "upstream drive it");
ABSL_FLAG(std::string, unembedding, "",
          "weights, latent --html, dashboard: the TorchScript model's unembedding parameter "
          "(default: lm_head.weight and the other usual names)");
ABSL_FLAG(std::string, format, "npz", "export: npz, hdf5, parquet or delphi");
ABSL_FLAG(int32_t, splits, 0,
          "export --format=delphi: files per hook, each a range of latents (0: delphi's 5)");
ABSL_FLAG(bool, dry_run, false,
          "submit, pipeline, export --job: check the spec as a submit does and print what its job "
          "would do (tokens and "
          "rows, model, each dataset's hook and how its SAE is read, disk and memory) without "
          "creating it");
ABSL_FLAG(std::string, plot, "",
          "telemetry: write a PNG of loss and memory against steps here; latents: a PNG of the "
          "log10 feature-density histogram; scaling: a PNG of each latent's two ratios; "
          "onrows --versus: a PNG of each latent's fraction on both row sets; cofiring, token, "
          "onrows: a PNG of each latent's precision against its fraction (recall); probe: a PNG of "
          "held-out accuracy and F1 against k");
ABSL_FLAG(std::string, order, "latent",
          "latents, dashboard: latent, frequent, rare (dead first), max or mean (ties by latent "
          "index)");
ABSL_FLAG(
    int, limit, 20,
    "latents, dashboard, cofiring, token, onrows: latents to show; weights: neighbours and logits; "
    "prompt: top latents over the prompt; compare: the latents matched worst; scaling: "
    "own latents fitted when none is named");
ABSL_FLAG(int64_t, sample, 0,
          "compare: compare this many of the first SAE's latents, evenly spread (0: all)");
ABSL_FLAG(int64_t, offset, 0, "latents, dashboard: skip this many in the order");
ABSL_FLAG(int64_t, min_count, 0,
          "latents: only latents firing at least this often; cofiring/token/onrows: at least this "
          "often on the rows read (default 1)");
ABSL_FLAG(int32_t, silent, 0,
          "latent, dashboard, examples: also this many windows where the latent never fires, "
          "drawn at random (reproducibly), to read its examples against");
ABSL_FLAG(bool, all_hooks, false,
          "prompt, attribute, probe: also through the other hooks (and SAEs) of the dataset's "
          "EXTRACT job, and other jobs' over the same tokens and model (a suite extracted a job "
          "per layer)");
ABSL_FLAG(uint64_t, in_dataset, 0,
          "cofiring/token/onrows: count the latents of this dataset on the selected rows (another "
          "output of the same EXTRACT job, or a dataset over the same tokens)");
ABSL_FLAG(std::string, rank, "count",
          "cofiring/token/onrows: count (firings on the rows), lift (their rate there over the "
          "latent's density), f1 (the latent as a detector of the rows: fraction there and share "
          "of its firings there, harmonic mean) or, with --versus, difference (fraction there "
          "minus fraction on the versus rows)");
ABSL_FLAG(int64_t, max_rows, 0,
          "cofiring/token/onrows: count at most this many of the selected rows (from chunks spread "
          "over the dataset; default 2048); scaling: firing rows fitted per latent (default "
          "16384); probe: rows of both classes (default 2^20)");
ABSL_FLAG(std::string, rows_file, "",
          "onrows, probe: a file of rows (ROW or START:COUNT items, whitespace or commas between "
          "them)");
ABSL_FLAG(std::string, versus, "",
          "onrows: rows to contrast the named rows with (ROW or START:COUNT items): each latent's "
          "fraction there too, and --rank=difference; probe: the negatives");
ABSL_FLAG(std::string, versus_file, "",
          "onrows, probe: a file of rows to contrast with, as --rows_file");
ABSL_FLAG(
    bool, sequences, false,
    "onrows, probe: the items, --rows_file, --versus and --versus_file name sequences (SEQ or "
    "START:COUNT of them: the documents you labelled), each the dataset's context_length "
    "rows");
ABSL_FLAG(std::string, text, "",
          "prompt: the prompt as text, tokenized with --vocab=tokenizer.json (instead of token "
          "ids); explain ID J: the explanation of latent J");
ABSL_FLAG(std::string, out, "", "tokenize: the .npy token stream to write");
ABSL_FLAG(std::string, separator, "",
          "tokenize: a token appended after each document (an id, or its text: \"<|endoftext|>\")");
ABSL_FLAG(bool, special_tokens, true,
          "tokenize: add the tokenizer's special tokens around each document (the BOS of Llama "
          "and Gemma), as tokenizer(text) does");
ABSL_FLAG(std::string, field, "text",
          "tokenize: the field of each .jsonl line, or the column of a .parquet file, holding the "
          "text");
ABSL_FLAG(int, threads, 0, "tokenize: threads that tokenize (0: one per core)");
ABSL_FLAG(std::string, nodes, "",
          "train-nodes: the latentd nodes to train on, HOST:PORT,HOST:PORT,... (the first hosts "
          "rank 0)");
ABSL_FLAG(std::string, node_devices, "",
          "train-nodes: devices per node, N,N,... in --nodes' order (default: --num_devices, "
          "else the spec's, on every node)");
ABSL_FLAG(std::string, dataset, "",
          "train-nodes: the DENSE dataset by name, looked up on each node (its id may differ "
          "from node to node); default: the spec's dataset_id everywhere");
ABSL_FLAG(std::string, rendezvous, "",
          "train-nodes: HOST:PORT where rank 0's node hosts the TCPStore (default: the first "
          "node's host, port 29500)");
ABSL_FLAG(std::string, intervene, "",
          "steer: LATENT:set=V, LATENT:add=V or LATENT:scale=V, each optionally @P+P+... "
          "(positions; default every position), comma-separated");
ABSL_FLAG(std::string, more_interventions, "",
          "steer: latents of other datasets of the same model changed in the same steered run, "
          "DATASET=ITEMS;DATASET=ITEMS with --intervene's ITEMS, e.g. 3=40:set=0@3;4=12:add=4");
ABSL_FLAG(int, new_tokens, 20, "steer: tokens each run generates after the prompt");
ABSL_FLAG(float, temperature, 0, "steer: 0 greedy; > 0 sampled (the same draws for both runs)");
ABSL_FLAG(uint64_t, seed, 0, "steer: the sampling seed; probe: the train/test split's seed");
ABSL_FLAG(std::string, source, "",
          "explain: who wrote the explanations (\"human\", a model's name), where they name none "
          "(default: human for --text, delphi for a delphi directory)");
ABSL_FLAG(double, score, std::numeric_limits<double>::quiet_NaN(),
          "explain --text: the explanation's score (none by default)");
ABSL_FLAG(bool, replace_all, false,
          "explain: the dataset's earlier explanations are removed (in the same write)");
ABSL_FLAG(std::string, latent, "",
          "project: D:J, the direction is latent J's decoder row in dataset D's SAE (instead of a "
          "file)");
ABSL_FLAG(bool, cosine, false,
          "project: rank rows by the cosine of their hidden state with the direction, not the "
          "dot product (rows of outsized norm, often the first token's, then rank like any "
          "other)");
ABSL_FLAG(uint64_t, from_dataset, 0,
          "explain ID --from_dataset=D: copy dataset D's explanations (D must be of the same "
          "SAE: the same tokens' re-extraction, or others')");
ABSL_FLAG(std::string, module, "",
          "explain DIR: the delphi module whose latents are read where the run covers several "
          "(default: the one named as the dataset's hook, as latentctl's delphi export names "
          "them)");
ABSL_FLAG(std::string, scores, "",
          "explain DIR: the delphi scorer (under the run's scores/) or the directory whose "
          "verdicts score the explanations, by balanced accuracy (default: detection, else "
          "fuzz, where the run has them)");
ABSL_FLAG(bool, balanced, false,
          "probe: weigh each class by n / (2 n_class) in the fit, so that a rare label counts as "
          "much as the rest");
ABSL_FLAG(std::string, ks, "1,2,5,10,20", "probe: the probe sizes (latents read), comma-separated");
ABSL_FLAG(double, test_fraction, 0.25,
          "probe: the share of each class's ranges (or, pooled, sequences) held out");
ABSL_FLAG(double, l2, 1.0,
          "probe: the L2 penalty on the standardized weights (scikit-learn's 1 / C)");
ABSL_FLAG(std::string, pool, "",
          "probe --sequences: mean or max: each sequence one example, its latent values pooled "
          "over its rows (SAEBench's document probes)");
ABSL_FLAG(std::string, select, "fraction",
          "probe: choose the latents by the difference, either sign, of the shares of rows they "
          "fire on (fraction) or of their mean values (mean, SAEBench's rule) between the "
          "classes' train examples");
ABSL_FLAG(std::string, sweep, "",
          "steer: values of the first --intervene item, comma-separated: a run for each");
ABSL_FLAG(int, crosscoder_source, -1,
          "steer, attribute, graph: for a crosscoder over several models (model diffing), the "
          "model to steer or credit: its source, 0 for the first of the datasets it was trained "
          "on (the others run beside it; a graph's other datasets are that model's); scaling: the "
          "model the latents are said to be specific to "
          "(default: the last)");
ABSL_FLAG(double, min_share, -1,
          "scaling: with no latents named, those whose block in --crosscoder_source's model holds "
          "at least this share of the decoder norm (default 0.9: its own)");
ABSL_FLAG(int, baseline, -1,
          "scaling: the model compared with --crosscoder_source's (default: source 0, or 1 when "
          "that is 0)");
ABSL_FLAG(std::string, target, "",
          "attribute: the next token explained (an id, or its text with --vocab; default: the "
          "model's most likely)");
ABSL_FLAG(std::string, contrast, "",
          "attribute: explain logit(target) - logit(this token) instead of log p(target)");
ABSL_FLAG(int64_t, max_count, -1,
          "latents: only latents firing at most this often (-1: no bound; 0: the dead ones)");
