#include "engine/decoder_writes.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/intervention_testing.h"
#include "engine/sae.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

HookName Hook(const std::string& name) { return *ParseHookName(name); }

bool Same(const HookName& a, const HookName& b) { return a.point == b.point && a.layer == b.layer; }

const at::Tensor kLatents = at::tensor({5, 0, 63, 17}, at::TensorOptions().dtype(at::kLong));

TEST(DecoderWritesTest, AnSaeWritesItsOwnHookAndATranscoderItsOutput) {
  const Sae sae = InterventionSae(false), transcoder = InterventionSae(true);
  for (const auto& [steering, written] :
       {std::pair{SteeringModel{nullptr, &sae, Hook("blocks.1.hook_resid_post"), std::nullopt},
                  "blocks.1.hook_resid_post"},
        std::pair{SteeringModel{nullptr, &transcoder, Hook("blocks.1.mlp.hook_in"),
                                Hook("blocks.1.hook_mlp_out")},
                  "blocks.1.hook_mlp_out"}}) {
    const std::vector<HookName> hooks = WrittenHooks(steering);
    ASSERT_EQ(hooks.size(), 1u);
    EXPECT_TRUE(Same(hooks[0], Hook(written))) << written;
    auto rows = WrittenRows(steering, kLatents);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->size(), 1u);
    EXPECT_TRUE(at::equal((*rows)[0], steering.sae->weights().W_dec.index_select(0, kLatents)));
  }
}

// Layer 1 of a 3-layer cross-layer transcoder writes the MLP outputs of layers 1 and 2, with the
// rows of its decoder into each; without the release's directory, its own layer's alone.
TEST(DecoderWritesTest, ACrossLayerTranscoderWritesEveryLaterLayer) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/clt";
  WriteInterventionClt(dir);
  auto layer1 = Sae::Load(dir, Hook("blocks.1.hook_resid_mid"));
  ASSERT_TRUE(layer1.ok()) << layer1.status();
  SteeringModel steering{nullptr, &*layer1, Hook("blocks.1.hook_resid_mid"),
                         Hook("blocks.1.hook_mlp_out"), dir};
  const std::vector<HookName> hooks = WrittenHooks(steering);
  ASSERT_EQ(hooks.size(), 2u);
  EXPECT_TRUE(Same(hooks[0], Hook("blocks.1.hook_mlp_out")));
  EXPECT_TRUE(Same(hooks[1], Hook("blocks.2.hook_mlp_out")));
  auto rows = WrittenRows(steering, kLatents);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  for (int to = 1; to <= 2; ++to) {
    auto decoder = LoadCrossLayerDecoder(dir, 1, to);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    EXPECT_TRUE(at::equal((*rows)[to - 1], decoder->index_select(0, kLatents))) << to;
  }
  EXPECT_TRUE(at::equal((*rows)[0], layer1->weights().W_dec.index_select(0, kLatents)));
  auto none = WrittenRows(steering, at::zeros({0}, at::kLong));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->size(), 2u);
  EXPECT_EQ((*none)[1].size(0), 0);

  steering.cross_layer_dir.clear();
  EXPECT_EQ(WrittenHooks(steering).size(), 1u);

  // A release whose decoder file went missing says which.
  steering.cross_layer_dir = dir;
  ASSERT_EQ(std::rename((dir + "/W_dec_1.safetensors").c_str(), (dir + "/moved").c_str()), 0);
  auto gone = WrittenRows(steering, kLatents);
  EXPECT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("W_dec_1.safetensors"), std::string::npos)
      << gone.status();
}

}  // namespace
}  // namespace latentd::engine
