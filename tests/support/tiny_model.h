// The small transformer shapes the model, checkpoint, backend and CLI tests build: 4 heads sharing
// 2 KV heads (GQA), the other fields named at the call site.
#pragma once
#include <cstdint>

#include "model/transformer.h"

namespace nibble_test {

struct TinyModel {
  int64_t vocab = 0;
  int64_t layers = 0;
  int64_t width = 0;
  int64_t context = 0;
  int64_t mlp_hidden = 0;  // 0: ModelConfig's default (8/3 width)
};

inline nibble::model::ModelConfig tiny_model(const TinyModel& t) {
  nibble::model::ModelConfig m;
  m.vocab = t.vocab;
  m.layers = t.layers;
  m.heads = 4;
  m.kv_heads = 2;
  m.width = t.width;
  m.mlp_hidden = t.mlp_hidden;
  m.context = t.context;
  return m;
}

}  // namespace nibble_test
