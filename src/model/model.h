// A loaded model: its configuration, its weights and its forward pass as a list of operations.
// One subclass per architecture (model/arch/*.cpp) says which tensors it reads and which
// operations its layers run; everything else is shared.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward.h"
#include "model/layers.h"
#include "model/quantization.h"
#include "model/weight_source.h"

namespace duet {

// What Model::load reads. The default is the whole model, as a single rank needs it.
struct LoadOptions {
  // The routed experts to load, [expert_begin, expert_end) (expert parallelism: this rank's
  // range); expert_end -1 means n_expert. Every other tensor is always loaded.
  int64_t expert_begin = 0;
  int64_t expert_end = -1;
  // Also keep the matrices every token multiplies as panels (Matrix::panels) where matmul reads
  // them, for products of matmul_impl::kPanelMinTokens tokens or more, at the cost of a packed
  // copy of those matrices (as llama.cpp repacks its weights; its --no-repack is this false).
  bool repack = true;
  // --quantization: the weights quantized_at_load names are quantized as they load.
  Quantization quantization = Quantization::kNone;
  // --mmap: the other matrices are read in place in the files' mappings instead of copied into
  // huge pages (SourceOptions::mmap).
  bool mmap = false;
};

class Model {
 public:
  virtual ~Model() = default;

  // Reads MODEL_DIR (config.json + safetensors), validates every tensor, builds the operation
  // list. Throws duet::Error naming the file, tensor or field on bad input, or on an expert
  // range outside [0, n_expert).
  static std::unique_ptr<Model> load(const std::string& model_dir, const LoadOptions& opt = {});

  // The tensors (name, shape) a checkpoint of this configuration holds, in load order.
  static std::vector<RecordingSource::Request> list_weights(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  // The whole forward pass of a step in `mode` (decode or prefill): embedding, every layer, output
  // head. Built and checked (check_operations) once at load.
  const std::vector<Operation>& operations(
      ForwardMode mode, SharedExpertsAt shared_at = SharedExpertsAt::kDispatch) const;
  // Elements per position per layer in the KV store's k and v rows.
  virtual int64_t kv_k_width() const = 0;
  virtual int64_t kv_v_width() const = 0;
  // The element type the weight matrices are held in: kBF16 for a bf16 checkpoint, kF32 for an
  // f32 one (and for f16, widened at load). Read off the embedding table (checkpoints use one
  // dtype), which stays as stored whatever LoadOptions::quantization says.
  DType weight_dtype() const { return tok_embd_.dtype; }
  // What LoadOptions::quantization quantized.
  const QuantizationReport& quantization() const { return quantization_; }
  // Bytes of weights resident for this model (mapped, converted or packed).
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Of those, the bytes of the copies packed as panels at load (LoadOptions::repack).
  uint64_t panel_bytes() const { return panel_bytes_; }
  // Bytes of the weights every forward pass reads whatever the routing: attention, norms,
  // routers, dense and shared MLPs, the output head (not the embedding table, which is gathered
  // row by row, nor the routed experts, counted per step in ForwardState::expert_bytes_read).
  uint64_t dense_bytes_per_step() const { return dense_bytes_per_step_; }
  // Bytes of one routed expert (its three projections).
  uint64_t bytes_per_expert() const { return bytes_per_expert_; }
  // The routed experts this model holds, [expert_begin, expert_end): FfnWeights::experts[i] is
  // global expert expert_begin + i. All of them unless LoadOptions said otherwise.
  int64_t expert_begin() const { return expert_begin_; }
  int64_t expert_end() const { return expert_end_; }

 protected:
  explicit Model(const ModelConfig& config)
      : config_(config), expert_end_(config.n_expert) {}
  // Asks `src` for every tensor and keeps the views: load_embeddings, then each layer's
  // attention and ffn_[il], then load_output.
  virtual void load_weights(WeightSource& src) = 0;
  // The attention sublayer of layer il: s.x += attention(norm(s.x)).
  virtual void attention(ForwardState& s, int64_t il) const = 0;

  void load_embeddings(WeightSource& src);
  void load_output(WeightSource& src);

  ModelConfig config_;
  Matrix tok_embd_;                  // [n_vocab, n_embd]
  std::vector<FfnWeights> ffn_;      // [n_layer]
  const float* out_norm_ = nullptr;  // [n_embd]
  Matrix output_;                    // [n_vocab, n_embd] (tok_embd_ when tied)
  int64_t expert_begin_ = 0;         // the routed experts load_weights loads
  int64_t expert_end_ = 0;

 private:
  static std::unique_ptr<Model> create(const ModelConfig& config);
  void account_bytes(const std::map<std::string, uint64_t>& bytes_by_name);
  // embed, then per layer attention and the feed-forward operations, then the output head.
  void build_operations();

  std::unique_ptr<WeightSource> source_;  // keeps mapped files and conversions alive
  // By ForwardMode (kIdle's stay empty) and SharedExpertsAt.
  std::vector<Operation> ops_[3][std::size(kSharedExpertsAts)];
  uint64_t weight_bytes_ = 0;
  uint64_t panel_bytes_ = 0;
  uint64_t dense_bytes_per_step_ = 0;
  uint64_t bytes_per_expert_ = 0;
  QuantizationReport quantization_;
};

// Per-architecture factories (model/arch/*.cpp).
std::unique_ptr<Model> make_qwen3_moe(const ModelConfig& config);
std::unique_ptr<Model> make_deepseek_v2(const ModelConfig& config);
std::unique_ptr<Model> make_mixtral(const ModelConfig& config);

}  // namespace duet
