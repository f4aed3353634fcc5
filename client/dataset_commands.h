// latentctl's commands that read the store's datasets and artifacts (the Datasets service):
// datasets, dataset, rows, latent, latents, firings, cofiring, token, weights, compare, scaling,
// dashboard, examples, export, delete-dataset, artifacts and delete-artifact. Each returns the
// process's exit status as client/cli.h says; `latentctl help` lists their flags.
#ifndef LATENTD_CLIENT_DATASET_COMMANDS_H_
#define LATENTD_CLIENT_DATASET_COMMANDS_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "client/cli.h"
#include "client/latent_view.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client::cli {

// latentctl datasets: the store's datasets, one line each.
int Datasets(Client& client);

// latentctl dataset ID: one dataset's record (metadata and summary).
int Dataset(Client& client, const std::vector<std::string>& args);

// latentctl rows ID: CSR rows --start.. (--count of them) with their token ids, and with --vocab
// their text.
int Rows(Client& client, const std::vector<std::string>& args);

// latentctl latent ID J: the latent's statistics, top activations with context, interval
// samples, top tokens, positions and silent windows as the flags ask; --html writes a page.
int Latent(Client& client, const std::vector<std::string>& args);

// latentctl latents ID: the SAE at a glance: a page of its latents in the order asked, the dead
// count, and the log10 feature-density histogram as a PNG with --plot.
int Latents(Client& client, const std::vector<std::string>& args);

// latentctl firings ID J: every firing of one latent (ReadLatentFirings) in --start/--count:
// "row value" lines (with --vocab also the row's token), or with --json {"rows": [...],
// "values": [...]}; a count line on stderr.
int Firings(Client& client, const std::vector<std::string>& args);

// How OnRows's command names the rows.
enum class RowsBy {
  kLatent,  // latentctl cofiring ID J: the rows where latent J fires
  kToken,   // latentctl token ID T: the rows holding token T (an id, or with --vocab its text)
  kRanges,  // latentctl onrows ID ROW|START:COUNT ... [--rows_file=F]: these rows (ParseRowRanges)
};

// The latents firing on a set of rows (LatentsOnRows), ranked by --rank (count, lift, or with
// onrows --versus difference), --limit of them, --max_rows counted, --in_dataset's latents;
// onrows --versus / --versus_file contrast the rows with others.
int OnRows(Client& client, const std::vector<std::string>& args, RowsBy by);

// latentctl probe ID ROW|START:COUNT ... --versus=...: k-sparse probing of the named rows
// against the versus rows (SparseProbe, computed by the daemon): per --ks, train and held-out
// accuracy, precision, recall, F1 and the latents with their weights; --pool (with --sequences)
// makes each sequence one example; --plot draws the metrics against k.
int Probe(Client& client, const std::vector<std::string>& args);

// latentctl project ID FILE: a direction (.npy or text) projected on a DENSE dataset's rows
// (ProjectRows): the spread and the rows at both ends with their contexts; --plot the
// histogram.
int Project(Client& client, const std::vector<std::string>& args);

// latentctl explain ID FILE|DIR, ID J --text=..., or ID --from_dataset=D: stores explanations
// of latents (SetExplanations) from JSON Lines, a delphi run, the command line, or another
// dataset of the same SAE.
int Explain(Client& client, const std::vector<std::string>& args);

// latentctl search ID WORDS...: the latents whose explanations hold every word
// (SearchExplanations), scored first.
int Search(Client& client, const std::vector<std::string>& args);

// latentctl weights ID J: what a latent's weights say: its nearest decoder directions and the
// tokens its decoder direction raises and lowers most (GetLatentWeights).
int Weights(Client& client, const std::vector<std::string>& args);

// latentctl compare ID OTHER: how far two datasets' SAEs learned the same directions
// (CompareSaes): the mean best cosine, its histogram, and the --limit latents of the first SAE
// the second matches worst.
int Compare(Client& client, const std::vector<std::string>& args);

// latentctl scaling ID: latent scaling (LatentScaling) of a model-diffing crosscoder's latents:
// per latent how much of its direction the baseline model carries, in its error and through its
// other latents, against the source model (nu near 0: the source's own; near 1: an artifact of
// sparsity).
int Scaling(Client& client, const std::vector<std::string>& args);

// latentctl dashboard ID DIR: a static dashboard of an SAE: DIR/index.html (summary, density
// histogram, the listed latents) and one page per listed latent (statistics, histogram,
// examples shaded by value, interval samples, the latents it fires with), every page linking to
// the others.
int Dashboard(Client& client, const std::vector<std::string>& args);

// latentctl examples ID FILE.jsonl: one JSON line per latent (LatentExamplesJson) for
// auto-interpretation: the latents the list flags choose (as `dashboard`), each with its top
// examples, interval samples and silent windows as --top, --intervals and --silent ask.
int Examples(Client& client, const std::vector<std::string>& args);

// latentctl export ID PATH: rows --start.. (--count of them) written by the daemon under its
// export root as --format (npz, hdf5, parquet, delphi), waiting for it; with --job, submitted as
// an EXPORT job instead (--watch follows it).
int Export(Client& client, const std::vector<std::string>& args);

// latentctl delete-dataset ID.
int DeleteDataset(Client& client, const std::vector<std::string>& args);

// latentctl artifacts: the trained SAEs registered in the store.
int Artifacts(Client& client);

// latentctl delete-artifact ID: its record and files (refused while an unfinished job uses it).
int DeleteArtifact(Client& client, const std::vector<std::string>& args);

// GetLatent of latent `latent` as the flags ask (--top, --before, --after_tokens, --intervals,
// --interval_samples, --distinct).
v1::GetLatentRequest LatentRequest(uint64_t id, int32_t latent);

// GetLatentWeights with `top_n` (and --unembedding) for a page's weights section: true with
// *response filled, or false after saying once on stderr why the pages go without one (e.g. the
// dataset's job record was deleted); *warned keeps it to once.
bool PageWeights(Client& client, uint64_t id, int32_t latent, int top_n,
                 v1::GetLatentWeightsResponse* response, bool* warned);

// Dataset `info`'s page for `latent` as a dashboard shows it (statistics, examples, where in
// its sequences it fires, what fires with it here and in `siblings`, its weights), written to
// dir/LatentPageName(latent) with `page`'s links; the tokens it fires on most land in
// *top_tokens. After one weights query fails (*weights_warned) the pages go without weights.
// 0, or the exit code of what failed (said on stderr).
int WriteLatentPage(Client& client, const v1::DatasetInfo& info,
                    const std::vector<v1::DatasetInfo>& siblings, int32_t latent,
                    const std::filesystem::path& dir, LatentPageOptions page, bool* weights_warned,
                    std::vector<v1::TokenCount>* top_tokens);

}  // namespace latentd::client::cli

#endif  // LATENTD_CLIENT_DATASET_COMMANDS_H_
