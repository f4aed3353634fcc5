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
#include "engine/zip_archive.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

using std::string_literals::operator""s;

std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A zip of stored entries (no CRC: neither reader checks one; the storages' bytes are what the
// tensors are checked against).
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint64_t offset = out.size();
    out += "PK\x03\x04"s + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) +
           Le(data.size(), 4) + Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2) + name + data;
    directory += "PK\x01\x02"s + Le(20, 2) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) +
                 Le(data.size(), 4) + Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2) +
                 Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(offset, 4) + name;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  out += "PK\x05\x06"s + Le(0, 2) + Le(0, 2) + Le(entries.size(), 2) + Le(entries.size(), 2) +
         Le(directory.size(), 4) + Le(directory_offset, 4) + Le(0, 2);
  return out;
}

std::string Str(const std::string& s) { return "X"s + Le(s.size(), 4) + s; }
std::string Small(int v) { return "K"s + static_cast<char>(v); }

// _rebuild_tensor_v2(storage(key, FloatStorage, numel), 0, size, stride, False, OrderedDict()),
// its memo entries written as torch.save writes them (BINPUT), and fetched back once (BINGET).
std::string Tensor(const std::string& key, int numel, const std::string& size_stride) {
  return "ctorch._utils\n_rebuild_tensor_v2\nq\x01("s + "(" + Str("storage") +
         "ctorch\nFloatStorage\nq\x02" + Str(key) + Str("cpu") + Small(numel) + "tQ" + Small(0) +
         size_stride + "\x89" + "ccollections\nOrderedDict\n)R" + "tR";
}

TEST(TorchPickleFuzzTest, CorruptArchivesAreRefusedNeverACrash) {
  const std::string dir = FreshTestDir("torch_pickle_fuzz");
  // OrderedDict() {'W': [2, 3] view, 'b': [3]} with its _metadata BUILD, as a state dict pickles.
  const std::string pickle =
      "\x80\x02"s + "ccollections\nOrderedDict\nq\x00)Rq\x03("s + Str("W") +
      Tensor("0", 6, Small(2) + Small(3) + "\x86"s + Small(3) + Small(1) + "\x86"s) + Str("b") +
      Tensor("1", 3, Small(3) + "\x85"s + Small(1) + "\x85"s) + "u}" + Str("x") + "h\x03" + "sb.";
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
