// The tensors of a file torch.save wrote (a state dict: dictionary_learning's ae.pt, ...), read
// without torch and without running the pickle. torch.save writes a zip holding data.pkl (a
// protocol-2 pickle of the object, each tensor's bytes referred to by a storage key) and
// data/<key> (the storages). TorchStateDict::Open reads data.pkl with a restricted unpickler that
// knows the opcodes such pickles use and the few callables a state dict names
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_tensor /
// _rebuild_parameter, the torch.*Storage types; LibTorch's torch.jit._pickle.restore_type_tag),
// and calls none of them: any other callable, or
// an opcode it does not know, is INVALID_ARGUMENT naming it. A pickle can name any Python
// callable; this reader only recognizes names.
//
// The object must be a dict (or OrderedDict) of string keys; its tensor values are listed, other
// values skipped. Every tensor's layout is checked against its storage's size (INVALID_ARGUMENT
// naming the tensor). The legacy pre-1.6 format (not a zip) and big-endian files are refused.
// Torch-free (submit-time checks read shapes from here).
#ifndef LATENTD_ENGINE_TORCH_PICKLE_H_
#define LATENTD_ENGINE_TORCH_PICKLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "engine/zip_archive.h"

namespace latentd::engine {

struct TorchTensorInfo {
  std::string name;  // the dict's key
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;    // [] for a 0-d tensor
  std::vector<int64_t> strides;  // in elements, one per dimension
  int64_t storage_offset = 0;    // in elements
  std::string storage;           // the zip entry holding its storage
  int64_t storage_numel = 0;     // elements in that storage

  int64_t numel() const;
};

class TorchStateDict {
 public:
  // NOT_FOUND for a missing file.
  static absl::StatusOr<TorchStateDict> Open(const std::string& path);

  const std::string& path() const { return zip_.path(); }
  const std::vector<TorchTensorInfo>& tensors() const { return tensors_; }
  const TorchTensorInfo* Find(const std::string& name) const;  // nullptr when absent

  // The whole storage the tensor views (storage_numel elements, little-endian); the tensor is
  // its elements at storage_offset + sum(index[d] * strides[d]).
  absl::StatusOr<std::string> ReadStorage(const TorchTensorInfo& tensor) const;
  // The elements of an integer tensor (I64 or I32; 0-d or 1-d) as int64: a module's buffers such
  // as a TopK's k. INVALID_ARGUMENT naming the tensor for another dtype or rank.
  absl::StatusOr<std::vector<int64_t>> ReadIntegers(const TorchTensorInfo& tensor) const;

 private:
  explicit TorchStateDict(ZipArchive zip) : zip_(std::move(zip)) {}

  ZipArchive zip_;
  std::vector<TorchTensorInfo> tensors_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TORCH_PICKLE_H_
