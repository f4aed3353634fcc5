// The cfg.json + safetensors layout SAELens and sparsify ship SAEs in, read without torch so that
// submit-time validation stays cheap (it reads cfg.json and the safetensors header only).
//
// Accepted cfg.json fields: d_in, d_sae (sparsify: num_latents), architecture ("standard"/"relu",
// "topk", "jumprelu", "gated"; absent with a k means topk, as sparsify writes), the activation
// where it is named apart (SAELens 3-5's activation_fn_str, mats_sae_training's activation_fn,
// sparsify's activation: "topk" makes a "standard" SAE a TopK, "relu" changes nothing, others are
// refused), k (or activation_fn_kwargs.k), apply_b_dec_to_input (default true), hook_name (older
// SAELens: hook_point; sparsify: none, the directory's name is the module, e.g. layers.6),
// model_from_pretrained_kwargs.center_writing_weights, model_name, dtype, matryoshka_widths.
// Transcoders: SAELens' architectures "transcoder", "skip_transcoder", "jumprelu_transcoder" (and
// "topk_transcoder", "jumprelu_skip_transcoder", ...: an encoder, optionally "skip", then
// "transcoder") with d_out and hook_name_out; sparsify's transcode (+ skip_connection), whose
// directory names the MLP module (layers.6.mlp: it reads the MLP's input and predicts its output).
// A transcoder's W_dec is [d_sae, d_out], b_dec [d_out], W_skip [d_out, d_in].
// finetuning_scaling_factor (the weights then hold a tensor of that name [d_sae]);
// normalize_activations: "none" (default), or a per-token rescaling of the input that SAELens
// runs at inference (InputNormalization below), "constant_norm_rescale" or "layer_norm" (OpenAI's
// TopK SAEs as SAELens converts them).
// Refused (INVALID_ARGUMENT naming the field), because they change what the encoder computes in
// ways the file alone does not say: normalize_activations "expected_average_only_in" (its factor
// lives in SAELens' release directory, not in cfg.json), rescale_acts_by_decoder_norm true, and
// any normalization on a transcoder.
// Weights: sae_weights.safetensors, else the only *.safetensors file in the directory, holding
// W_enc [d_in, d_sae] (or sparsify's encoder.weight [d_sae, d_in]), b_enc (encoder.bias) [d_sae],
// W_dec [d_sae, d_in], b_dec [d_in], threshold [d_sae] for JumpReLU, and for Gated (SAELens'
// GatedSAE, Rajamanoharan et al. 2024) b_gate (in place of b_enc), r_mag and b_mag [d_sae];
// F32, F16, BF16 or F64.
// Gemma Scope's release layout is read too: a directory with params.npz (W_enc, W_dec, b_enc,
// b_dec, threshold; float32) and no cfg.json is a JumpReLU SAE with apply_b_dec_to_input false,
// d_in and d_sae from W_enc, and its hook from the path (.../gemma-scope-2b-pt-res/layer_20/...:
// blocks.20.hook_resid_post; -mlp: hook_mlp_out; -transcoders: a transcoder from
// blocks.20.ln2.hook_normalized to blocks.20.hook_mlp_out).
// Gemma Scope 2's layout (kGemmaScope2Params below) is read too: params.safetensors with w_enc and
// no cfg.json, its place (hook, transcoder) from the path.
// dictionary_learning's layout is read too: ae.pt + config.json and no cfg.json
// (StateDictClass; ParseDictionaryLearningConfig); and Goodfire's: a directory holding one .pth
// file (a state dict with encoder_linear.* and decoder_linear.*) and no config.
// lm-saes' layout (OpenMOSS; Llama Scope ships in it) is read too: a directory with
// hyperparams.json and no cfg.json, the weights in sae_weights.safetensors,
// checkpoints/pruned.safetensors or checkpoints/final.safetensors (encoder.weight [d_sae, d_in],
// encoder.bias, decoder.weight [d_in, d_sae], decoder.bias, and optionally a per-latent
// log_jumprelu_threshold); see LmSaesFold for what its fields mean and ParseLmSaesHyperparams for
// what is refused.
#ifndef LATENTD_ENGINE_SAE_CONFIG_H_
#define LATENTD_ENGINE_SAE_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/hook_name.h"

namespace latentd::engine {

enum class SaeArchitecture { kRelu, kTopK, kJumpRelu, kGated };
const char* SaeArchitectureName(SaeArchitecture a);  // "relu", "topk", "jumprelu", "gated"

// lm-saes encodes the hook's activations x as
//   pre = (x * s_in [- b_dec]) W_enc + b_enc,     z_j = pre_j * [pre_j * |d_j| > t_j]
// with s_in = sqrt(d_model) / dataset_average_activation_norm.in (1 when the weights were already
// standardised, norm_activation "inference"), |d_j| the norm of latent j's decoder direction when
// sparsity_include_decoder_norm (else 1), and decodes x_hat = (z W_dec + b_dec) / s_out.
// Sae::Load folds this into the SAELens form the encoders run: W_enc * s_in, threshold t_j / |d_j|
// (a latent whose decoder direction is zero never fires), W_dec and b_dec / s_out. pre and z are
// unchanged by the fold, so the stored latents are the values lm-saes itself gives.
struct LmSaesFold {
  double input_scale = 1.0;   // s_in
  double output_scale = 1.0;  // s_out (s_in for an SAE; a transcoder's output has its own)
  bool threshold_over_decoder_norm = true;  // sparsity_include_decoder_norm (lm-saes' default)
  bool decoder_bias = true;                 // use_decoder_bias: false means b_dec = 0
  // jump_relu_threshold, one for every latent (Llama Scope); unset when the weights carry
  // log_jumprelu_threshold [d_sae], which then wins.
  std::optional<double> threshold;
};

// What SAELens does to an SAE's input x [rows, d_in] before encoding it (and undoes on the
// reconstruction), a row at a time:
//   kConstantNormRescale: x' = x * c, c = sqrt(d_in) / |x|;  x_hat = x_hat' / c
//   kLayerNorm:           x' = (x - mu) / (sigma + 1e-5), mu the row's mean, sigma the standard
//                         deviation of x - mu with Bessel's correction (torch.std's default);
//                         x_hat = x_hat' * sigma + mu
// A row of zeros stays zeros under kConstantNormRescale (SAELens gives NaN there).
enum class InputNormalization { kNone, kConstantNormRescale, kLayerNorm };
// "none", "constant_norm_rescale", "layer_norm": cfg.json's spelling.
const char* InputNormalizationName(InputNormalization n);

// SAEs shipped as a torch.save'd state dict (engine/torch_pickle.h), by the module they are:
// dictionary_learning's (Marks et al.; SAEBench's releases ship in it) dictionary classes, read
// from ae.pt + config.json (its trainer's dict_class, activation_dim, dict_size, k, layer,
// lm_name, submodule_name), and Goodfire's (Llama 3.x SAEs, one .pth file and nothing else):
//   kAutoEncoder       relu((x - bias) enc^T + enc_b)           (encoder/decoder nn.Linear)
//   kAutoEncoderNew    relu(x enc^T + enc_b), decoded with the decoder's own bias
//   kTopK              AutoEncoderTopK: the k largest of that, ReLU'd (k from the state dict)
//   kBatchTopK         BatchTopKSAE at inference: relu(pre) * (relu(pre) > threshold), one
//                      threshold for every latent (a JumpReLU; without one, a ReLU)
//   kMatryoshkaBatchTopK  the same with W_enc/b_enc/W_dec/b_dec parameters
//   kJumpRelu          JumpReluAutoEncoder: relu(pre * (pre > threshold)) times each latent's
//                      decoder norm, b_dec not subtracted; decoded after dividing by that norm
//   kGated             GatedAutoEncoder: SAELens' Gated encoder (gate_bias, r_mag, mag_bias,
//                      decoder_bias subtracted first), times the decoder norm as kJumpRelu
//   kGoodfire          Goodfire's SparseAutoEncoder: kAutoEncoderNew's encoder under the names
//                      encoder_linear / decoder_linear
// Sae::Load folds each into the SAELens form (StateDictTensors names the tensors).
enum class StateDictClass {
  kAutoEncoder,
  kAutoEncoderNew,
  kTopK,
  kBatchTopK,
  kMatryoshkaBatchTopK,
  kJumpRelu,
  kGated,
  kGoodfire
};

// What a class is in the SAELens form: its encoder, the state dict's names for the SAELens roles
// ("" where it has none), and how they are laid out.
struct StateDictTensors {
  const char* module = "";  // for messages: "dictionary_learning's AutoEncoderTopK"
  SaeArchitecture architecture = SaeArchitecture::kRelu;
  bool apply_b_dec_to_input = true;
  const char* W_enc = "";
  const char* b_enc = "";
  const char* W_dec = "";
  const char* b_dec = "";
  const char* threshold = "";
  bool linear = false;               // nn.Linear weights: W_enc and W_dec stored transposed
  bool scalar_threshold = false;     // one threshold for all latents (BatchTopK's)
  bool decoder_norm_scaled = false;  // latents times their decoder norm (JumpRelu, Gated)
  const char* r_mag = "";            // Gated only
  const char* b_mag = "";
};
StateDictTensors StateDictTensorsOf(StateDictClass c);

inline constexpr char kDictionaryLearningWeights[] = "ae.pt";
inline constexpr char kDictionaryLearningConfig[] = "config.json";

// Which layer of a circuit-tracer release (engine/circuit_tracer.h) an SAE is: the job's hook
// picks it. A cross-layer transcoder's latents at `layer` write to every layer from it on, so
// its prediction of layer L sums the decoders of layers 0..L (LoadCrossLayerDecoder in sae.h);
// the SAE itself holds its own layer's decoder.
struct CircuitTracerLayer {
  int layer = 0;
  bool cross_layer = false;
  int n_layers = 0;  // layers in the release
};

struct SaeConfig {
  int64_t d_in = 0;
  int64_t d_sae = 0;
  SaeArchitecture architecture = SaeArchitecture::kTopK;
  int32_t k = 0;                     // TopK only; 1 <= k <= d_sae
  bool apply_b_dec_to_input = true;  // pre = (x' - b_dec) W_enc + b_enc when true
  // x' from the hook's x (SAELens' normalize_activations); the decoder gives x_hat' in x''s
  // units, Sae::Predict x_hat in x's.
  InputNormalization input_normalization = InputNormalization::kNone;
  // SAELens' finetuning_scaling_factor: the weights carry finetuning_scaling_factor [d_sae], by
  // which SAELens multiplies the latents before decoding them (the stored latents are the
  // unscaled ones). Sae::Load folds it into W_dec's rows.
  bool finetuning_scaling_factor = false;
  std::string hook_name;   // informational
  std::string model_name;  // informational
  // SAELens' model_from_pretrained_kwargs.center_writing_weights: whether the model the SAE was
  // trained on had TransformerLens' centering (unset when cfg.json does not say).
  std::optional<bool> center_writing_weights;
  // A Matryoshka SAE's level widths (cfg.json "matryoshka_widths", as SAELens writes them):
  // informational, the latents are ordered coarse to fine; empty for others.
  std::vector<int64_t> matryoshka_widths;
  // Set for lm-saes' layout: how Sae::Load turns its weights into the form above.
  std::optional<LmSaesFold> lm_saes;

  // Transcoders (Dunefsky et al. 2024; Ge et al. 2024) encode one hook and predict another:
  // the latents read hook_name (d_in wide, never with b_dec subtracted, which lives on the
  // output side) and the decoder predicts hook_name_out (d_out wide; empty: the MLP output of
  // hook_name's block, where every public transcoder writes). W_dec is [d_sae, d_out], b_dec
  // [d_out]; a skip transcoder adds x W_skip^T (W_skip [d_out, d_in]) to its prediction.
  bool transcoder = false;
  bool skip = false;
  int64_t d_out = 0;  // transcoders only; see OutWidth()
  std::string hook_name_out;

  // Set for a layer of a circuit-tracer release (a transcoder).
  std::optional<CircuitTracerLayer> circuit_tracer;
  // Set for an SAE read from a torch.save'd state dict (dictionary_learning's ae.pt, Goodfire's
  // .pth): which module it is.
  std::optional<StateDictClass> state_dict_class;

  // A crosscoder (dictionary_learning's CrossCoder / BatchTopKCrossCoder as
  // PyTorchModelHubMixin saves them, TRAIN's among them: model.safetensors + config.json with
  // num_encoder_layers): the hooks it reads; 0 for others. It is read as an SAE over those hooks'
  // activations side by side (d_in = crosscoder_sources x each hook's width, never subtracting
  // b_dec): encoder.weight [n, d, F] is W_enc [n d, F], decoder.weight [n, F, d] is W_dec
  // [F, n d]; BatchTopKCrossCoder keeps relu(pre)_j when relu(pre)_j c_j > t (c_j the sum of its
  // decoder norms), which is a JumpReLU with threshold t / c_j, as Sae::Load folds it.
  int crosscoder_sources = 0;
  // The crosscoder's sources' hooks, from latentd.json (empty when it has none): informational.
  std::vector<std::string> crosscoder_hooks;
  // Each source's training scale, from latentd.json (the factor TRAIN brought the source's rows
  // to a mean norm of sqrt(d) by, folded into the saved weights); empty when it has none.
  // Decoder norms times these are the ones training compared (a latent's share per source).
  std::vector<double> crosscoder_scales;

  // The width of what the decoder gives: d_out for a transcoder, d_in for an SAE.
  int64_t OutWidth() const { return transcoder ? d_out : d_in; }
};

absl::StatusOr<SaeConfig> ParseSaeConfigJson(const std::string& text);

// How latentd reads an SAE where its file asks for more than the plain encoder (an input
// normalization, dictionary_learning's class), in words for the job's log; "" otherwise.
std::string DescribeSaeReading(const SaeConfig& cfg);

// The hook a transcoder reading `input` predicts: cfg.hook_name_out, else the MLP output of
// input's block; INVALID_ARGUMENT for a transcoder on a hidden state that names none.
absl::StatusOr<std::string> TranscoderOutputHook(const SaeConfig& cfg, const HookName& input);
std::string SaeConfigToJson(const SaeConfig& cfg);

inline constexpr char kGemmaScopeParams[] = "params.npz";
// Gemma Scope 2's (Gemma 3's SAEs and transcoders): .../resid_post/layer_22_width_16k_l0_medium/
// params.safetensors with w_enc [d_in, d_sae], w_dec [d_sae, d_out], b_enc, b_dec, threshold
// and, for an affine-skip transcoder, affine_skip_connection [d_in, d_out] (x times it is added).
// z = relu(pre) * (pre > threshold): Sae::Load raises negative thresholds to 0, which gives the
// same latents through latentd's JumpReLU.
inline constexpr char kGemmaScope2Params[] = "params.safetensors";
inline constexpr char kLmSaesHyperparams[] = "hyperparams.json";

// lm-saes' hyperparams.json. Required, because lm-saes' defaults changed between its versions:
// d_model, hook_point_in, act_fn ("jumprelu", "relu"; "topk" with top_k only without
// sparsity_include_decoder_norm, which would rank pre * |d_j|), norm_activation ("dataset-wise"
// with dataset_average_activation_norm {"in", "out"} or keyed by the hook points, or
// "inference"), apply_decoder_bias_to_pre_encoder. Optional: d_sae (else d_model *
// expansion_factor), hook_point_out (= hook_point_in; a different one makes a transcoder, which
// must not apply_decoder_bias_to_pre_encoder), use_decoder_bias (true),
// sparsity_include_decoder_norm (true), jump_relu_threshold, model_name. Refused, naming the
// field: norm_activation "token-wise" / "batch-wise" (a scale per row or batch), act_fn
// "batchtopk" (a row's latents would depend on its batch), use_glu_encoder true.
absl::StatusOr<SaeConfig> ParseLmSaesHyperparams(const std::string& text);

// dictionary_learning's config.json: {"trainer": {"dict_class", "activation_dim", "dict_size",
// "k", "layer", "lm_name", "submodule_name", ...}}. The hook comes from submodule_name
// ("resid_post_layer_12": blocks.12.hook_resid_post; mlp_out_, attn_out_ too). A dict_class
// other than StateDictClass's is INVALID_ARGUMENT naming it. d_in, d_sae and k are
// checked (and k read) against ae.pt by ReadAndCheckSae.
absl::StatusOr<SaeConfig> ParseDictionaryLearningConfig(const std::string& text);

// Where the weights of the SAE in `dir` are (see above; params.npz when the directory has no
// safetensors file; lm-saes' checkpoints/ files for its layout; in a circuit-tracer release the
// encoder's file of `hook`'s layer). NOT_FOUND when there are none.
absl::StatusOr<std::string> FindSaeWeightsFile(const std::string& dir,
                                               const std::optional<HookName>& hook = std::nullopt);

// Reads dir/cfg.json (or Gemma Scope's params.npz, or lm-saes' hyperparams.json) and checks the
// safetensors header of the weights file against it: every tensor present with the shape the config
// implies. INVALID_ARGUMENT naming the mismatch. A circuit-tracer release (circuit_tracer.h)
// holds a transcoder per layer: `hook`, the hook the job reads, picks its layer (without one,
// INVALID_ARGUMENT). Refused there, naming the field: activation topk (circuit-tracer keeps the
// k largest pre-activations even when negative, latentd's TopK the positive ones), an output hook
// latentd does not compute, a layer the release lacks, transcoders listed as files elsewhere.
absl::StatusOr<SaeConfig> ReadAndCheckSae(const std::string& dir,
                                          const std::optional<HookName>& hook = std::nullopt);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SAE_CONFIG_H_
