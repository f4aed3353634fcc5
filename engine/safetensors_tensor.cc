#include "engine/safetensors_tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::StatusOr<at::ScalarType> StFloatType(const StTensorInfo& info, const char* what) {
  switch (info.dtype) {
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
          absl::StrCat(what, " tensor ", info.name, " has dtype ", StDtypeName(info.dtype)));
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

}  // namespace latentd::engine
