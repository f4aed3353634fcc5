// Explanations of latents read from files for `latentctl explain`: the JSON Lines a script or an
// explainer writes, or what EleutherAI's delphi leaves after a run (its explanations, and the
// scores its detection or fuzzing scorer gave them).
#ifndef LATENTD_CLIENT_EXPLANATION_FILES_H_
#define LATENTD_CLIENT_EXPLANATION_FILES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// The explanations in the JSON Lines file `path`: one JSON object a line, LatentExplanation's
// JSON form ({"latent": 12, "text": "French words", "score": 0.8, "source": "delphi"};
// "explanation" is taken for "text", other fields are ignored), blank lines skipped.
// `default_source` fills each explanation that names none. INVALID_ARGUMENT naming the file and
// line that cannot be read as one; NOT_FOUND for a missing path.
absl::StatusOr<std::vector<v1::LatentExplanation>> ReadExplanations(
    const std::string& path, const std::string& default_source);

// Where a delphi run's output lies. delphi writes a file per latent, named
// <module>_latent<J>.txt, in explanations/ (the explanation as one JSON string) and in
// scores/<scorer>/ (the scorer's verdict on each example it showed).
struct DelphiRun {
  std::string explanations_dir;
  // A classifier scorer's directory (detection or fuzz); empty: the explanations go unscored.
  std::string scores_dir;
  // Its name (the directory's), kept in each scored explanation's source ("delphi/detection").
  std::string scorer;
  // The explanation files in explanations_dir, listed once: module -> latent -> path
  // (<module>_latent<J>.txt; latent<J>.txt is module "").
  std::map<std::string, std::map<int32_t, std::string>> explanation_files;
};

// `path` is a delphi run's directory (holding explanations/ and scores/) or an explanations
// directory. `scores` names the scores to read: a scorer under the run's scores/, or a
// directory; empty: the run's scores/detection, else its scores/fuzz, else none. NOT_FOUND for a
// missing path or scorer; INVALID_ARGUMENT naming a file whose latent is out of range.
absl::StatusOr<DelphiRun> LocateDelphiRun(const std::string& path, const std::string& scores);

// The modules that have explanation files in the run, sorted ("" for files named
// latent<J>.txt).
std::vector<std::string> DelphiModules(const DelphiRun& run);

// The module to read among `modules`: `requested` when given (INVALID_ARGUMENT if it has no
// files); else the only one; else `hook` where it is one of them (latentctl's delphi export
// names each dataset's module by its hook, so one run can cover every layer). INVALID_ARGUMENT
// listing the modules otherwise.
absl::StatusOr<std::string> ChooseDelphiModule(const std::vector<std::string>& modules,
                                               const std::string& requested,
                                               const std::string& hook);

// How well a classifier scorer told a latent's examples apart using its explanation: the
// scorer's predictions against the truth ("activating") over the examples it answered.
struct ClassifierScore {
  int64_t answered = 0;
  // Examples without a prediction: the scorer's reply could not be parsed.
  int64_t unanswered = 0;
  double accuracy = 0;
  // The mean of the recalls of the classes among the answered examples (delphi's samples
  // mix activating and non-activating examples, not always evenly).
  double balanced_accuracy = 0;
};

// One scorer file's verdicts: a JSON array of delphi's ClassifierOutput records, each with a
// boolean "activating" and a "prediction" (boolean; null or missing for an unanswered example).
// INVALID_ARGUMENT naming the record that is not one.
absl::StatusOr<ClassifierScore> ParseClassifierScore(absl::string_view json);

// The explanations of `module` in run.explanations_dir, by latent, source "delphi". Where
// run.scores_dir holds a file for the latent with an answered example, the explanation is
// scored with its balanced accuracy and its source is "delphi/<scorer>". INVALID_ARGUMENT
// naming a file that cannot be read as delphi's.
absl::StatusOr<std::vector<v1::LatentExplanation>> ReadDelphiExplanations(
    const DelphiRun& run, const std::string& module);

// `explanations` cut in order into runs of at most `max_bytes` (their serialized sizes; one
// larger than that is a run alone), what one SetExplanations call carries; one empty run for
// none, so that a call is still made.
std::vector<std::vector<v1::LatentExplanation>> ExplanationBatches(
    const std::vector<v1::LatentExplanation>& explanations, size_t max_bytes);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_EXPLANATION_FILES_H_
