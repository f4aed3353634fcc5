// A TorchScript module exported from Python whose forward(tokens: int64 [batch, seq]) returns the
// hidden states as a tuple or list of [batch, seq, d] tensors (Hugging Face output_hidden_states);
// the hook picks one by index (hook_name.h: hidden_states.N, blocks.L.hook_resid_pre/post).
// The whole forward runs (TorchScript gives no early exit); docs/EXTRACT.md shows the export.
#ifndef LATENTD_ENGINE_TORCHSCRIPT_MODEL_H_
#define LATENTD_ENGINE_TORCHSCRIPT_MODEL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/activation_model.h"
#include "engine/hook_name.h"

namespace latentd::engine {

struct TorchScriptModelOptions {
  std::string path;
  int64_t vocab_size = 0;  // 0: unknown, no token-id check
};

// Loads the module onto `device` and runs one probe forward (a [1, 2] batch of token 0) to learn
// how many hidden states it returns and their width. INVALID_ARGUMENT for a file that is not a
// TorchScript module, a forward that does not return a tuple/list of 3-D tensors, or a hook index
// out of range; NOT_FOUND for a missing file.
absl::StatusOr<std::unique_ptr<ActivationModel>> LoadTorchScriptModel(
    const TorchScriptModelOptions& options, const HookName& hook, const at::Device& device);
// Several hooks (at least one), all read from the one forward pass (ForwardHooks).
absl::StatusOr<std::unique_ptr<ActivationModel>> LoadTorchScriptModel(
    const TorchScriptModelOptions& options, const std::vector<HookName>& hooks,
    const at::Device& device);

// A hash of the file's bytes ("fnv1a64:..."), the dataset's model_weight_hash.
absl::StatusOr<std::string> HashFile(const std::string& path);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TORCHSCRIPT_MODEL_H_
