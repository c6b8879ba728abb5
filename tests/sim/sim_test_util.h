// A small hardware profile and model whose costs are easy to compute by hand.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "distca/sim.h"

namespace distca::sim_test {

// peak 1e12 FLOP/s, linear at 50%, attention efficiency 0.5 up to 128-token
// queries rising (linear in log2) to 1.0 at 1024, 2 bytes per element, two
// devices per node; intra-node 100 GB/s + 1 us, inter-node 10 GB/s + 10 us.
inline const char* kTestProfileJson = R"({
  "name": "test", "source": "hand-made for tests",
  "gpus_per_node": 2, "peak_flops": 1e12, "linear_mfu": 0.5,
  "attention_efficiency": [[128, 0.5], [1024, 1.0]],
  "dtype_bytes": 2, "memory_bytes": 1e12,
  "network": {"intra_node": {"bandwidth": 100e9, "latency_s": 1e-6},
              "inter_node": {"bandwidth": 10e9, "latency_s": 1e-5}}
})";

inline HardwareProfile TestProfile() {
  HardwareProfile p;
  EXPECT_TRUE(ParseHardwareProfile(kTestProfileJson, &p).ok());
  return p;
}

// h 64, 4 query heads of 16, 2 KV heads, ffn 128, vocab 256, 2 layers:
// linear forward FLOPs per token = 2*64*(2*64 + 2*32) + 6*64*128 = 73728.
inline ModelConfig TestModel() {
  ModelConfig m;
  m.name = "test";
  m.vocab_size = 256;
  m.num_layers = 2;
  m.hidden = 64;
  m.q_heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 128;
  return m;
}

// 4 devices as 2 ranks of tp 2 (G = 2), pp 1, L = 1024, B = 2 (m = 1);
// without the gradient sync, so that the strategies' schedules can be
// checked alone (GradSyncTest checks the sync).
inline SimOptions TestOptions() {
  SimOptions o;
  o.model = TestModel();
  o.hardware = TestProfile();
  o.gpus = 4;
  o.tp = 2;
  o.pp = 1;
  o.max_doc_len = 1024;
  o.batch_size = 2;
  o.threads = 1;
  o.grad_sync = false;
  return o;
}

}  // namespace distca::sim_test
