// The ping-pong executor (include/distca/pingpong.h).
#include "distca/pingpong.h"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "common/timer.h"

namespace distca {
namespace {

// A thread that runs submitted jobs in order: the rank's comm thread.
class CommThread {
 public:
  CommThread() : thread_([this] { Loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::shared_future<Status> Submit(std::function<Status()> job) {
    std::packaged_task<Status()> task(std::move(job));
    std::shared_future<Status> f = task.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(task));
    }
    cv_.notify_all();
    return f;
  }

 private:
  void Loop() {
    while (true) {
      std::packaged_task<Status()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<Status()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

// Adds the seconds of its lifetime to *total.
class PhaseTimer {
 public:
  explicit PhaseTimer(double* total) : total_(total) {}
  ~PhaseTimer() { *total_ += timer_.Seconds(); }

 private:
  double* total_;
  WallTimer timer_;
};

// What one nano-batch keeps for one layer between forward and backward.
struct LayerState {
  AttentionContext ctx;
  std::vector<float> q, k, v, out, lse;
};

struct Nano {
  std::unique_ptr<AttentionDispatcher> dispatcher;
  std::vector<LayerState> layers;
  std::vector<float> dout, dq, dk, dv;  // backward scratch
  std::shared_future<Status> transfer;
};

}  // namespace

class PingPongExecutor::Impl {
 public:
  Comm* comm = nullptr;
  PingPongOptions options;
  std::vector<Nano> nanos;
  ExecutorTimes times;
  CommThread comm_thread;

  // Posts nano-batch n's pending exchange to the comm thread.
  void Track(int n, const std::string& name) {
    AttentionContext* ctx = nullptr;
    ctx = current_ctx_[n];
    const int64_t bytes = AttentionDispatcher::PendingTransferBytes(ctx);
    Tracer* tracer = options.tracer;
    const int rank = comm->rank();
    // Only the comm thread writes transfer_seconds; the compute thread reads
    // it after every transfer's future has been awaited.
    double* transfer_seconds = &times.transfer_seconds;
    nanos[n].transfer = comm_thread.Submit([ctx, tracer, rank, name, bytes, transfer_seconds] {
      Tracer::Scope span(tracer, rank, "comm", name, bytes);
      WallTimer t;
      // Poll rather than block: MPI's blocking waits spin, and this thread
      // shares the rank's core with compute. Each Test drives progress.
      while (!AttentionDispatcher::TestTransfer(ctx)) std::this_thread::sleep_for(std::chrono::microseconds(50));
      Status s = AttentionDispatcher::WaitTransfer(ctx);
      *transfer_seconds += t.Seconds();
      return s;
    });
  }

  // Waits for nano-batch n's transfer on the compute thread; the wait is
  // the communication that was not hidden.
  Status Await(int n, const std::string& name) {
    Tracer::Scope span(options.tracer, comm->rank(), "compute", "wait " + name);
    WallTimer t;
    Status s = nanos[n].transfer.get();
    times.exposed_comm_seconds += t.Seconds();
    return s;
  }

  std::string Name(const char* what, int n, int layer) const { return fmt::format("{} n{} l{}", what, n, layer); }
  // Where an error happened, for its message.
  static std::string Where(const char* what, int n, int layer) {
    return fmt::format("layer {}, nano-batch {}, {}", layer, n, what);
  }

  // After a failure: waits for every transfer still posted, so that none
  // outlives the call that posted it (the next call reuses the contexts the
  // comm thread polls, and the times its jobs add to). A transfer whose
  // peers stopped ends at the local backend's timeout; under MPI it cannot
  // hang, since every rank posts the exchanges in the same order (a live
  // peer has posted what this rank waits for) and a failing rank aborts the
  // job.
  Status Drain(Status s) {
    for (Nano& nano : nanos)
      if (nano.transfer.valid()) nano.transfer.wait();
    return s;
  }

  // Runs one group of a pass. An exception (a callback's, or std::bad_alloc
  // from a buffer) is drained like an error, so that no transfer outlives
  // the call either way, and becomes an error naming the layer and pass (the
  // contexts stay usable: a phase that does not complete leaves its context
  // idle).
  template <class GroupFn>
  Status RunGroup(GroupFn&& group, const char* pass, int layer) {
    Status s;
    try {
      s = group();
    } catch (const std::exception& e) {
      s = Status::Internal(fmt::format("layer {}, {}: exception: {}", layer, pass, e.what()));
    } catch (...) {
      s = Status::Internal(fmt::format("layer {}, {}: unknown exception", layer, pass));
    }
    return s.ok() ? s : Drain(std::move(s));
  }

  Status ForwardGroup(LayerCallbacks& cb, int layer, const std::vector<int>& group) {
    const int rank = comm->rank();
    for (int n : group) {
      Nano& nano = nanos[n];
      LayerState& st = nano.layers[layer];
      current_ctx_[n] = &st.ctx;
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("before attention", n, layer));
        DISTCA_RETURN_IF_ERROR(cb.BeforeAttention(layer, n, st.q.data(), st.k.data(), st.v.data())
                                   .WithContext(Where("before attention", n, layer)));
      }
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("pack Q/K/V", n, layer));
        PhaseTimer phase(&times.pack_seconds);
        DISTCA_RETURN_IF_ERROR(nano.dispatcher->StartForward(*comm, st.q.data(), st.k.data(), st.v.data(), &st.ctx)
                                   .WithContext(Where("StartForward", n, layer)));
      }
      Track(n, Name("Q/K/V to servers", n, layer));
    }
    for (int n : group) {
      DISTCA_RETURN_IF_ERROR(Await(n, Name("Q/K/V", n, layer)).WithContext(Where("Q/K/V to servers", n, layer)));
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("serve attention", n, layer));
        PhaseTimer phase(&times.attention_seconds);
        DISTCA_RETURN_IF_ERROR(nanos[n]
                                   .dispatcher->ServeForward(*comm, &nanos[n].layers[layer].ctx)
                                   .WithContext(Where("ServeForward", n, layer)));
      }
      Track(n, Name("O to owners", n, layer));
    }
    for (int n : group) {
      DISTCA_RETURN_IF_ERROR(Await(n, Name("O", n, layer)).WithContext(Where("O to owners", n, layer)));
      LayerState& st = nanos[n].layers[layer];
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("unpack O", n, layer));
        PhaseTimer phase(&times.pack_seconds);
        DISTCA_RETURN_IF_ERROR(nanos[n]
                                   .dispatcher->FinishForward(*comm, st.out.data(), st.lse.data(), &st.ctx)
                                   .WithContext(Where("FinishForward", n, layer)));
      }
      Tracer::Scope span(options.tracer, rank, "compute", Name("after attention", n, layer));
      DISTCA_RETURN_IF_ERROR(
          cb.AfterAttention(layer, n, st.out.data(), st.lse.data()).WithContext(Where("after attention", n, layer)));
    }
    return Status::Ok();
  }

  Status BackwardGroup(LayerCallbacks& cb, int layer, const std::vector<int>& group) {
    const int rank = comm->rank();
    for (int n : group) {
      Nano& nano = nanos[n];
      LayerState& st = nano.layers[layer];
      current_ctx_[n] = &st.ctx;
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("before attention backward", n, layer));
        DISTCA_RETURN_IF_ERROR(cb.BeforeAttentionBackward(layer, n, nano.dout.data())
                                   .WithContext(Where("before attention backward", n, layer)));
      }
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("pack dO", n, layer));
        PhaseTimer phase(&times.pack_seconds);
        DISTCA_RETURN_IF_ERROR(nano.dispatcher
                                   ->StartBackward(*comm, st.q.data(), st.k.data(), st.v.data(), st.out.data(),
                                                   st.lse.data(), nano.dout.data(), &st.ctx)
                                   .WithContext(Where("StartBackward", n, layer)));
      }
      Track(n, Name("dO to servers", n, layer));
    }
    for (int n : group) {
      DISTCA_RETURN_IF_ERROR(Await(n, Name("dO", n, layer)).WithContext(Where("dO to servers", n, layer)));
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("serve attention backward", n, layer));
        PhaseTimer phase(&times.attention_seconds);
        DISTCA_RETURN_IF_ERROR(nanos[n]
                                   .dispatcher->ServeBackward(*comm, &nanos[n].layers[layer].ctx)
                                   .WithContext(Where("ServeBackward", n, layer)));
      }
      Track(n, Name("dQ/dK/dV to owners", n, layer));
    }
    for (int n : group) {
      DISTCA_RETURN_IF_ERROR(Await(n, Name("dQ/dK/dV", n, layer)).WithContext(Where("dQ/dK/dV to owners", n, layer)));
      Nano& nano = nanos[n];
      {
        Tracer::Scope span(options.tracer, rank, "compute", Name("unpack dQ/dK/dV", n, layer));
        PhaseTimer phase(&times.pack_seconds);
        DISTCA_RETURN_IF_ERROR(
            nano.dispatcher
                ->FinishBackward(*comm, nano.dq.data(), nano.dk.data(), nano.dv.data(), &nano.layers[layer].ctx)
                .WithContext(Where("FinishBackward", n, layer)));
      }
      Tracer::Scope span(options.tracer, rank, "compute", Name("after attention backward", n, layer));
      DISTCA_RETURN_IF_ERROR(cb.AfterAttentionBackward(layer, n, nano.dq.data(), nano.dk.data(), nano.dv.data())
                                 .WithContext(Where("after attention backward", n, layer)));
    }
    return Status::Ok();
  }

  // Nano-batch groups run in lockstep: all of them with ping-pong, one at a time without.
  std::vector<std::vector<int>> Groups() const {
    std::vector<std::vector<int>> groups;
    if (options.ping_pong) {
      groups.emplace_back();
      for (int n = 0; n < static_cast<int>(nanos.size()); ++n) groups.back().push_back(n);
    } else {
      for (int n = 0; n < static_cast<int>(nanos.size()); ++n) groups.push_back({n});
    }
    return groups;
  }

  std::vector<AttentionContext*> current_ctx_;
  bool forward_done = false;  // a Forward completed and no Backward has run since
};

PingPongExecutor::PingPongExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PingPongExecutor::~PingPongExecutor() = default;

Status PingPongExecutor::Create(Comm* comm, std::vector<Plan> plans, const PingPongOptions& o,
                                std::unique_ptr<PingPongExecutor>* out) {
  if (comm == nullptr || out == nullptr) return Status::InvalidArgument("comm and out must not be null");
  if (plans.empty()) return Status::InvalidArgument("the executor needs at least one nano-batch plan");
  if (o.layers < 1) return Status::InvalidArgument(fmt::format("layers must be >= 1, got {}", o.layers));
  auto impl = std::make_unique<Impl>();
  impl->comm = comm;
  impl->options = o;
  impl->nanos.resize(plans.size());
  impl->current_ctx_.assign(plans.size(), nullptr);
  const DispatchOptions& d = o.dispatch;
  for (size_t n = 0; n < plans.size(); ++n) {
    if (plans[n].servers() != comm->size())
      return Status::InvalidArgument(fmt::format("nano-batch {}'s plan has {} servers but the comm has {} ranks", n,
                                                 plans[n].servers(), comm->size()));
    Nano& nano = impl->nanos[n];
    DISTCA_RETURN_IF_ERROR(AttentionDispatcher::Create(plans[n], comm->rank(), d, &nano.dispatcher)
                               .WithContext(fmt::format("nano-batch {}", n)));
    const int64_t rows = nano.dispatcher->local_tokens();
    const size_t qn = size_t(rows * d.q_heads * d.head_dim), kn = size_t(rows * d.kv_heads * d.head_dim);
    nano.layers.resize(size_t(o.layers));
    for (LayerState& st : nano.layers) {
      st.q.assign(qn, 0.0f);
      st.k.assign(kn, 0.0f);
      st.v.assign(kn, 0.0f);
      st.out.assign(qn, 0.0f);
      st.lse.assign(size_t(rows * d.q_heads), 0.0f);
    }
    nano.dout.assign(qn, 0.0f);
    nano.dq.assign(qn, 0.0f);
    nano.dk.assign(kn, 0.0f);
    nano.dv.assign(kn, 0.0f);
  }
  out->reset(new PingPongExecutor(std::move(impl)));
  return Status::Ok();
}

int PingPongExecutor::nano_batches() const { return static_cast<int>(impl_->nanos.size()); }
const AttentionDispatcher& PingPongExecutor::dispatcher(int nano) const { return *impl_->nanos[nano].dispatcher; }
int64_t PingPongExecutor::local_tokens(int nano) const { return impl_->nanos[nano].dispatcher->local_tokens(); }
double PingPongExecutor::exposed_comm_seconds() const { return impl_->times.exposed_comm_seconds; }
const ExecutorTimes& PingPongExecutor::times() const { return impl_->times; }

Status PingPongExecutor::Forward(LayerCallbacks& callbacks) {
  impl_->times = ExecutorTimes{};
  impl_->forward_done = false;
  for (int layer = 0; layer < impl_->options.layers; ++layer)
    for (const std::vector<int>& group : impl_->Groups())
      DISTCA_RETURN_IF_ERROR(
          impl_->RunGroup([&] { return impl_->ForwardGroup(callbacks, layer, group); }, "forward", layer));
  impl_->forward_done = true;
  return Status::Ok();
}

Status PingPongExecutor::Backward(LayerCallbacks& callbacks) {
  // Every layer's saved Q, K, V, O and LSE come from the last whole Forward
  // (a stateless backward would otherwise run on zeros, or on a failed
  // forward's partial state).
  if (!impl_->forward_done) return Status::FailedPrecondition("Backward needs a preceding Forward that completed");
  impl_->forward_done = false;  // one backward per forward
  for (int layer = impl_->options.layers - 1; layer >= 0; --layer)
    for (const std::vector<int>& group : impl_->Groups())
      DISTCA_RETURN_IF_ERROR(
          impl_->RunGroup([&] { return impl_->BackwardGroup(callbacks, layer, group); }, "backward", layer));
  return Status::Ok();
}

}  // namespace distca
