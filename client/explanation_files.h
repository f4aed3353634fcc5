// Explanations of latents read from files for `latentctl explain`: the JSON Lines a script or an
// explainer writes, or the explanations directory EleutherAI's delphi leaves after a run.
#ifndef LATENTD_CLIENT_EXPLANATION_FILES_H_
#define LATENTD_CLIENT_EXPLANATION_FILES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// The explanations in `path`:
//  * a file: one JSON object a line, LatentExplanation's JSON form ({"latent": 12, "text":
//    "French words", "score": 0.8, "source": "delphi"}; "explanation" is taken for "text",
//    other fields are ignored), blank lines skipped;
//  * a directory: delphi's explanations, a file per latent named <module>_latent<J>.txt holding
//    the explanation as one JSON string; other files are skipped.
// `default_source` fills each explanation that names none. INVALID_ARGUMENT naming the file and
// line (or file) that cannot be read as one; NOT_FOUND for a missing path.
absl::StatusOr<std::vector<v1::LatentExplanation>> ReadExplanations(
    const std::string& path, const std::string& default_source);

// `explanations` cut in order into runs of at most `max_bytes` (their serialized sizes; one
// larger than that is a run alone), what one SetExplanations call carries; one empty run for
// none, so that a call is still made.
std::vector<std::vector<v1::LatentExplanation>> ExplanationBatches(
    const std::vector<v1::LatentExplanation>& explanations, size_t max_bytes);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_EXPLANATION_FILES_H_
