// Corrupt ae.pt files never crash the reader: a valid torch.save archive (a state dict of two
// tensors, the pickle written by hand as torch.save writes it) is damaged thousands of ways, in
// its pickle and in the zip around it, and TorchStateDict::Open must return OK (with tensors that
// fit their storages) or INVALID_ARGUMENT. Torch-free, so that it runs under --config=asan
// (scripts/test.sh): the unpickler and the zip reader parse untrusted bytes by hand.
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/mutate.h"
#include "common/test_dir.h"
#include "engine/torch_pickle.h"
#include "engine/torch_pickle_testing.h"
#include "engine/zip_archive.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

using std::string_literals::operator""s;

using torch_pickle_testing::PickleSmallInt;
using torch_pickle_testing::PickleString;
using torch_pickle_testing::PickleTensor;
using torch_pickle_testing::StoredZip;

TEST(TorchPickleFuzzTest, CorruptArchivesAreRefusedNeverACrash) {
  const std::string dir = FreshTestDir("torch_pickle_fuzz");
  // OrderedDict() {'W': [2, 3] view, 'b': [3]} with its _metadata BUILD, as a state dict pickles.
  const std::string pickle =
      "\x80\x02"s + "ccollections\nOrderedDict\nq\x00)Rq\x03("s + PickleString("W") +
      PickleTensor("0", 6,
                   PickleSmallInt(2) + PickleSmallInt(3) + "\x86"s + PickleSmallInt(3) +
                       PickleSmallInt(1) + "\x86"s) +
      PickleString("b") +
      PickleTensor("1", 3, PickleSmallInt(3) + "\x85"s + PickleSmallInt(1) + "\x85"s) + "u}" +
      PickleString("x") + "h\x03" + "sb.";
  const std::string valid = StoredZip({{"archive/data.pkl", pickle},
                                       {"archive/byteorder", "little"},
                                       {"archive/data/0", std::string(24, '\1')},
                                       {"archive/data/1", std::string(12, '\2')},
                                       {"archive/version", "3\n"}});
  const std::string path = dir + "/ae.pt";
  auto open = [&](const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return TorchStateDict::Open(path);
  };
  auto state = open(valid);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->tensors().size(), 2u);
  EXPECT_EQ(state->Find("W")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(state->Find("b")->storage, "archive/data/1");

  std::mt19937 rng(7);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    // Half damage the pickle inside an intact zip, half the archive's bytes themselves.
    const std::string bytes = i % 2 == 0
                                  ? StoredZip({{"archive/data.pkl", MutateBytes(pickle, &rng)},
                                               {"archive/data/0", std::string(24, '\1')},
                                               {"archive/data/1", std::string(12, '\2')}})
                                  : MutateBytes(valid, &rng);
    auto got = open(bytes);
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
      ++refused;
      continue;
    }
    for (const TorchTensorInfo& t : got->tensors()) {  // what Open accepts fits its storage
      auto storage = got->ReadStorage(t);
      if (!storage.ok()) continue;  // a damaged entry read later is an error, not a crash
      int64_t last = t.storage_offset;
      for (size_t d = 0; d < t.shape.size(); ++d) last += (t.shape[d] - 1) * t.strides[d];
      if (t.numel() > 0) {
        EXPECT_LT(last, t.storage_numel) << t.name;
      }
    }
  }
  EXPECT_GT(refused, 1000);  // most damage is caught, not read as another state dict
}

}  // namespace
}  // namespace latentd::engine
