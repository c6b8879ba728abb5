// A small hardware profile and model whose costs are easy to compute by hand.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "distca/sim.h"

namespace distca::sim_test {

// Whether a status's message names `needle`.
inline bool Contains(const Status& s, const std::string& needle) {
  return s.message().find(needle) != std::string::npos;
}

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

// A measured table for the heads a tp-2 rank of TestModel runs (2 x 1 of
// 16) and its forward-only table, the forward share differing point to
// point: 256-row tasks against prefixes of 256 and 1024 (forward + backward
// 1 and 4 ms, forward 0.2 and 1.1; linear in between, so the four shards of
// a 1024 document under CP 2 cost 1, 2, 3, 4 ms and 0.2, 0.5, 0.8, 1.1) and
// the whole 1024 document (20 ms, forward 5).
inline constexpr const char* kSplitTableCsv = "q_len,kv_len,seconds\n256,256,1e-3\n256,1024,4e-3\n1024,1024,2e-2\n";
inline constexpr const char* kSplitForwardCsv = "q_len,kv_len,seconds\n256,256,2e-4\n256,1024,1.1e-3\n1024,1024,5e-3\n";

inline HardwareProfile SplitTableProfile() {
  HardwareProfile p = TestProfile();
  AttentionTable t{"split.csv", 2, 1, 16, 1.0, kSplitTableCsv};
  t.forward_file = "split-forward.csv";
  t.forward_csv = kSplitForwardCsv;
  EXPECT_TRUE(ValidateAttentionTable(t).ok());
  p.attention_tables = {t};
  return p;
}

// A measured table for the same heads (2 x 1 of 16) that charges a causal
// pair more the longer the task's prefix (1 + kv / 1024 ns): a plan even in
// FLOPs leaves the server of the long prefix slower than the others.
inline AttentionTable ByPrefixTable() {
  AttentionTable t{"by-prefix.csv",
                   2,
                   1,
                   16,
                   1.0,
                   "q_len,kv_len,seconds\n128,128,9.288e-06\n128,256,3.08e-05\n128,512,8.6112e-05\n"
                   "128,1024,0.000245888\n256,256,4.112e-05\n256,512,0.000147648\n"
                   "256,1024,0.000459008\n512,512,0.000196992\n512,1024,0.000786944\n"
                   "1024,1024,0.0010496\n"};
  EXPECT_TRUE(ValidateAttentionTable(t).ok());
  return t;
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
