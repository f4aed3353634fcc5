// LibTorch side of safetensors.h: a stored tensor as a float32 CPU tensor. Kept apart so that
// safetensors.h stays torch-free for submit-time header checks.
#ifndef LATENTD_ENGINE_SAFETENSORS_TENSOR_H_
#define LATENTD_ENGINE_SAFETENSORS_TENSOR_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"

namespace latentd::engine {

// The LibTorch type of a float dtype (F32, F16, BF16, F64); INVALID_ARGUMENT
// "<what> tensor <name> has dtype <dtype>" for another.
absl::StatusOr<at::ScalarType> StFloatType(const StTensorInfo& info, const char* what);
// The same for a tensor `name` of dtype `dtype` read from elsewhere (a torch.save file).
absl::StatusOr<at::ScalarType> StFloatType(StDtype dtype, const std::string& name,
                                           const char* what);

// `info` (one of file.header().tensors) copied out of the file and converted to float32.
// F32, F16, BF16 and F64 are accepted; another dtype is INVALID_ARGUMENT
// "<what> tensor <name> has dtype <dtype>".
absl::StatusOr<at::Tensor> ReadFloatTensor(const SafetensorsFile& file, const StTensorInfo& info,
                                           const char* what);

// Slice `index` of dimension `dim` (0 or 1) of the 3-D tensor `info` in the file at `path`
// (whose header is `header`), the 2-D rest as float32, read without holding the file: a
// cross-layer transcoder's decoder [d_sae, layers, d_model] can take gigabytes, of which one
// layer's [d_sae, d_model] (dim 1, read a row at a time) or one latent's [layers, d_model]
// (dim 0, one read) is wanted. INVALID_ARGUMENT for another rank or dim, an index out of range
// or a non-float dtype; DATA_LOSS naming the file on a short read.
absl::StatusOr<at::Tensor> ReadFloatTensorSlice(const std::string& path, const StHeader& header,
                                                const StTensorInfo& info, int dim, int64_t index,
                                                const char* what);

// Slices `indices` of dimension 0 of the 3-D tensor `info` in the file at `path`, [indices,
// shape[1], shape[2]] as float32, one read each with the file opened once: several latents'
// rows of a cross-layer transcoder's decoder. Errors as ReadFloatTensorSlice's.
absl::StatusOr<at::Tensor> ReadFloatTensorBlocks(const std::string& path, const StHeader& header,
                                                 const StTensorInfo& info,
                                                 const std::vector<int64_t>& indices,
                                                 const char* what);

// Writes `tensors` (name, tensor; undefined ones left out) as F32 to a safetensors file at `path`
// atomically (WriteSafetensors), converting each to a contiguous float32 CPU copy first.
absl::Status WriteFloatTensors(const std::string& path,
                               const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SAFETENSORS_TENSOR_H_
