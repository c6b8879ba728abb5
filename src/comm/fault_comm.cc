// A Comm wrapper that injects random delays before operations and delays the
// completion of nonblocking requests, for tests.
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "distca/comm.h"

namespace distca {
namespace {

using Clock = std::chrono::steady_clock;

// Completes no earlier than `ready`: Test() says "not yet" until then, so
// requests issued together finish in a shuffled order.
class DelayedRequest : public CommRequest::Impl {
 public:
  DelayedRequest(CommRequest inner, Clock::time_point ready) : inner_(std::move(inner)), ready_(ready) {}
  Status Wait() override {
    std::this_thread::sleep_until(ready_);
    return inner_.Wait();
  }
  bool Test() override { return Clock::now() >= ready_ && inner_.Test(); }

 private:
  CommRequest inner_;
  Clock::time_point ready_;
};

class FaultInjectingComm : public Comm {
 public:
  FaultInjectingComm(Comm* inner, const FaultOptions& o) : inner_(inner), rng_(o.seed), max_delay_us_(o.max_delay_us) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int machine_ranks() const override { return inner_->machine_ranks(); }
  const char* backend() const override { return inner_->backend(); }

  Status Barrier() override {
    Delay();
    return inner_->Barrier();
  }
  Status BarrierAfterLongWork() override {
    Delay();
    return inner_->BarrierAfterLongWork();
  }
  Status AllreduceSum(float* data, int64_t count) override {
    Delay();
    return inner_->AllreduceSum(data, count);
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    Delay();
    return inner_->Broadcast(data, bytes, root);
  }
  CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) override {
    Delay();
    return Delayed(inner_->ISend(data, bytes, peer, tag));
  }
  CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) override {
    Delay();
    return Delayed(inner_->IRecv(data, bytes, peer, tag));
  }
  CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                         std::span<const int64_t> recv_counts) override {
    Delay();
    return Delayed(inner_->IAlltoallv(send, send_counts, recv, recv_counts));
  }
  void Abort(const Status& why) override { inner_->Abort(why); }

 private:
  std::chrono::microseconds Random() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_delay_us_)(rng_));
  }
  void Delay() { std::this_thread::sleep_for(Random()); }
  CommRequest Delayed(CommRequest r) {
    return CommRequest(std::make_shared<DelayedRequest>(std::move(r), Clock::now() + 4 * Random()));
  }

  Comm* inner_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  int max_delay_us_;
};

}  // namespace

std::unique_ptr<Comm> MakeFaultInjectingComm(Comm* inner, const FaultOptions& options) {
  return std::make_unique<FaultInjectingComm>(inner, options);
}

}  // namespace distca
