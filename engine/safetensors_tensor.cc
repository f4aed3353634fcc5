#include "engine/safetensors_tensor.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::StatusOr<at::Tensor> ReadFloatTensor(const SafetensorsFile& file, const StTensorInfo& info,
                                           const char* what) {
  at::ScalarType type;
  switch (info.dtype) {
    case StDtype::kF32:
      type = at::kFloat;
      break;
    case StDtype::kF16:
      type = at::kHalf;
      break;
    case StDtype::kBF16:
      type = at::kBFloat16;
      break;
    case StDtype::kF64:
      type = at::kDouble;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " tensor ", info.name, " has dtype ", StDtypeName(info.dtype)));
  }
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
  std::memcpy(t.data_ptr(), file.data(info), info.end - info.begin);
  return t.to(at::kFloat);
}

}  // namespace latentd::engine
