// The ping-pong executor: runs disaggregated core attention for a stack of
// layers over nano-batches so that one nano-batch's CA traffic overlaps the
// other's compute (DESIGN.md section 2).
//
// The model plugs in through LayerCallbacks and the executor knows nothing
// about it. Per layer l, forward, with nano-batches A and B:
//
//   compute thread:  before(A) | before(B) | serve A's CA | serve B's CA | after(A) | after(B)
//   comm thread:          A's Q/K/V out    B's Q/K/V out   A's O back     B's O back
//
// Each transfer is a future: compute waits only on the transfer it needs,
// never on a global barrier. A per-rank comm thread waits on the transfers
// (OpenMPI 4.1 makes no progress in the background). Backward mirrors this
// over the layers in reverse. With ping-pong off (or one nano-batch) every
// nano-batch runs its phases back to back; results are bit-identical.
#pragma once

#include <memory>
#include <vector>

#include "distca/comm.h"
#include "distca/plan.h"
#include "distca/runtime.h"
#include "distca/trace.h"

namespace distca {

// Buffers are in the nano-batch's local layout on this rank
// (AttentionDispatcher::LocalRow), fp32: q (rows, Hq, D), k and v
// (rows, Hkv, D), out (rows, Hq, D), lse (Hq, rows).
class LayerCallbacks {
 public:
  virtual ~LayerCallbacks() = default;
  // Forward: produce layer l's Q, K, V for nano-batch n.
  virtual Status BeforeAttention(int layer, int nano, float* q, float* k, float* v) = 0;
  // Forward: consume layer l's attention output for nano-batch n.
  virtual Status AfterAttention(int layer, int nano, const float* out, const float* lse) = 0;
  // Backward: produce dL/dO of layer l for nano-batch n.
  virtual Status BeforeAttentionBackward(int layer, int nano, float* dout) = 0;
  // Backward: consume dL/dQ, dL/dK, dL/dV of layer l for nano-batch n.
  virtual Status AfterAttentionBackward(int layer, int nano, const float* dq, const float* dk, const float* dv) = 0;
};

struct PingPongOptions {
  int layers = 1;
  bool ping_pong = true;     // Default: overlap; false runs nano-batches back to back
  DispatchOptions dispatch;  // heads, head_dim, backward mode, CA engine settings
  Tracer* tracer = nullptr;  // Default: no tracing
};

// Where a rank's time went in the last Forward + Backward.
struct ExecutorTimes {
  double attention_seconds = 0.0;     // Serve phases: this rank's CA tasks as a server
  double pack_seconds = 0.0;          // Start and Finish phases: packing and placing rows
  double exposed_comm_seconds = 0.0;  // compute thread blocked on transfers (not hidden)
  double transfer_seconds = 0.0;      // sum over transfers of posting-to-completion time
};

class PingPongExecutor {
 public:
  // One plan per nano-batch, identical on every rank; `comm` must have each
  // plan's servers() ranks and outlive the executor.
  static Status Create(Comm* comm, std::vector<Plan> nano_plans, const PingPongOptions& options,
                       std::unique_ptr<PingPongExecutor>* out);
  ~PingPongExecutor();

  int nano_batches() const;
  const AttentionDispatcher& dispatcher(int nano) const;
  int64_t local_tokens(int nano) const;

  // All layers forward; keeps what backward needs (per layer and nano-batch).
  Status Forward(LayerCallbacks& callbacks);
  // All layers backward, last layer first. Needs a preceding Forward that
  // completed, one Backward per Forward (else FailedPrecondition).
  Status Backward(LayerCallbacks& callbacks);

  // Seconds the compute thread spent waiting on transfers in the last
  // Forward + Backward (communication that was not hidden).
  double exposed_comm_seconds() const;
  const ExecutorTimes& times() const;

  class Impl;

 private:
  explicit PingPongExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace distca
