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

// f(PagedT<E>) over a layer's cache [blocks, 2, block_size, kv_heads, D], E its element type.
inline bool is_kv_cache(const at::Tensor& cache, int64_t kv_heads, int64_t D) {
  const auto type = cache.scalar_type();
  return cache.is_contiguous() && cache.dim() == 5 && cache.size(3) == kv_heads &&
         cache.size(4) == D && (type == at::kFloat || type == at::kHalf || type == at::kBFloat16);
}

template <typename F>
inline void with_paged(const at::Tensor& cache, int64_t kv_heads, int64_t D, F&& f) {
  TORCH_CHECK(is_kv_cache(cache, kv_heads, D),
              "a KV cache is a contiguous float32, float16 or bfloat16 [blocks, 2, block_size, "
              "kv_heads, D] tensor");
  const int64_t block_size = cache.size(2);
  void* data = cache.data_ptr();
  switch (cache.scalar_type()) {
    case at::kHalf: f(PagedT<Half>(static_cast<Half*>(data), block_size, kv_heads, D)); break;
    case at::kBFloat16:
      f(PagedT<BFloat16>(static_cast<BFloat16*>(data), block_size, kv_heads, D));
      break;
    default: f(PagedT<float>(static_cast<float*>(data), block_size, kv_heads, D)); break;
  }
}

}  // namespace goodspeed
