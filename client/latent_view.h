// How latentctl shows a latent's examples to a person: as text on one terminal line, or as a
// self-contained HTML page where every token is shaded by the latent's value on it (what
// SAEDashboard and Neuronpedia draw), from one GetLatent answer.
#ifndef LATENTD_CLIENT_LATENT_VIEW_H_
#define LATENTD_CLIENT_LATENT_VIEW_H_

#include <cstdint>
#include <string>

#include "client/vocabulary.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// The example's window as one line: each token as `vocab` decodes it (Printable, so one line),
// the example's own token between « and ». Without a vocabulary, the ids separated by spaces
// with the example's own in «».
std::string ContextLine(const v1::TopActivation& example, const Vocabulary* vocab);

struct LatentPageOptions {
  uint64_t dataset_id = 0;
  // Decodes the tokens; null shows token ids.
  const Vocabulary* vocab = nullptr;
  // The response's top list holds one row per sequence (GetLatentRequest.distinct_sequences):
  // only the heading says so.
  bool distinct_sequences = false;
};

// A whole HTML page (no scripts, no external resources): the latent's statistics, its value
// histogram as inline SVG, then the top examples and each interval's samples. A token's
// background is the latent's value on it over the latent's max (from context_values; the
// example's own token alone when the dataset keeps none), its tooltip the row, id and value.
std::string LatentHtml(const v1::GetLatentResponse& response, const LatentPageOptions& options);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_LATENT_VIEW_H_
