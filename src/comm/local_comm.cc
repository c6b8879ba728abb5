// The local backend. All ranks share one World: a mailbox of messages keyed by
// (source, destination, tag), with per-key sequence numbers so that receives
// match sends in posting order, as MPI's do. Payloads are copied outside the
// lock. Collectives are messages on internal (negative) tags numbered by each
// rank's collective sequence, which agrees across ranks because every rank
// calls the collectives in the same order.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/local_comm.h"
#include "comm/run_rank.h"

namespace distca::comm {
namespace {

using Bytes = std::vector<std::byte>;

class World {
 public:
  World(int size, double timeout_seconds) : size_(size), timeout_(timeout_seconds) {}

  int size() const { return size_; }

  // Appends a message; returns its sequence number on the key.
  void Post(int src, int dst, int64_t tag, Bytes msg) {
    std::lock_guard<std::mutex> lock(mu_);
    Channel& c = channels_[{src, dst, tag}];
    c.messages.emplace(c.sent++, std::move(msg));
    cv_.notify_all();
  }

  // The sequence number the next receive on this key will match.
  int64_t NextReceive(int src, int dst, int64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    return channels_[{src, dst, tag}].received++;
  }

  using Clock = std::chrono::steady_clock;

  // When a receive posted now gives up waiting. Timeouts beyond
  // kLongestTimeout (31 years; infinity included) wait that long: the
  // clock's nanoseconds would overflow past about 292 years.
  static constexpr double kLongestTimeout = 1e9;
  Clock::time_point Deadline() const { return DeadlineAfter(timeout_); }
  static Clock::time_point DeadlineAfter(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(std::min(seconds, kLongestTimeout)));
  }

  // Whether a wait on message `seq` would return at once: it is there, the
  // world failed, or the receive's deadline passed (Take then reports it,
  // so that a polling caller times out as a blocking one does).
  bool Ready(int src, int dst, int64_t tag, int64_t seq, Clock::time_point deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok() || Clock::now() >= deadline) return true;
    auto it = channels_.find({src, dst, tag});
    return it != channels_.end() && it->second.messages.count(seq) > 0;
  }

  // Removes message `seq` of the key, waiting for it until `deadline`; fails
  // on abort or timeout. A collective's key (negative tag) carries one
  // message, so its channel goes with it: the mailbox does not grow with
  // the steps of a long run.
  Status Take(int src, int dst, int64_t tag, int64_t seq, Clock::time_point deadline, Bytes* out) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto key = std::make_tuple(src, dst, tag);
    while (true) {
      if (!failure_.ok()) return failure_;
      Channel& c = channels_[key];
      auto it = c.messages.find(seq);
      if (it != c.messages.end()) {
        *out = std::move(it->second);
        c.messages.erase(it);
        if (tag < 0 && c.messages.empty() && c.sent == c.received) channels_.erase(key);
        return Status::Ok();
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        return Status::Unavailable(
            fmt::format("rank {} waited {} s for a message from rank {} (tag {}); giving up", dst, timeout_, src, tag));
      }
    }
  }

  void Abort(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = why;
    cv_.notify_all();
  }

  Status failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  struct Channel {
    int64_t sent = 0;
    int64_t received = 0;
    std::map<int64_t, Bytes> messages;  // by sequence number
  };

  const int size_;
  const double timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int64_t>, Channel> channels_;
  Status failure_;
};

// A receive: matched at posting time, completed (copied) on Wait.
class RecvRequest : public CommRequest::Impl {
 public:
  RecvRequest(World* w, int src, int dst, int64_t tag, void* out, int64_t bytes)
      : RecvRequest(w, src, dst, tag, out, bytes, w->Deadline()) {}
  RecvRequest(World* w, int src, int dst, int64_t tag, void* out, int64_t bytes, World::Clock::time_point deadline)
      : world_(w),
        src_(src),
        dst_(dst),
        tag_(tag),
        seq_(w->NextReceive(src, dst, tag)),
        deadline_(deadline),
        out_(out),
        bytes_(bytes) {}

  Status Wait() override {
    if (done_) return status_;
    Bytes msg;
    status_ = world_->Take(src_, dst_, tag_, seq_, deadline_, &msg);
    if (status_.ok() && static_cast<int64_t>(msg.size()) != bytes_) {
      status_ = Status::InvalidArgument(
          fmt::format("rank {} expected {} bytes from rank {} (tag {}), got {}", dst_, bytes_, src_, tag_, msg.size()));
    }
    if (status_.ok() && bytes_ > 0) std::memcpy(out_, msg.data(), static_cast<size_t>(bytes_));
    done_ = true;
    return status_;
  }
  bool Test() override { return done_ || world_->Ready(src_, dst_, tag_, seq_, deadline_); }

 private:
  World* world_;
  int src_, dst_;
  int64_t tag_, seq_;
  World::Clock::time_point deadline_;  // from posting, as MPI-less peers can only be waited for so long
  void* out_;
  int64_t bytes_;
  bool done_ = false;
  Status status_;
};

// Several requests completed together.
class GroupRequest : public CommRequest::Impl {
 public:
  explicit GroupRequest(std::vector<CommRequest> parts) : parts_(std::move(parts)) {}
  Status Wait() override {
    Status first;
    for (CommRequest& r : parts_) {
      Status s = r.Wait();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  bool Test() override {
    for (CommRequest& r : parts_)
      if (!r.Test()) return false;
    return true;
  }

 private:
  std::vector<CommRequest> parts_;
};

Bytes Copy(const void* data, int64_t bytes) {
  Bytes b(static_cast<size_t>(bytes));
  if (bytes > 0) std::memcpy(b.data(), data, static_cast<size_t>(bytes));
  return b;
}

class LocalComm : public Comm {
 public:
  LocalComm(World* world, int rank) : world_(world), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  int machine_ranks() const override { return world_->size(); }
  const char* backend() const override { return "local"; }

  CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "send"); !s.ok()) return CommRequest::Done(s);
    return Post(data, bytes, peer, tag);
  }

  CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "recv"); !s.ok()) return CommRequest::Done(s);
    return CommRequest(std::make_shared<RecvRequest>(world_, peer, rank_, tag, data, bytes));
  }

  CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                         std::span<const int64_t> recv_counts) override {
    if (Status s = CheckCounts(send_counts, recv_counts); !s.ok()) return CommRequest::Done(s);
    const int64_t tag = NextCollectiveTag();
    std::vector<CommRequest> parts;
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    for (int p = 0; p < size(); ++p) {
      parts.push_back(Post(in, send_counts[p], p, tag));
      in += send_counts[p];
    }
    for (int p = 0; p < size(); ++p) {
      parts.push_back(CommRequest(std::make_shared<RecvRequest>(world_, p, rank_, tag, out, recv_counts[p])));
      out += recv_counts[p];
    }
    return CommRequest(std::make_shared<GroupRequest>(std::move(parts)));
  }

  Status Barrier() override { return BarrierUntil(world_->Deadline()); }
  Status BarrierAfterLongWork() override { return BarrierUntil(World::DeadlineAfter(World::kLongestTimeout)); }

  // Reduce-scatter, then all-gather: rank p sums chunk p of every rank's
  // data, in rank order, and sends the sum to the others. Every element is
  // summed once, so every rank holds bit-identical results, and a rank
  // moves about 2 count floats each way; sending the whole of its data to
  // every peer held ranks x (ranks - 1) copies at once (256 ranks of the
  // tiny model: 22 GB).
  Status AllreduceSum(float* data, int64_t count) override {
    if (count < 0) return Status::InvalidArgument("allreduce: negative count");
    const int n = size();
    constexpr int64_t kFloat = sizeof(float);
    const auto begin = [&](int p) { return count / n * p + std::min<int64_t>(p, count % n); };
    const auto length = [&](int p) { return begin(p + 1) - begin(p); };
    const int64_t scatter = NextCollectiveTag(), gather = NextCollectiveTag();
    for (int p = 0; p < n; ++p)
      if (p != rank_) Post(data + begin(p), length(p) * kFloat, p, scatter);
    float* mine = data + begin(rank_);
    const int64_t len = length(rank_);
    std::vector<float> sum(static_cast<size_t>(len), 0.0f), part(static_cast<size_t>(len));
    for (int p = 0; p < n; ++p) {
      const float* src = mine;
      if (p != rank_) {
        DISTCA_RETURN_IF_ERROR(Receive(part.data(), len * kFloat, p, scatter));
        src = part.data();
      }
      for (int64_t i = 0; i < len; ++i) sum[size_t(i)] += src[i];
    }
    std::copy(sum.begin(), sum.end(), mine);
    for (int p = 0; p < n; ++p)
      if (p != rank_) Post(mine, len * kFloat, p, gather);
    for (int p = 0; p < n; ++p)
      if (p != rank_) DISTCA_RETURN_IF_ERROR(Receive(data + begin(p), length(p) * kFloat, p, gather));
    return Status::Ok();
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    DISTCA_RETURN_IF_ERROR(CheckPeer(root, "broadcast root"));
    if (bytes < 0) return Status::InvalidArgument("broadcast: negative size");
    const int64_t tag = NextCollectiveTag();
    if (rank_ == root) {
      for (int p = 0; p < size(); ++p)
        if (p != root) Post(data, bytes, p, tag);
      return Status::Ok();
    }
    return Receive(data, bytes, root, tag);
  }

  void Abort(const Status& why) override {
    world_->Abort(Status(why.code(), fmt::format("rank {} failed: {}", rank_, why.message())));
  }

 private:
  Status Check(int peer, int tag, int64_t bytes, const char* what) const {
    DISTCA_RETURN_IF_ERROR(CheckPeer(peer, what));
    DISTCA_RETURN_IF_ERROR(CheckTag(tag));
    if (bytes < 0) return Status::InvalidArgument(fmt::format("{}: negative size", what));
    return world_->failure();
  }

  // Sends complete at once: the payload is copied into the mailbox.
  CommRequest Post(const void* data, int64_t bytes, int peer, int64_t tag) {
    world_->Post(rank_, peer, tag, Copy(data, bytes));
    return CommRequest::Done();
  }

  Status Receive(void* data, int64_t bytes, int peer, int64_t tag) {
    RecvRequest r(world_, peer, rank_, tag, data, bytes);
    return r.Wait();
  }

  Status BarrierUntil(World::Clock::time_point deadline) {
    const char token = 0;
    char sink = 0;
    const int64_t tag = NextCollectiveTag();
    for (int p = 0; p < size(); ++p) Post(&token, 1, p, tag);
    for (int p = 0; p < size(); ++p)
      DISTCA_RETURN_IF_ERROR(RecvRequest(world_, p, rank_, tag, &sink, 1, deadline).Wait());
    return Status::Ok();
  }

  int64_t NextCollectiveTag() { return -(++collectives_); }

  World* world_;
  int rank_;
  int64_t collectives_ = 0;
};

}  // namespace

Status RunLocal(int ranks, double timeout_seconds, const std::function<Status(Comm&)>& fn) {
  if (ranks <= 0) return Status::InvalidArgument(fmt::format("local backend needs ranks >= 1, got {}", ranks));
  if (ranks > kMaxLocalRanks)
    return Status::OutOfRange(
        fmt::format("local backend runs at most {} ranks (threads of one process), got {}; use "
                    "mpirun for more",
                    kMaxLocalRanks, ranks));
  if (!(timeout_seconds > 0)) return Status::InvalidArgument("local backend needs a positive timeout");
  World world(ranks, timeout_seconds);
  std::vector<Status> results(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  Status not_started;
  for (int r = 0; r < ranks && not_started.ok(); ++r) {
    // A thread that cannot start (the process is out of threads or
    // memory) fails the job like a rank that failed: the ranks already
    // running see it and return, and are joined.
    auto run = [&, r] {
      LocalComm comm(&world, r);
      results[r] = RunRank(fn, comm);
      if (!results[r].ok()) comm.Abort(results[r]);
    };
    try {
      threads.emplace_back(run);
    } catch (const std::exception& e) {
      not_started =
          Status::Unavailable(fmt::format("could not start the thread of local rank {} of {}: {}", r, ranks, e.what()));
      LocalComm(&world, r).Abort(not_started);
    }
  }
  for (std::thread& t : threads) t.join();
  if (!not_started.ok()) return not_started;
  // The failure that started it, if any (others only echo it).
  const Status first = world.failure();
  if (!first.ok()) return first;
  for (int r = 0; r < ranks; ++r)
    if (!results[r].ok()) return results[r].WithContext(fmt::format("rank {}", r));
  return Status::Ok();
}

}  // namespace distca::comm
