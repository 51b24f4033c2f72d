#include "model/quantization.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace duet {
namespace {

TEST(QuantizationTest, ParsesNoneInt8AndInt4AndRefusesOthersByName) {
  EXPECT_EQ(parse_quantization("none"), Quantization::kNone);
  EXPECT_EQ(parse_quantization("int8"), Quantization::kInt8);
  EXPECT_EQ(parse_quantization("int4"), Quantization::kInt4);
  EXPECT_EQ(parse_quantization("int4_pure"), Quantization::kInt4Pure);
  for (Quantization q : {Quantization::kInt8, Quantization::kInt4, Quantization::kInt4Pure})
    EXPECT_EQ(parse_quantization(quantization_name(q)), q);
  for (const char* bad : {"", "INT8", "int2", "q4_0", "int4-pure", "int8_pure"}) {
    try {
      parse_quantization(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--quantization ") + bad + ": expected none, int8, int4 or int4_pure");
    }
  }
}

// int4 keeps the output head at int8 (as llama-quantize keeps Q4_0's at Q6_K); int4_pure does not.
TEST(QuantizationTest, Int4KeepsTheOutputHeadAtInt8AndInt4PureDoesNot) {
  const char* layers[] = {"model.layers.0.mlp.experts.3.gate_proj.weight",
                          "model.layers.0.self_attn.q_proj.weight",
                          "model.layers.1.mlp.shared_experts.down_proj.weight"};
  for (const char* name : layers) {
    EXPECT_EQ(quantized_dtype(Quantization::kInt8, name), DType::kQ8) << name;
    EXPECT_EQ(quantized_dtype(Quantization::kInt4, name), DType::kQ4) << name;
    EXPECT_EQ(quantized_dtype(Quantization::kInt4Pure, name), DType::kQ4) << name;
  }
  EXPECT_EQ(quantized_dtype(Quantization::kInt8, "lm_head.weight"), DType::kQ8);
  EXPECT_EQ(quantized_dtype(Quantization::kInt4, "lm_head.weight"), DType::kQ8);
  EXPECT_EQ(quantized_dtype(Quantization::kInt4Pure, "lm_head.weight"), DType::kQ4);
  // A layer whose name merely contains the head's is a layer.
  EXPECT_EQ(quantized_dtype(Quantization::kInt4, "model.mtp.lm_head.weight"), DType::kQ4);
  EXPECT_THROW(quantized_dtype(Quantization::kNone, "lm_head.weight"), Error);
}

TEST(QuantizationTest, QuantizesLinearLayersButNotEmbeddingsRoutersOrKvB) {
  for (const char* name :
       {"model.layers.0.mlp.experts.3.gate_proj.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.mlp.shared_experts.up_proj.weight",
        "model.layers.0.block_sparse_moe.experts.1.w2.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "lm_head.weight"}) {
    EXPECT_TRUE(quantized_at_load(name)) << name;
  }
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.mlp.gate.weight",
                           "model.layers.0.block_sparse_moe.gate.weight",
                           "model.layers.2.self_attn.kv_b_proj.weight"}) {
    EXPECT_FALSE(quantized_at_load(name)) << name;
  }
}

TEST(QuantizationTest, DescribesWhatWasQuantized) {
  EXPECT_EQ(describe(QuantizationReport{}), "none");
  EXPECT_EQ(describe({Quantization::kInt8, 3, 2 << 20, 1 << 20}),
            "int8: 3 matrices, 2.0 MiB -> 1.0 MiB");
  EXPECT_EQ(describe({Quantization::kInt4, 3, 4 << 20, 1 << 20}),
            "int4 (output head int8): 3 matrices, 4.0 MiB -> 1.0 MiB");
  EXPECT_EQ(describe({Quantization::kInt4Pure, 3, 4 << 20, 1 << 20}),
            "int4_pure: 3 matrices, 4.0 MiB -> 1.0 MiB");
}

}  // namespace
}  // namespace duet
