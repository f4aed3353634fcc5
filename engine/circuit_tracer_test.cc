#include "engine/circuit_tracer.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string d = std::string(root != nullptr ? root : "/tmp") + "/" + name;
  mkdir(d.c_str(), 0755);
  return d;
}

void Touch(const std::string& path, const std::string& text = "") { std::ofstream(path) << text; }

TEST(CircuitTracerTest, ReadsTheTopLevelKeysOfConfigYaml) {
  // As circuit-tracer's releases write it: quoted and plain scalars, a list, a comment.
  auto keys = ParseTopLevelYaml(
      "model_kind: cross_layer_transcoder\n"
      "feature_input_hook: \"hook_resid_mid\"\n"
      "feature_output_hook: 'hook_mlp_out'  # where it writes\n"
      "# a comment\n"
      "scan: mntss/clt\n"
      "transcoders:\n"
      "  - hf://a/b/layer_0.safetensors\n"
      "- hf://a/b/layer_1.safetensors\r\n"
      "k: 64\n");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(keys->at("model_kind"), "cross_layer_transcoder");
  EXPECT_EQ(keys->at("feature_input_hook"), "hook_resid_mid");
  EXPECT_EQ(keys->at("feature_output_hook"), "hook_mlp_out");
  EXPECT_EQ(keys->at("transcoders"), "");
  EXPECT_EQ(keys->at("k"), "64");
  EXPECT_EQ(keys->size(), 6u);
  auto bad = ParseTopLevelYaml("model_kind: x\nno colon here\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
}

TEST(CircuitTracerTest, TellsTheKindAndCountsTheLayers) {
  const std::string set = TempDir("ct_set");
  Touch(set + "/config.yaml",
        "model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\n");
  for (int l : {0, 1, 2, 4}) Touch(set + "/layer_" + std::to_string(l) + ".safetensors");
  ASSERT_TRUE(IsCircuitTracerLayout(set));
  auto release = ReadCircuitTracerRelease(set);
  ASSERT_TRUE(release.ok()) << release.status();
  EXPECT_FALSE(release->cross_layer);
  EXPECT_EQ(release->n_layers, 3);  // layers 0..2; 4 is past a gap
  EXPECT_EQ(release->feature_input_hook, "mlp.hook_in");
  EXPECT_EQ(release->feature_output_hook, "mlp.hook_out");
  EXPECT_EQ(CircuitTracerEncoderFile(set, release->cross_layer, 1), set + "/layer_1.safetensors");

  // A CLT saved by to_safetensors, without config.yaml: the file names say what it is.
  const std::string clt = TempDir("ct_clt");
  for (int l : {0, 1}) {
    Touch(clt + "/W_enc_" + std::to_string(l) + ".safetensors");
    Touch(clt + "/W_dec_" + std::to_string(l) + ".safetensors");
  }
  ASSERT_TRUE(IsCircuitTracerLayout(clt));
  release = ReadCircuitTracerRelease(clt);
  ASSERT_TRUE(release.ok()) << release.status();
  EXPECT_TRUE(release->cross_layer);
  EXPECT_EQ(release->n_layers, 2);
  EXPECT_TRUE(release->feature_input_hook.empty());
  EXPECT_EQ(CircuitTracerDecoderFile(clt, 1), clt + "/W_dec_1.safetensors");

  // Transcoders listed as files elsewhere (hf:// URIs), none of them here.
  const std::string elsewhere = TempDir("ct_elsewhere");
  Touch(elsewhere + "/config.yaml",
        "model_kind: transcoder_set\ntranscoders:\n  - hf://google/x/layer_0/params.npz\n");
  release = ReadCircuitTracerRelease(elsewhere);
  ASSERT_TRUE(release.ok()) << release.status();
  EXPECT_TRUE(release->transcoders_elsewhere);
  EXPECT_EQ(release->n_layers, 0);

  const std::string unknown = TempDir("ct_unknown");
  Touch(unknown + "/config.yaml", "model_kind: sae\n");
  auto bad = ReadCircuitTracerRelease(unknown);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model_kind"), std::string::npos) << bad.status();

  // An SAELens directory is not one, even with a safetensors file named like a layer's, or a
  // config.yaml of some other tool's.
  const std::string saelens = TempDir("ct_saelens");
  Touch(saelens + "/cfg.json", "{}");
  Touch(saelens + "/layer_0.safetensors");
  Touch(saelens + "/config.yaml", "seed: 3\n");
  EXPECT_FALSE(IsCircuitTracerLayout(saelens));
}

}  // namespace
}  // namespace latentd::engine
