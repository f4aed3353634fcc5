#include "engine/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>

#include <cstring>
#include <fstream>
#include <string>

#include "common/test_dir.h"
#include "engine/torch_pickle_testing.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

void WriteBytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

// A dict of tensors as LibTorch's pickler writes it (what torch.load reads): names, dtypes,
// shapes, strides and values come back, a view keeping its storage's layout.
TEST(TorchPickleTest, ReadsTheTensorsOfASavedDict) {
  const std::string dir = FreshTestDir("torch_pickle");
  at::manual_seed(3);
  const at::Tensor weight = at::randn({3, 5});
  const at::Tensor transposed = weight.t();  // a view: strides {1, 5}
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("weight", weight);
  dict.insert("weight_t", transposed);
  dict.insert("half", at::randn({4}).to(at::kHalf));
  dict.insert("k", at::scalar_tensor(7, at::kInt));
  const std::string path = dir + "/state.pt";
  WriteBytes(path, torch::pickle_save(dict));

  auto state = TorchStateDict::Open(path);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->tensors().size(), 4u);
  const TorchTensorInfo* t = state->Find("weight_t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, StDtype::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{5, 3}));
  auto bytes = state->ReadStorage(*t);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  at::Tensor storage = at::empty({t->storage_numel});
  ASSERT_EQ(bytes->size(), static_cast<size_t>(storage.nbytes()));
  std::memcpy(storage.data_ptr(), bytes->data(), bytes->size());
  EXPECT_TRUE(at::equal(storage.as_strided(t->shape, t->strides, t->storage_offset), transposed));
  EXPECT_EQ(state->Find("half")->dtype, StDtype::kF16);
  const TorchTensorInfo* k = state->Find("k");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->dtype, StDtype::kI32);
  EXPECT_TRUE(k->shape.empty());
  auto k_bytes = state->ReadStorage(*k);
  ASSERT_TRUE(k_bytes.ok());
  int32_t k_value = 0;
  std::memcpy(&k_value, k_bytes->data() + 4 * k->storage_offset, 4);
  EXPECT_EQ(k_value, 7);
  EXPECT_EQ(*state->ReadIntegers(*k), std::vector<int64_t>{7});  // a module's buffer, as int64
  EXPECT_EQ(state->ReadIntegers(*t).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state->Find("absent"), nullptr);
}

// A torch.save-style archive holding the given data.pkl (and storages).
std::string WriteArchive(const std::string& dir, const std::string& name, const std::string& pkl,
                         const std::vector<std::pair<std::string, std::string>>& records = {}) {
  const std::string path = dir + "/" + name + ".pt";
  caffe2::serialize::PyTorchStreamWriter writer(path);
  writer.writeRecord("data.pkl", pkl.data(), pkl.size());
  for (const auto& [record, bytes] : records)
    writer.writeRecord(record, bytes.data(), bytes.size());
  writer.writeEndOfFile();
  return path;
}

// Pickles that name a callable other than a state dict's are refused, not run; a storage whose
// bytes are fewer than its tensor reaches, a file that is no zip, a pickle cut short: named
// errors.
TEST(TorchPickleTest, RefusesWhatIsNotAPlainStateDict) {
  const std::string dir = FreshTestDir("torch_pickle_bad");
  auto message = [](const absl::StatusOr<TorchStateDict>& s) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    return std::string(s.status().message());
  };
  using std::string_literals::operator""s;
  // protocol 2: PROTO 2, GLOBAL posix.system, ('touch x',), REDUCE, STOP
  const std::string evil =
      "\x80\x02"s + "cposix\nsystem\n" + "X\x07\x00\x00\x00"s + "touch x" + "\x85R.";
  EXPECT_NE(
      message(TorchStateDict::Open(WriteArchive(dir, "evil", evil))).find("calls posix.system"),
      std::string::npos);
  // {} then an opcode (INST) no state dict uses.
  EXPECT_NE(
      message(TorchStateDict::Open(WriteArchive(dir, "inst", "\x80\x02}i"s))).find("opcode 0x69"),
      std::string::npos);
  EXPECT_NE(message(TorchStateDict::Open(WriteArchive(dir, "cut", "\x80\x02}"s)))
                .find("ends without STOP"),
            std::string::npos);
  // {'w': _rebuild_tensor_v2(storage('0', FloatStorage, 4 elements), 0, (3, 2), (2, 1), False,
  // OrderedDict())}: element 5 reached, four stored.
  using torch_pickle_testing::PickleSmallInt;
  const std::string tensor =
      "\x80\x02}"s + torch_pickle_testing::PickleString("w") +
      torch_pickle_testing::PickleTensor("0", 4,
                                         PickleSmallInt(3) + PickleSmallInt(2) + "\x86"s +
                                             PickleSmallInt(2) + PickleSmallInt(1) + "\x86"s) +
      "s.";
  const std::string path = WriteArchive(dir, "short", tensor, {{"data/0", std::string(16, '\0')}});
  EXPECT_NE(message(TorchStateDict::Open(path)).find("reaches element 5 of a storage of 4"),
            std::string::npos);
  const std::string plain = dir + "/not_a_zip.pt";
  std::ofstream(plain) << "not a zip";
  EXPECT_NE(message(TorchStateDict::Open(plain)).find("torch 1.6"), std::string::npos);
  EXPECT_EQ(TorchStateDict::Open(dir + "/missing.pt").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace latentd::engine
