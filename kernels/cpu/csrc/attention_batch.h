// A step's attention batch (decode_core.h) from the tensors CpuPagedBackend.plan builds, checked:
// slots [T] int64, block_tables [R, max_blocks] int32, tokens [T, 4] int32 (request, history
// length, index among the new tokens, number of new tokens), mask [T, max_q_len] uint8 or None.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "decode_core.h"

namespace goodspeed {

inline AttentionBatch attention_batch(const at::Tensor& slots, const at::Tensor& block_tables,
                                      const at::Tensor& tokens,
                                      const std::optional<at::Tensor>& mask, int64_t T) {
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T,
              "slots: int64 [T]");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.is_contiguous(), "tables");
  TORCH_CHECK(tokens.scalar_type() == at::kInt && tokens.is_contiguous() && tokens.dim() == 2 &&
                  tokens.size(0) == T && tokens.size(1) == 4,
              "tokens must be int32 [T, 4]");
  TORCH_CHECK(!mask || (mask->scalar_type() == at::kByte && mask->is_contiguous() &&
                        mask->dim() == 2 && mask->size(0) == T),
              "mask must be uint8 [T, max_q_len]");
  return AttentionBatch{slots.data_ptr<int64_t>(),
                        block_tables.data_ptr<int32_t>(),
                        block_tables.size(1),
                        tokens.data_ptr<int32_t>(),
                        mask ? mask->data_ptr<uint8_t>() : nullptr,
                        mask ? mask->size(1) : 0,
                        T};
}

}  // namespace goodspeed
