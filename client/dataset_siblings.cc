#include "client/dataset_siblings.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace latentd::client {

std::vector<v1::DatasetInfo> SiblingDatasets(const v1::DatasetInfo& info,
                                             const v1::ListDatasetsResponse& all) {
  auto same_rows = [&](const v1::DatasetInfo& d) {
    return d.kind() != v1::DENSE_ACTIVATIONS && d.token_source() == info.token_source() &&
           d.token_order_start() == info.token_order_start() &&
           d.context_length() == info.context_length();
  };
  auto same_model = [&](const v1::DatasetInfo& d) {
    return !info.model_weight_hash().empty() && d.model_weight_hash() == info.model_weight_hash() &&
           d.model_id() == info.model_id();
  };
  auto hook_and_sae = [](const v1::DatasetInfo& d) {
    return absl::StrCat(d.hook_name(), "\n", d.sae_weight_hash());
  };
  std::set<std::string> seen = {hook_and_sae(info)};
  std::vector<v1::DatasetInfo> siblings;
  for (const bool own_job : {true, false}) {
    for (const v1::DatasetInfo& d : all.datasets()) {
      if (d.id() == info.id() || !same_rows(d) || (d.job_id() == info.job_id()) != own_job ||
          (!own_job && !same_model(d)) || !seen.insert(hook_and_sae(d)).second) {
        continue;
      }
      siblings.push_back(d);
    }
  }
  return siblings;
}

}  // namespace latentd::client
