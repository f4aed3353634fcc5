// Which datasets answer the same questions as a given one over the same rows: what latentctl's
// `prompt --all_hooks` sends the prompt to and what each dashboard page compares against
// ("Fires with, in dataset D").
#ifndef LATENTD_CLIENT_DATASET_SIBLINGS_H_
#define LATENTD_CLIENT_DATASET_SIBLINGS_H_

#include <vector>

#include "proto/latentd/v1/datasets.pb.h"

namespace latentd::client {

// The other SPARSE datasets of `all` over the same rows as `info` (token source, first sequence,
// context length) through the same model: first the other outputs of its EXTRACT job
// (more_outputs: other hooks, other SAEs), then, for a suite extracted a job per layer, other
// jobs' datasets made with the same model weights (model id and a recorded, equal weight hash).
// One dataset per hook and SAE (sae_weight_hash): `info`'s twin (the same extraction run again)
// and later twins of a listed one are left out. In id order within each part.
std::vector<v1::DatasetInfo> SiblingDatasets(const v1::DatasetInfo& info,
                                             const v1::ListDatasetsResponse& all);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_DATASET_SIBLINGS_H_
