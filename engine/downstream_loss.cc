#include "engine/downstream_loss.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace latentd::engine {

namespace {

// Adds to *out ([rows, d_out]) what a cross-layer transcoder's earlier layers decode into its
// layer: codes[i] (layer i's latents) through earlier[i].W_dec.
void AddEarlierLayers(const std::vector<SplicedSae::EarlierLayer>& earlier,
                      const std::vector<SparseCodes>& codes, int64_t rows, at::Tensor* out) {
  for (size_t i = 0; i < earlier.size(); ++i) {
    out->add_(DecodeSparseCodes(earlier[i].W_dec, at::Tensor(), codes[i], rows));
  }
}

// circuit-tracer's replacement model up to layer `o` of a cross-layer transcoder: at each layer
// j <= L in forward order, its latents are encoded where the pass reaches its input hook (the
// pass as replaced so far), and its output hook is replaced by the sum of what layers 0..j
// decode into it. The returned splices share their codes through a vector they own.
HookSplices ReplacementSplices(const std::vector<SplicedSae>& saes, size_t o,
                               const std::function<at::Tensor(const at::Tensor&)>& rows_of) {
  std::vector<size_t> layers;  // outputs of layers 0..L, in layer order
  for (const SplicedSae::EarlierLayer& e : saes[o].earlier) layers.push_back(e.output);
  layers.push_back(o);
  auto codes = std::make_shared<std::vector<SparseCodes>>(layers.size());
  HookSplices splices;
  for (size_t j = 0; j < layers.size(); ++j) {
    const SplicedSae& layer = saes[layers[j]];
    splices.push_back({layer.hook, [codes, j, sae = layer.sae, rows_of](const at::Tensor& a) {
                         (*codes)[j] = sae->EncodeSparse(rows_of(a));
                         return a;
                       }});
    splices.push_back({layer.replaced(), [codes, j, &layer, rows_of](const at::Tensor& a) {
                         const int64_t rows = a.numel() / a.size(-1);
                         at::Tensor out = layer.sae->DecodeSparse((*codes)[j], rows);
                         AddEarlierLayers(layer.earlier, *codes, rows,
                                          &out);  // layer.earlier[i] is layer i
                         return out.view({a.size(0), a.size(1), -1}).to(a.scalar_type());
                       }});
  }
  return splices;
}

}  // namespace

absl::StatusOr<std::vector<latentd::v1::DownstreamLoss>> MeasureDownstreamLoss(
    ActivationModel& model, const std::vector<SplicedSae>& saes, const TokenSource& tokens,
    int64_t sequences, int64_t batch_sequences, const at::Device& device,
    const std::function<bool()>& cancelled) {
  if (const std::string why = model.next_token_loss_unsupported(); !why.empty()) {
    return absl::FailedPreconditionError(why);
  }
  const int64_t L = tokens.context_length();
  const int64_t total = tokens.num_sequences();
  sequences = std::min(sequences, total);
  // The i-th sequence measured: spread evenly over the shard.
  auto sampled = [&](int64_t i) { return i * total / std::max<int64_t>(sequences, 1); };
  batch_sequences = std::max<int64_t>(1, batch_sequences);
  double clean = 0;
  std::vector<double> with_sae(saes.size(), 0), ablated(saes.size(), 0), replaced(saes.size(), 0);
  // Outputs on one hook (several SAEs compared on a layer) share its zero-ablated pass.
  std::vector<size_t> ablation_of(saes.size());
  for (size_t o = 0; o < saes.size(); ++o) {
    ablation_of[o] = o;
    for (size_t e = 0; e < o; ++e) {
      if (SameActivation(saes[e].replaced(), saes[o].replaced())) {
        ablation_of[o] = e;
        break;
      }
    }
  }
  std::vector<int64_t> ids(batch_sequences * L);
  try {
    c10::InferenceMode inference;
    for (int64_t first = 0; first < sequences; first += batch_sequences) {
      if (cancelled && cancelled()) {
        return absl::CancelledError("cancelled while measuring the downstream loss");
      }
      const int64_t n = std::min(batch_sequences, sequences - first);
      for (int64_t i = 0; i < n; ++i) {
        RETURN_IF_ERROR(tokens.Read(sampled(first + i), 1, ids.data() + i * L));
      }
      const at::Tensor batch = at::from_blob(ids.data(), {n, L}, at::kLong).to(device);
      clean += model.NextTokenLossSum(batch, {});
      auto rows_of = [](const at::Tensor& a) { return a.to(at::kFloat).reshape({-1, a.size(-1)}); };
      for (size_t o = 0; o < saes.size(); ++o) {
        const Sae& sae = *saes[o].sae;
        const std::vector<SplicedSae::EarlierLayer>& earlier = saes[o].earlier;
        std::vector<SparseCodes> earlier_codes(earlier.size());
        HookSplices splices;
        for (size_t i = 0; i < earlier.size(); ++i) {  // they only look
          splices.push_back({earlier[i].hook, [&, i](const at::Tensor& a) {
                               earlier_codes[i] = earlier[i].sae->EncodeSparse(rows_of(a));
                               return a;
                             }});
        }
        HookSplice predicted{saes[o].replaced(), [&](const at::Tensor& a) {
                               const at::Tensor rows = rows_of(a);
                               at::Tensor out = sae.Predict(rows, sae.EncodeSparse(rows));
                               AddEarlierLayers(earlier, earlier_codes, rows.size(0), &out);
                               return out.view({a.size(0), a.size(1), -1}).to(a.scalar_type());
                             }};
        if (saes[o].hook_out) predicted.from = saes[o].hook;
        splices.push_back(std::move(predicted));
        with_sae[o] += model.NextTokenLossSum(batch, splices);
        if (saes[o].cross_layer) {
          replaced[o] += model.NextTokenLossSum(batch, ReplacementSplices(saes, o, rows_of));
        }
        if (ablation_of[o] != o) continue;
        const HookSplice zeroed{saes[o].replaced(),
                                [](const at::Tensor& a) { return at::zeros_like(a); }};
        ablated[o] += model.NextTokenLossSum(batch, {zeroed});
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("measuring the downstream loss: ", e.what_without_backtrace()));
  }
  const int64_t predictions = sequences * (L - 1);
  std::vector<latentd::v1::DownstreamLoss> out(saes.size());
  for (size_t o = 0; o < saes.size(); ++o) {
    latentd::v1::DownstreamLoss& d = out[o];
    d.set_predictions(predictions);
    if (predictions == 0) continue;
    d.set_clean(clean / predictions);
    d.set_with_sae(with_sae[o] / predictions);
    d.set_zero_ablated(ablated[ablation_of[o]] / predictions);
    const double gap = d.zero_ablated() - d.clean();
    d.set_recovered(gap != 0 ? (d.zero_ablated() - d.with_sae()) / gap : 0.0);
    d.set_recovered_unreliable(gap < 0.01 * std::abs(d.clean()));
    if (saes[o].cross_layer) d.set_with_layers_replaced(replaced[o] / predictions);
  }
  return out;
}

std::string DescribeRecovered(const latentd::v1::DownstreamLoss& loss) {
  if (loss.recovered_unreliable()) {
    return absl::StrFormat(
        "recovered not meaningful: zeroing the hook changes the loss by only %+.4f",
        loss.zero_ablated() - loss.clean());
  }
  return absl::StrFormat("%.1f%% recovered", 100 * loss.recovered());
}

}  // namespace latentd::engine
