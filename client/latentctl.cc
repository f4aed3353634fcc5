// latentctl: the command-line client of latentd.
//
//   latentctl [--server=HOST:PORT] [--token_file=F] [--json] COMMAND [ARGS]
//
// This file holds the help text and picks the command; the commands live in job_commands.h
// (jobs and devices), dataset_commands.h (the store's datasets and artifacts) and
// model_commands.h (a dataset's model run on a new prompt), what they share in cli.h, the flags
// in latentctl_flags.h. `tokenize` is here: it runs locally, without a daemon. With --json every
// response is printed in the protobuf JSON mapping, one object per line (streams: one per
// message). Exit status: 0 on success; 1 on an RPC error (the gRPC code and message go to
// stderr); 2 on a usage error; `watch` returns 3 when the job ends other than SUCCEEDED.

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/dataset_commands.h"
#include "client/job_commands.h"
#include "client/latentctl_flags.h"
#include "client/model_commands.h"
#include "client/tokenize_files.h"
#include "client/tokenizer.h"

namespace latentd::client::cli {
namespace {

// latentctl tokenize FILE... --vocab=tokenizer.json --out=tokens.npy: text -> a token stream.
int Tokenize(const std::vector<std::string>& args) {
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string path = absl::GetFlag(FLAGS_vocab);
  if (args.size() < 2 || out.empty() || path.empty()) {
    return Usage("tokenize needs input files, --vocab=tokenizer.json and --out=FILE.npy");
  }
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path);
  if (!tokenizer.ok()) return Usage(absl::StrCat("--vocab: ", tokenizer.status().message()));
  TokenizeOptions options;
  options.out_path = out;
  options.add_special_tokens = absl::GetFlag(FLAGS_special_tokens);
  options.text_field = absl::GetFlag(FLAGS_field);
  options.threads = absl::GetFlag(FLAGS_threads);
  if (const std::string separator = absl::GetFlag(FLAGS_separator); !separator.empty()) {
    int32_t id;
    std::optional<int32_t> found = absl::SimpleAtoi(separator, &id) ? std::optional<int32_t>(id)
                                                                    : tokenizer->TokenId(separator);
    if (!found) {
      return Usage(absl::StrCat("--separator: \"", separator, "\" is not a token of ", path));
    }
    options.separator = found;
  }
  const auto mb = [](int64_t bytes) { return static_cast<double>(bytes) / 1e6; };
  options.progress = [&mb](const TokenizeProgress& p) {
    std::fprintf(stderr,
                 "tokenize: %.1f of %.1f MB read, %lld documents, %lld tokens, %.2f MB/s of text\n",
                 mb(p.bytes_read), mb(p.bytes_total), static_cast<long long>(p.documents),
                 static_cast<long long>(p.tokens), mb(p.text_bytes) / std::max(p.seconds, 1e-9));
  };
  const std::vector<std::string> inputs(args.begin() + 1, args.end());
  absl::StatusOr<TokenizeProgress> done = TokenizeFiles(*tokenizer, inputs, options);
  if (!done.ok()) {
    std::fprintf(stderr, "latentctl: %s\n", done.status().ToString().c_str());
    return done.status().code() == absl::StatusCode::kInvalidArgument ||
                   done.status().code() == absl::StatusCode::kNotFound
               ? kExitUsage
               : kExitRpcError;
  }
  std::printf(
      "wrote %s: %lld tokens (%s) from %lld documents, %.1f MB of text in %.1f s (%.2f MB/s, "
      "%.2f bytes a token)\n",
      out.c_str(), static_cast<long long>(done->tokens), done->dtype.c_str(),
      static_cast<long long>(done->documents), mb(done->text_bytes), done->seconds,
      mb(done->text_bytes) / std::max(done->seconds, 1e-9),
      static_cast<double>(done->text_bytes) / std::max<int64_t>(done->tokens, 1));
  return 0;
}

constexpr char kHelp[] = R"(latentctl [--server=HOST:PORT] [--token_file=F] [--json] COMMAND
jobs:
  submit --type=PROBE|EXTRACT|TRAIN|EXPORT [--spec=FILE.json] [--request_id=ID]
         [--num_devices=N] [--priority=P] [--label=L]     prints the job id
         [--after_jobs=ID,...]   start only once these jobs have succeeded (a pipeline)
         [--bind=FIELD=ID:OUTPUT,...]   take a value of a job's result when this one starts:
                                 --bind=train.dataset_id=5:extract.dataset_id
         [--dry_run]             instead: the checks, and what the job would do, no job
  pipeline FILE.json [--dry_run] [--watch]
                                 submits an experiment's jobs from one file, each waiting for
                                 and taking values from jobs before it by name ("bind":
                                 {"train.dataset_id": "dense:extract.dataset_id"}); --watch
                                 follows them to their ends (exit 3 unless all SUCCEEDED)
  get ID                         one job
  list [--state=S] [--type=T] [--label=L] [--page_size=N] [--all]   newest first
  watch ID [--after=SEQ]         events until the job ends (exit 3 unless it SUCCEEDED)
  cancel ID
  delete-job ID                  forget a finished job (record, events, a TRAIN checkpoint)
  telemetry ID [--plot=FILE.png] training telemetry as a table (and a plot)
  train-nodes --nodes=H:P,H:P,... --spec=train.json [--dataset=NAME] [--rendezvous=H:P]
              [--num_devices=N | --node_devices=N,N,...]
                                 one TRAIN run over several latentd nodes (N devices each, or
                                 each node its own count): submits it to each with its ranks
                                 (and its id of dataset NAME), follows rank 0's progress,
                                 prints every node's result
text:
  tokenize FILE... --vocab=tokenizer.json --out=TOKENS.npy [--separator=TOKEN]
           [--special_tokens=false] [--field=text] [--threads=N]
                                 text -> the token stream an EXTRACT job reads: each .jsonl
                                 line's "text" (--field; also .jsonl.zst, .json.gz: the Pile,
                                 C4, Dolma as downloaded), each row of a .parquet or .arrow
                                 file's "text" column (FineWeb and the Hub's other text
                                 datasets; datasets' save_to_disk) or each other file is a
                                 document,
                                 tokenized as Hugging Face's tokenizer(text) does (BPE
                                 tokenizer.json files: GPT-2, Llama, Mistral, Gemma, Qwen2,
                                 Pythia), with TOKEN (id or text) after each
  devices                        devices and who holds them
datasets:
  datasets                       list
  dataset ID                     metadata and summary
  rows ID [--start=R] [--count=N] [--vocab=F]  CSR rows with token ids (--vocab: and text)
  latent ID J [--top=N] [--before=B] [--after_tokens=A] [--intervals=I [--interval_samples=S]]
              [--silent=N] [--distinct] [--tokens=N] [--positions] [--vocab=tokenizer.json]
              [--html=FILE.html]
                                 statistics, top activations (--distinct: one per sequence),
                                 interval samples, the N tokens it fires on most, where in
                                 its sequences it fires, N windows where it is silent; --vocab
                                 shows text, --html a page where each token is shaded by the
                                 latent's value on it
  firings ID J [--start=R] [--count=N] [--vocab=F]
                                 every row where latent J fires, with its value (and with
                                 --vocab its token; latent-major: reads the latent's runs only)
  latents ID [--order=latent|frequent|rare|max|mean] [--limit=N] [--offset=N]
             [--min_count=C] [--max_count=C] [--plot=FILE.png]
                                 the SAE at a glance: latents ranked, dead count, density plot
  dashboard ID DIR [--order=...] [--limit=N] [--offset=N] [--min_count=C] [--max_count=C]
                 [--vocab=F] [--top=N] [--intervals=I] [--silent=N] [--distinct]
                                 a static HTML dashboard: DIR/index.html (density histogram,
                                 the listed latents and their top tokens) and a page per
                                 latent (examples shaded by value, interval samples, tokens,
                                 positions, the latents it fires with (and those of the
                                 job's other hooks' datasets), its direct logits and decoder
                                 neighbours)
  examples ID FILE.jsonl [--order=...] [--limit=N] [--offset=N] [--top=N] [--intervals=I]
                        [--silent=N] [--distinct] [--before=B] [--after_tokens=A] [--vocab=F]
                                 one JSON line per latent (stats, top examples, interval
                                 samples, silent windows; token ids, values and with --vocab
                                 each token's text): the input of auto-interpretation
  weights ID J [--limit=N] [--vocab=F] [--unembedding=NAME]
                                 from the SAE and model that made the dataset: the tokens the
                                 latent's decoder direction raises and lowers most (direct
                                 logits) and the latents with the nearest decoder directions
  prompt ID T1 T2 ... [--vocab=F] [--limit=N] [--html=FILE.html] [--all_hooks]
  prompt ID --text="..." --vocab=tokenizer.json [...]
                                 the latents a new prompt gets from the dataset's model and
                                 SAE: each token's largest, and the prompt's N top latents
                                 (tokens: ids, or with --vocab each one's text; --text: the
                                 prompt as text, tokenized as the model's tokenizer does); --html: a
                                 page shading the prompt by each top latent (written into a
                                 dashboard directory, latents link to their pages);
                                 --all_hooks: also each other hook of the dataset's job
                                 (and of other jobs over the same tokens and model)
  steer ID T1 T2 ... --intervene=J:set=V|J:add=V|J:scale=V[@P+P...][,...] [--new_tokens=N]
        [--temperature=T --seed=S] [--sweep=V,V,...] [--limit=N] [--vocab=F] [--html=FILE.html]
        [--crosscoder_source=S]
  steer ID --text="..." --vocab=tokenizer.json --intervene=... [...]
                                 the prompt through the dataset's model with latents changed
                                 where the SAE's decoder writes (set 0: ablate; add: steer
                                 along the decoder direction; scale), beside the model as it
                                 is: the next token's N top predictions of both, the KL and
                                 the tokens that rose and fell most, the prompt's loss, and
                                 both runs continued N tokens (default 20); --sweep: a run
                                 for each value of the first intervention, a line each;
                                 --html: a page shading the prompt by the loss change, the
                                 runs side by side, the sweep's KL plotted against the value;
                                 --crosscoder_source=S: a model-diffing crosscoder's latents
                                 changed in model S (0: the first dataset's) along the
                                 direction it learned for that model, the other models run
                                 beside it for their values
  attribute ID T1 T2 ... [--target=T [--contrast=T] | --target_latent=D:J@P] [--limit=N]
            [--ablate=N] [--vocab=F] [--html=FILE.html] [--all_hooks] [--crosscoder_source=S]
  attribute ID --text="..." --vocab=tokenizer.json [...]
                                 which latents, where in the prompt, drive the prediction of
                                 the next token (log p(T), or logit(T) - logit(contrast)):
                                 attribution patching through the SAE, one forward and one
                                 backward pass; each latent's first-order effect, the SAE
                                 error term's, per position, and the top N; --html: a page
                                 shading the prompt by position and by each top latent;
                                 --all_hooks: a line per other hook of the suite;
                                 --target_latent=D:J@P: explain latent J of dataset D (a
                                 later hook of the same model) at position P instead: the
                                 edges of a sparse feature circuit; --ablate=N: the top N
                                 entries each taken out of a run, the change measured;
                                 --crosscoder_source=S: a model-diffing crosscoder's latents
                                 credited in model S's prediction (with --target_latent: in
                                 model S's later latent)
  graph ID T1 T2 ... [--target=T [--contrast=T] | --target_latent=D:J@P] [--per_hook=N]
        [--min_importance=F] [--node_threshold=F] [--node_tokens=N] [--ablate=1] [--dot=FILE.dot]
        [--layers=D,D,...] [--vocab=F] [--html=FILE.html] [--node_links=PATTERN]
        [--crosscoder_source=S]
  graph ID --text="..." --vocab=tokenizer.json [...]
                                 an attribution graph over the SAE suite up to dataset ID's
                                 hook: the N latents (at their positions) that drive the
                                 prediction most, then per earlier hook the N that drive
                                 those, with each hook's SAE error and how much of what
                                 reaches the hook its nodes carry; each latent labelled with
                                 the tokens it fires on most; --html draws it, each latent
                                 a link with --node_links=board-{dataset}/latent-{latent}.html;
                                 --crosscoder_source=S with a model-diffing crosscoder: model
                                 S runs it, the other layers S's SAEs (without --layers, those
                                 over the same rows)
  compare ID OTHER [--sample=N] [--limit=N]
                                 how far two datasets' SAEs learned the same directions: each
                                 latent's nearest decoder direction in the other SAE (mean,
                                 histogram), and the N matched worst
  scaling ID [J ...] [--crosscoder_source=S] [--baseline=B] [--max_rows=R] [--limit=N]
          [--min_share=F] [--plot=FILE.png]
                                 latent scaling of a model-diffing crosscoder's latents (J, or
                                 source S's own that fire, at most N): how much of each one's
                                 direction model B carries in its error and its other latents
                                 against model S; near 0 S's own, near 1 a sparsity artifact
  cofiring ID J [--rank=count|lift|f1] [--limit=N] [--max_rows=R] [--min_count=C]
           [--in_dataset=D] [--plot=FILE.png]
                                 the latents that fire on the rows where latent J fires (with
                                 --in_dataset: D's latents, e.g. another layer of the same job);
                                 FRACTION is P(latent | J), PRECISION P(J | latent), and
                                 --rank=f1 puts the latents most nearly J first; --plot
                                 draws each latent at (FRACTION, PRECISION), the first ten
                                 numbered (also for token and onrows)
  token ID T [--vocab=F] [--rank=count|lift|f1] [--limit=N] [--max_rows=R] [--min_count=C]
                                 the latents that fire on token T (an id, or its text with --vocab)
  onrows ID ROW|START:COUNT ... [--rows_file=F] [--rank=count|lift|f1|difference] [--limit=N]
         [--max_rows=R] [--min_count=C] [--in_dataset=D] [--versus=ROW|START:COUNT,...]
         [--versus_file=F] [--plot=FILE.png] [--sequences]
                                 the latents that fire on the rows you name (the documents you
                                 labelled; F: such items, e.g. from numpy.savetxt); with
                                 --rank=lift, what is enriched there against the whole dataset;
                                 --rank=f1, the latent that best marks them (fires there, and
                                 little elsewhere: PRECISION is its firings' share there);
                                 with --versus, each latent's fraction on those rows too (your
                                 negatives) and --rank=difference: what tells the two apart;
                                 --plot: each latent's two fractions (with --versus) or its
                                 FRACTION and PRECISION, the best ten numbered;
                                 --sequences: every item names sequences, not rows (documents)
  probe ID ROW|START:COUNT ... --versus=ROW|START:COUNT,... [--rows_file=F] [--versus_file=F]
        [--sequences [--pool=mean|max]] [--ks=1,2,5,10,20] [--select=fraction|mean]
        [--test_fraction=0.25] [--seed=S] [--l2=1] [--balanced] [--max_rows=N] [--plot=FILE.png]
        [--all_hooks]
                                 k-sparse probing (SAEBench's), computed by the daemon: how
                                 well k latents tell the named rows from the --versus rows.
                                 Each side's ranges (pooled: sequences) split into train
                                 and held-out test, latents chosen on train, a logistic
                                 regression on the first k fitted per --ks; prints train and
                                 held-out accuracy, precision, recall, F1 and the latents'
                                 weights; --pool: each sequence one example (documents);
                                 --balanced: each class weighed by n / (2 n_class) (a rare
                                 label);
                                 --plot: the metrics against k; --all_hooks: the same
                                 probe (and split) through every other hook of the
                                 suite, a line of balanced accuracies each: which layer
                                 reads the concept best
  project ID FILE|--latent=D:J [--cosine] [--top=N] [--distinct] [--start=R --count=N]
          [--vocab=F] [--plot=F.png]
                                 a direction (numpy.save's .npy, or numbers as text: a steering
                                 vector, a probe's weights; or latent J's decoder row in
                                 dataset D's SAE) on a DENSE
                                 dataset's hidden states: mean, spread, histogram, and the
                                 rows it is largest and smallest on, with their contexts
  explain ID FILE.jsonl|DIR [--source=S] [--replace_all] [--module=M] [--scores=SCORER]
  explain ID J --text="..." [--score=X] [--source=S]
  explain ID --from_dataset=D [--replace_all]
                                 store what latents stand for: JSON Lines ({"latent": 12,
                                 "text": "French words", "score": 0.8, "source": "delphi"}),
                                 a delphi run's directory (or its explanations/), or one
                                 written by hand; delphi's are scored by the balanced
                                 accuracy of its detection (else fuzz, or --scores)
                                 scorer's verdicts, and its module is the dataset's hook
                                 (or --module); or copied from dataset D of the same SAE
                                 (the same SAE over other tokens); shown by latent,
                                 dashboard pages and the index; deleted with the dataset
  search ID WORDS... [--limit=N]  the latents whose explanations hold every word (any case,
                                 "fren" finds French), scored ones first
  export ID PATH [--format=npz|hdf5|parquet|delphi] [--start=R] [--count=N] [--splits=S]
         [--job [--watch|--dry_run] [--after_jobs=..] [--bind=export.dataset_id=JOB:extract.dataset_id]]
                                 server-side, under the export root (parquet: a row a row,
                                 latents and values as lists, for pandas / polars / DuckDB;
                                 delphi: PATH is a latent cache directory for EleutherAI's
                                 delphi, the dataset its module PATH/<hook>, S files of it);
                                 streamed in bounded memory; Ctrl-C stops it. --job: run it as
                                 an EXPORT job (prints its id; progress with watch; ID '-' when
                                 --bind names the dataset a job it waits for makes)
  delete-dataset ID
  artifacts                      trained SAEs
  delete-artifact ID             its record and files (refused while an unfinished job uses it)
)";

int Run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "help") {
    std::printf("%s", kHelp);
    return args.empty() ? kExitUsage : 0;
  }
  if (args[0] == "tokenize") return Tokenize(args);   // local: no daemon needed
  if (args[0] == "train-nodes") return TrainNodes();  // its own clients, one per node
  Client client;
  std::string error;
  if (!client.LoadToken(&error)) return Usage(error);
  const std::string& command = args[0];
  if (command == "submit") return Submit(client);
  if (command == "get") return Get(client, args);
  if (command == "pipeline") return Pipeline(client, args);
  if (command == "list") return List(client);
  if (command == "watch") return Watch(client, args);
  if (command == "cancel") return Cancel(client, args);
  if (command == "delete-job") return DeleteJob(client, args);
  if (command == "devices") return Devices(client);
  if (command == "telemetry") return Telemetry(client, args);
  if (command == "datasets") return Datasets(client);
  if (command == "dataset") return Dataset(client, args);
  if (command == "rows") return Rows(client, args);
  if (command == "latent") return Latent(client, args);
  if (command == "latents") return Latents(client, args);
  if (command == "firings") return Firings(client, args);
  if (command == "dashboard") return Dashboard(client, args);
  if (command == "examples") return Examples(client, args);
  if (command == "weights") return Weights(client, args);
  if (command == "prompt") return Prompt(client, args);
  if (command == "steer") return Steer(client, args);
  if (command == "attribute") return Attribute(client, args);
  if (command == "graph") return Graph(client, args);
  if (command == "compare") return Compare(client, args);
  if (command == "scaling") return Scaling(client, args);
  if (command == "cofiring") return OnRows(client, args, RowsBy::kLatent);
  if (command == "token") return OnRows(client, args, RowsBy::kToken);
  if (command == "onrows") return OnRows(client, args, RowsBy::kRanges);
  if (command == "probe") return Probe(client, args);
  if (command == "project") return Project(client, args);
  if (command == "explain") return Explain(client, args);
  if (command == "search") return Search(client, args);
  if (command == "export") return Export(client, args);
  if (command == "delete-dataset") return DeleteDataset(client, args);
  if (command == "artifacts") return Artifacts(client);
  if (command == "delete-artifact") return DeleteArtifact(client, args);
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace latentd::client::cli

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(latentd::client::cli::kHelp);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  return latentd::client::cli::Run(args);
}
