#include "model/model.h"

#include "core/error.h"

namespace duet {

std::unique_ptr<Model> Model::create(const ModelConfig& config) {
  switch (config.arch) {
    case Arch::kQwen3Moe: return make_qwen3_moe(config);
    case Arch::kDeepseekV2:
    case Arch::kDeepseekV3: return make_deepseek_v2(config);
    case Arch::kMixtral: return make_mixtral(config);
  }
  DUET_ERROR("unknown architecture");
}

std::unique_ptr<Model> Model::load(const std::string& model_dir, const LoadOptions& opt) {
  ModelConfig config = load_config(model_dir);
  std::unique_ptr<Model> model = create(config);
  const int64_t end = opt.expert_end < 0 ? config.n_expert : opt.expert_end;
  if (opt.expert_begin < 0 || opt.expert_begin > end || end > config.n_expert ||
      (config.n_expert > 0 && opt.expert_begin == end)) {
    DUET_ERROR(model_dir << ": expert range [" << opt.expert_begin << ", " << end
                         << ") is not a non-empty part of the model's " << config.n_expert
                         << " experts");
  }
  model->expert_begin_ = opt.expert_begin;
  model->expert_end_ = end;
  auto src =
      std::make_unique<CheckpointSource>(model_dir, SourceOptions{.repack = opt.repack,
                                                                  .fp8 = config.fp8,
                                                                  .packed_int4 = config.packed_int4,
                                                                  .quantization = opt.quantization,
                                                                  .mmap = opt.mmap});
  model->load_weights(*src);
  for (FfnWeights& f : model->ffn_) f.first_expert = opt.expert_begin;
  model->weight_bytes_ = src->bytes_used();
  model->panel_bytes_ = src->packed_bytes();
  model->quantization_ = src->quantization_report();
  model->account_bytes(src->bytes_by_name());
  model->source_ = std::move(src);
  model->build_operations();
  return model;
}

void Model::account_bytes(const std::map<std::string, uint64_t>& bytes_by_name) {
  uint64_t experts = 0, n_experts = 0;
  for (const auto& [name, bytes] : bytes_by_name) {
    if (name.find(".experts.") != std::string::npos) {
      experts += bytes;
      if (name.ends_with(".down_proj.weight") || name.ends_with(".w2.weight")) ++n_experts;
    } else if (name != "model.embed_tokens.weight" || config_.tie_word_embeddings) {
      dense_bytes_per_step_ += bytes;
    }
  }
  bytes_per_expert_ = n_experts ? experts / n_experts : 0;
}

void Model::load_embeddings(WeightSource& src) {
  tok_embd_ = src.matrix("model.embed_tokens.weight", config_.n_vocab, config_.n_embd);
  if (tok_embd_.dtype == DType::kF8E4M3) {  // fp8 checkpoints keep them in bf16, as published
    throw Error("model.embed_tokens.weight: F8_E4M3 embeddings are not supported");
  }
  ffn_.resize(static_cast<size_t>(config_.n_layer));
}

void Model::load_output(WeightSource& src) {
  out_norm_ = src.vector("model.norm.weight", config_.n_embd);
  // Tied: the embedding table again, this time with panels for the products.
  output_ = src.matrix(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                       config_.n_vocab, config_.n_embd, Layout::kPanels);
}

void Model::build_operations() {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (ForwardMode mode : kForwardModes) {
    for (SharedExpertsAt at : kSharedExpertsAts) {
      // Both modes run the same lists today; the overlap strategies place their yields per mode.
      std::vector<Operation>& ops = ops_[static_cast<size_t>(mode)][static_cast<size_t>(at)];
      ops.clear();
      ops.push_back(
          {OpKind::kEmbed, -1, -1, [this](ForwardState& s) { embed_tokens(s, tok_embd_); }});
      for (int64_t il = 0; il < config_.n_layer; ++il) {
        ops.push_back({OpKind::kAttn, static_cast<int32_t>(il), -1,
                       [this, il](ForwardState& s) { attention(s, il); }});
        append_ffn_ops(ops, il, ffn_[il], config_.n_embd, eps, at);
      }
      ops.push_back({OpKind::kOutput, -1, -1, [this, eps](ForwardState& s) {
                       output_logits(s, out_norm_, eps, output_);
                     }});
      check_operations(ops);
    }
  }
}

const std::vector<Operation>& Model::operations(ForwardMode mode, SharedExpertsAt at) const {
  DUET_CHECK(mode != ForwardMode::kIdle, "no operation list for an idle step");
  return ops_[static_cast<size_t>(mode)][static_cast<size_t>(at)];
}

std::vector<RecordingSource::Request> Model::list_weights(const ModelConfig& config) {
  std::unique_ptr<Model> model = create(config);
  RecordingSource rec;
  model->load_weights(rec);
  return rec.requests();
}

}  // namespace duet
