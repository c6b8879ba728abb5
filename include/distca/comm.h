// Comm: the one narrow interface through which distca ranks talk.
//
// Backends:
//   local  R ranks as threads of one process (the embedded default and the
//          test harness; no mpirun needed).
//   mpi    OpenMPI processes on one or many machines (MPI_THREAD_MULTIPLE).
// RunOnRanks picks one: MPI when the program was started by mpirun, else
// local, unless CommOptions forces either.
//
// Contract for every backend:
//   - Collectives (Barrier, AllreduceSum, Broadcast, Alltoallv) are called by
//     every rank in the same order.
//   - Point-to-point messages between one (sender, receiver, tag) arrive in
//     the order they were sent. User tags are in [0, kMaxUserTag].
//   - Nonblocking calls return a CommRequest; the buffers must stay valid and
//     untouched until its Wait() returns.
//   - A receive (or an Alltoallv's part) of another size than its message is
//     an error on the receiving rank, naming both ranks and the expected
//     size, never a partly filled buffer or a wait for bytes that never come.
//   - Failure: when one rank fails (returns an error, throws, aborts, or its
//     process dies), every other rank's pending and later calls fail with a
//     Status naming the failure within seconds; no rank hangs.
//   - Threads: one thread of a rank posts operations; another may Test()
//     and Wait() on the requests meanwhile (the ping-pong executor posts the
//     all-to-alls from its compute thread and polls them from its comm
//     thread). Both backends allow it: the local one under a mutex, MPI
//     initialized with MPI_THREAD_MULTIPLE.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "distca/status.h"

namespace distca {

// A pending nonblocking operation. Copyable handle; Wait() is idempotent.
class CommRequest {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual Status Wait() = 0;  // blocks until done
    virtual bool Test() = 0;    // true when Wait() would not block
  };

  CommRequest() = default;
  explicit CommRequest(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  // A request that is already complete with `status`.
  static CommRequest Done(Status status = Status::Ok());

  Status Wait();
  bool Test();
  bool valid() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<Impl> impl_;
};

class Comm {
 public:
  static constexpr int kMaxUserTag = (1 << 14) - 1;

  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks of the job that share this rank's machine, and so its memory,
  // itself included: all of them with the local backend (one process), the
  // ranks on this node under MPI.
  virtual int machine_ranks() const = 0;
  virtual const char* backend() const = 0;

  virtual Status Barrier() = 0;
  // A barrier that one rank may reach long after the others (rank 0 writing
  // a checkpoint): the others wait without the backend's message timeout
  // (the local backend's; MPI has none), and still return at once when a
  // rank fails. Default: Barrier().
  virtual Status BarrierAfterLongWork() { return Barrier(); }
  // In place: data[i] = sum over ranks of data[i].
  virtual Status AllreduceSum(float* data, int64_t count) = 0;
  // Root's bytes to every rank.
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // Sends send_counts[p] bytes to rank p from `send` at offset
  // send_counts[0] + ... + send_counts[p-1]; receives recv_counts[p] bytes
  // from p into `recv` at the matching prefix offset. Both spans have size()
  // entries, and send_counts[q] on rank p equals recv_counts[p] on rank q.
  virtual Status Alltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                           std::span<const int64_t> recv_counts);
  virtual Status Send(const void* data, int64_t bytes, int peer, int tag);
  virtual Status Recv(void* data, int64_t bytes, int peer, int tag);

  virtual CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) = 0;
  // The counts must stay valid until Wait() too.
  virtual CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                                 std::span<const int64_t> recv_counts) = 0;

  // Declares this rank failed: every rank's pending and later calls fail with
  // an error that carries `why`. On MPI the job is terminated.
  virtual void Abort(const Status& why) = 0;

 protected:
  // Argument checks shared by the backends.
  Status CheckPeer(int peer, const char* what) const;
  Status CheckTag(int tag) const;
  Status CheckCounts(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts) const;
};

// Every rank's `mine` on rank 0, in rank order (one Alltoallv); every other
// rank gets only its own. T is trivially copyable (sent as bytes).
template <typename T>
Status GatherToRoot(Comm& comm, const T& mine, std::vector<T>* all) {
  static_assert(std::is_trivially_copyable_v<T>, "GatherToRoot sends T as bytes");
  const int n = comm.size();
  std::vector<int64_t> send(size_t(n), 0), recv(size_t(n), 0);
  send[0] = sizeof(T);
  if (comm.rank() == 0) std::fill(recv.begin(), recv.end(), int64_t{sizeof(T)});
  all->assign(size_t(comm.rank() == 0 ? n : 1), T{});
  DISTCA_RETURN_IF_ERROR(comm.Alltoallv(&mine, send, all->data(), recv));
  if (comm.rank() != 0) (*all)[0] = mine;
  return Status::Ok();
}

// The most ranks the local backend runs (one thread each, in one process).
inline constexpr int kMaxLocalRanks = 1024;

struct CommOptions {
  enum class Backend { kAuto, kLocal, kMpi };
  Backend backend = Backend::kAuto;  // Default: MPI under mpirun, else local
  int local_ranks = 1;               // ranks (threads) of the local backend, at most kMaxLocalRanks. Default: 1
  // The local backend's limit on any single wait for a message: a receive,
  // blocking or polled with Test, gives up this long after it was posted
  // and fails instead of hanging (beyond 1e9 s, infinity included, it
  // waits 1e9 s). Default: 120 s
  double timeout_seconds = 120.0;
};

// True when this process was started by mpirun / mpiexec (OpenMPI).
bool LaunchedByMpirun();
// Whether this build has the MPI backend (DISTCA_WITH_MPI).
bool MpiAvailable();
// The backend RunOnRanks runs `options` on: kAuto resolved to MPI under
// mpirun when the build has it, else local.
CommOptions::Backend ChosenBackend(const CommOptions& options);

// Runs fn on every rank of the chosen backend and returns OK when every rank
// (local) or this rank (MPI) succeeded; otherwise the first failure, by rank.
// A failing rank aborts the others. Exceptions thrown by fn are failures.
// Under MPI, a failing rank terminates the whole job (non-zero exit).
Status RunOnRanks(const CommOptions& options, const std::function<Status(Comm&)>& fn);

// Test support: wraps a Comm and injects random delays before operations and
// delays the completion of nonblocking requests (so they complete in a
// different order than issued), to show callers do not rely on lucky timing.
struct FaultOptions {
  uint64_t seed = 1;
  int max_delay_us = 200;  // per operation, uniform in [0, max]. Default: 200 us
};
std::unique_ptr<Comm> MakeFaultInjectingComm(Comm* inner, const FaultOptions& options);

}  // namespace distca
