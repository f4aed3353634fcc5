#include "engine/intervener.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/status_macros.h"
#include "engine/decoder_writes.h"
#include "engine/sae.h"
#include "engine/sparse_codes.h"

namespace latentd::engine {

std::vector<at::Tensor> ActivationsBeside(const SteeringModel& steering, const at::Tensor& tokens,
                                          std::vector<KeyValueCache>* caches) {
  const std::vector<SteeringModel::SourceModel>& sources = steering.diffed_models;
  const int64_t rows = tokens.size(0);
  // Rows that all read the same tokens from the same past (the prompt's pass: clean, steered
  // and swept rows alike) run once, their activation and cache copied to every row.
  const bool same = rows > 1 &&
                    (caches == nullptr || caches->empty() ||
                     std::all_of(caches->begin(), caches->end(),
                                 [](const KeyValueCache& c) { return c.positions == 0; })) &&
                    tokens.eq(tokens.narrow(0, 0, 1)).all().item<bool>();
  const at::Tensor run = same ? tokens.narrow(0, 0, 1) : tokens;
  std::vector<at::Tensor> beside(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    if (static_cast<int>(s) == steering.diffed_source) continue;
    KeyValueCache* cache = caches != nullptr ? &(*caches)[s] : nullptr;
    beside[s] =
        sources[s].model->ForwardSpliced(run, {sources[s].hook}, {}, cache)[0].to(at::kFloat);
    if (!same) continue;
    beside[s] = beside[s].expand({rows, -1, -1});
    if (cache == nullptr) continue;
    for (std::vector<at::Tensor>* held : {&cache->keys, &cache->values}) {
      for (at::Tensor& t : *held) {
        if (t.defined()) t = t.expand({rows, -1, -1, -1});
      }
    }
  }
  return beside;
}

at::Tensor CrosscoderInputBeside(const SteeringModel& steering,
                                 const std::vector<at::Tensor>& beside, const at::Tensor& x) {
  std::vector<at::Tensor> blocks = beside;
  blocks[steering.diffed_source] = x.to(at::kFloat);
  return at::cat(blocks, 2);
}

Intervener::Intervener(const SteeringModel& steering,
                       const std::vector<LatentIntervention>& interventions,
                       const std::vector<std::vector<float>>& values)
    : steering_(steering), interventions_(interventions) {
  for (const std::vector<float>& by_row : values) {
    values_.push_back(at::tensor(by_row).unsqueeze(1));  // [changed rows, 1]
  }
  for (const LatentIntervention& in : interventions) column_.emplace(in.latent, 0);
  std::vector<int64_t> latents;
  for (auto& [latent, column] : column_) {
    column = static_cast<int64_t>(latents.size());
    latents.push_back(latent);
  }
  latents_ = at::tensor(latents, at::TensorOptions().dtype(at::kLong));
}

absl::StatusOr<std::unique_ptr<Intervener>> Intervener::Joining(
    const SteeringModel& steering, const std::vector<LatentIntervention>& interventions,
    const std::vector<std::vector<float>>& values, HookSplices* splices) {
  auto intervener = std::make_unique<Intervener>(steering, interventions, values);
  RETURN_IF_ERROR(intervener->Init());
  for (HookSplice& splice : intervener->Splices()) splices->push_back(std::move(splice));
  return intervener;
}

absl::Status Intervener::Init() {
  ASSIGN_OR_RETURN(rows_, WrittenRows(steering_, latents_));
  return absl::OkStatus();
}

HookSplices Intervener::Splices() {
  HookSplices splices;
  if (steering_.crosscoder_sources.empty()) {
    splices.push_back({steering_.hook, [this](const at::Tensor& x) {
                         Change(InputAtHook(x));
                         return x;
                       }});
  }
  const std::vector<HookName> hooks = WrittenHooks(steering_);
  for (size_t h = 0; h < hooks.size(); ++h) {
    splices.push_back({hooks[h], [this, h](const at::Tensor& out) { return Changed(out, h); }});
  }
  return splices;
}

void Intervener::BeforePass(ActivationModel& model, const at::Tensor& tokens,
                            const KeyValueCache& cache) {
  const std::vector<SteeringModel::SourceModel>& sources = steering_.diffed_models;
  if (!sources.empty()) {
    if (first_position_ == 0) beside_caches_.assign(sources.size(), KeyValueCache());
    for (size_t s = 0; s < sources.size(); ++s) {
      TORCH_CHECK(static_cast<int>(s) == steering_.diffed_source ||
                      beside_caches_[s].positions == first_position_,
                  "source ", s, "'s model holds ", beside_caches_[s].positions,
                  " positions, the pass starts at ", first_position_);
    }
    beside_ = ActivationsBeside(steering_, tokens, &beside_caches_);
    return;
  }
  if (steering_.crosscoder_sources.empty()) return;
  KeyValueCache copy = cache;
  const std::vector<at::Tensor> read =
      model.ForwardSpliced(tokens, WrittenHooks(steering_), {}, &copy);
  const std::vector<int64_t> blocks = WrittenBlocks(steering_);
  std::vector<at::Tensor> by_block(read.size());
  for (size_t h = 0; h < read.size(); ++h) by_block[blocks[h]] = read[h].to(at::kFloat);
  Change(at::cat(by_block, 2));
}

at::Tensor Intervener::InputAtHook(const at::Tensor& x) const {
  return steering_.diffed_models.empty() ? x : CrosscoderInputBeside(steering_, beside_, x);
}

void Intervener::Change(const at::Tensor& in) {
  const int64_t runs = in.size(0) - 1, seq = in.size(1);
  const Sae& sae = *steering_.sae;
  const at::Tensor x = in.narrow(0, 1, runs).to(at::kFloat).reshape({runs * seq, -1});
  // A crosscoder over models steered alone cannot encode one model's activation; its
  // interventions all add, so z' - z is known without z (taken as 0 here) and the output scale
  // is 1 (SteerPrompt refuses a normalizing one).
  const bool alone = AddedAlone();
  const at::Tensor z = alone ? at::zeros({runs, seq, latents_.size(0)}, x.options())
                             : CodeValues(sae.EncodeSparse(x), runs * seq, latents_)
                                   .view({runs, seq, latents_.size(0)});
  if (!first_values_.defined() && !alone) {
    first_values_ = z[0];  // every row's input is the clean one
  }
  at::Tensor changed = z.clone();
  for (size_t i = 0; i < interventions_.size(); ++i) {
    const LatentIntervention& change = interventions_[i];
    at::Tensor column = changed.select(2, column_.at(change.latent));  // [runs, seq]
    at::Tensor positions;
    if (!change.positions.empty()) {
      std::vector<int64_t> here;  // its positions among this pass's
      for (int64_t p : change.positions) {
        if (p >= first_position_ && p < first_position_ + seq) here.push_back(p - first_position_);
      }
      if (here.empty()) continue;
      positions = at::tensor(here, at::TensorOptions().dtype(at::kLong));
      column = column.index_select(1, positions);  // a copy, written back below
    }
    const at::Tensor& value = values_[i];  // per row
    switch (change.mode) {
      case InterventionMode::kSet:
        column.copy_(value.expand_as(column));
        break;
      case InterventionMode::kAdd:
        column.add_(value);
        break;
      case InterventionMode::kScale:
        column.mul_(value);
        break;
    }
    if (positions.defined()) {
      changed.select(2, column_.at(change.latent)).index_copy_(1, positions, column);
    }
  }
  delta_ = (changed - z).view({runs * seq, -1});
  if (!alone) delta_ = delta_ * sae.DecoderOutputScale(x);
}

at::Tensor Intervener::Changed(const at::Tensor& out, size_t h) const {
  const int64_t runs = out.size(0) - 1, seq = out.size(1);
  at::Tensor changed = out.clone();
  changed.narrow(0, 1, runs).add_(delta_.mm(rows_[h]).view({runs, seq, -1}).to(out.scalar_type()));
  return changed;
}

}  // namespace latentd::engine
