#include "client/dataset_siblings.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

v1::DatasetInfo Dataset(uint64_t id, uint64_t job, const std::string& hook, const std::string& sae,
                        const std::string& model = "fnv1a64:model") {
  v1::DatasetInfo d;
  d.set_id(id);
  d.set_job_id(job);
  d.set_kind(v1::SPARSE_LATENTS);
  d.set_hook_name(hook);
  d.set_sae_weight_hash(sae);
  d.set_model_id("reference");
  d.set_model_weight_hash(model);
  d.set_token_source("npy:/data/tokens.npy");
  d.set_context_length(128);
  return d;
}

std::vector<uint64_t> Ids(const std::vector<v1::DatasetInfo>& datasets) {
  std::vector<uint64_t> ids;
  for (const auto& d : datasets) ids.push_back(d.id());
  return ids;
}

TEST(DatasetSiblings, TheJobsOtherOutputsThenOtherJobsOfTheSameModelAndRows) {
  v1::ListDatasetsResponse all;
  const v1::DatasetInfo info = Dataset(5, 2, "blocks.2.hook_resid_post", "sae-a");
  *all.add_datasets() = Dataset(1, 1, "blocks.0.hook_resid_post", "sae-c");  // another job
  *all.add_datasets() = Dataset(2, 1, "blocks.1.hook_resid_post", "sae-b");  // twin of 6, earlier
  *all.add_datasets() = Dataset(3, 1, "blocks.2.hook_resid_post", "sae-a");  // info's twin
  *all.add_datasets() = info;
  *all.add_datasets() = Dataset(6, 2, "blocks.1.hook_resid_post", "sae-b");  // info's job
  *all.add_datasets() = Dataset(7, 3, "blocks.2.hook_resid_post", "sae-d");  // another SAE
  *all.add_datasets() = Dataset(8, 4, "blocks.0.hook_resid_post", "sae-e", "fnv1a64:other");
  v1::DatasetInfo dense = Dataset(9, 2, "blocks.2.hook_resid_post", "");
  dense.set_kind(v1::DENSE_ACTIVATIONS);
  *all.add_datasets() = dense;
  v1::DatasetInfo shard = Dataset(10, 5, "blocks.3.hook_resid_post", "sae-f");
  shard.set_token_order_start(64);  // other rows
  *all.add_datasets() = shard;
  v1::DatasetInfo other_context = Dataset(11, 6, "blocks.3.hook_resid_post", "sae-g");
  other_context.set_context_length(64);
  *all.add_datasets() = other_context;
  // 6 (its job) first; then 1 and 7 from other jobs; 2 and 3 repeat a hook and SAE already
  // listed; 8 ran another model; 9 is dense; 10 and 11 cover other rows.
  EXPECT_EQ(Ids(SiblingDatasets(info, all)), (std::vector<uint64_t>{6, 1, 7}));

  // Without a recorded model hash only the job's own outputs count.
  v1::DatasetInfo unhashed = info;
  unhashed.clear_model_weight_hash();
  EXPECT_EQ(Ids(SiblingDatasets(unhashed, all)), (std::vector<uint64_t>{6}));
}

}  // namespace
}  // namespace latentd::client
