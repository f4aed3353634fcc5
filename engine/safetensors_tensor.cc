#include "engine/safetensors_tensor.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::StatusOr<at::ScalarType> StFloatType(const StTensorInfo& info, const char* what) {
  return StFloatType(info.dtype, info.name, what);
}

absl::StatusOr<at::ScalarType> StFloatType(StDtype dtype, const std::string& name,
                                           const char* what) {
  switch (dtype) {
    case StDtype::kF32:
      return at::kFloat;
    case StDtype::kF16:
      return at::kHalf;
    case StDtype::kBF16:
      return at::kBFloat16;
    case StDtype::kF64:
      return at::kDouble;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor ", name, " has dtype ", StDtypeName(dtype)));
  }
}

absl::StatusOr<at::Tensor> ReadFloatTensor(const SafetensorsFile& file, const StTensorInfo& info,
                                           const char* what) {
  auto type = StFloatType(info, what);
  if (!type.ok()) return type.status();
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(*type));
  std::memcpy(t.data_ptr(), file.data(info), info.end - info.begin);
  return t.to(at::kFloat);
}

namespace {

// INVALID_ARGUMENT unless `info` is a 3-D float tensor with `index` inside dimension `dim`.
absl::StatusOr<at::ScalarType> CheckSlice(const std::string& path, const StTensorInfo& info,
                                          int dim, int64_t index, const char* what) {
  auto type = StFloatType(info, what);
  if (!type.ok()) return type.status();
  if (info.shape.size() != 3 || (dim != 0 && dim != 1) || index < 0 || index >= info.shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat(what, " tensor ", info.name, " in ", path,
                                                   ": no slice ", index, " of dimension ", dim));
  }
  return type;
}

absl::Status ShortRead(const std::string& path, const StTensorInfo& info, const char* what) {
  return absl::DataLossError(
      absl::StrCat("short read of ", what, " tensor ", info.name, " from ", path));
}

}  // namespace

absl::StatusOr<at::Tensor> ReadFloatTensorSlice(const std::string& path, const StHeader& header,
                                                const StTensorInfo& info, int dim, int64_t index,
                                                const char* what) {
  if (dim == 0) {
    auto blocks = ReadFloatTensorBlocks(path, header, info, {index}, what);
    if (!blocks.ok()) return blocks.status();
    return (*blocks)[0];
  }
  auto type = CheckSlice(path, info, dim, index, what);
  if (!type.ok()) return type.status();
  // shape[0] rows, shape[1] apart.
  const int64_t rows = info.shape[0], width = info.shape[2];
  const int64_t row_bytes = width * StDtypeSize(info.dtype);
  at::Tensor t = at::empty({rows, width}, at::TensorOptions().dtype(*type));
  std::ifstream in(path, std::ios::binary);
  char* out = static_cast<char*>(t.data_ptr());
  for (int64_t r = 0; in && r < rows; ++r) {
    in.seekg(header.data_start + info.begin + (index + r * info.shape[1]) * row_bytes);
    in.read(out + r * row_bytes, row_bytes);
  }
  if (!in) return ShortRead(path, info, what);
  return t.to(at::kFloat);
}

absl::StatusOr<at::Tensor> ReadFloatTensorBlocks(const std::string& path, const StHeader& header,
                                                 const StTensorInfo& info,
                                                 const std::vector<int64_t>& indices,
                                                 const char* what) {
  at::ScalarType type = at::kFloat;
  for (int64_t index : indices) {
    auto checked = CheckSlice(path, info, 0, index, what);
    if (!checked.ok()) return checked.status();
    type = *checked;
  }
  if (indices.empty()) {
    auto checked = StFloatType(info, what);
    if (!checked.ok()) return checked.status();
    if (info.shape.size() != 3) return CheckSlice(path, info, 0, -1, what).status();
  }
  // Each index: one block of shape[1] rows.
  const int64_t block_bytes = info.shape[1] * info.shape[2] * StDtypeSize(info.dtype);
  at::Tensor t = at::empty({static_cast<int64_t>(indices.size()), info.shape[1], info.shape[2]},
                           at::TensorOptions().dtype(type));
  std::ifstream in(path, std::ios::binary);
  char* out = static_cast<char*>(t.data_ptr());
  for (size_t i = 0; in && i < indices.size(); ++i) {
    in.seekg(header.data_start + info.begin + indices[i] * block_bytes);
    in.read(out + i * block_bytes, block_bytes);
  }
  if (!in) return ShortRead(path, info, what);
  return t.to(at::kFloat);
}

absl::Status WriteFloatTensors(const std::string& path,
                               const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> cpu;
  std::vector<StTensorToWrite> to_write;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) continue;
    cpu.push_back(tensor.detach().to(at::kCPU, at::kFloat).contiguous());
    to_write.push_back({name, StDtype::kF32, tensor.sizes().vec(), nullptr});
  }
  for (size_t i = 0; i < to_write.size(); ++i) to_write[i].data = cpu[i].data_ptr();
  return WriteSafetensors(path, to_write, metadata);
}

}  // namespace latentd::engine
