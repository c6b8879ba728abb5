// Backend-independent parts of Comm: requests, argument checks, blocking
// defaults, backend choice.
#include <fmt/format.h>

#include <cstdlib>

#include "comm/local_comm.h"
#include "comm/mpi_comm.h"
#include "distca/comm.h"

namespace distca {

namespace {

class DoneRequest : public CommRequest::Impl {
 public:
  explicit DoneRequest(Status s) : status_(std::move(s)) {}
  Status Wait() override { return status_; }
  bool Test() override { return true; }

 private:
  Status status_;
};

}  // namespace

CommRequest CommRequest::Done(Status status) { return CommRequest(std::make_shared<DoneRequest>(std::move(status))); }

Status CommRequest::Wait() {
  if (!impl_) return Status::FailedPrecondition("waiting on an empty CommRequest");
  return impl_->Wait();
}

bool CommRequest::Test() { return impl_ == nullptr || impl_->Test(); }

Status Comm::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size())
    return Status::InvalidArgument(fmt::format("{}: rank {} does not exist (size {})", what, peer, size()));
  return Status::Ok();
}

Status Comm::CheckTag(int tag) const {
  if (tag < 0 || tag > kMaxUserTag)
    return Status::InvalidArgument(fmt::format("tag {} is outside [0, {}]", tag, kMaxUserTag));
  return Status::Ok();
}

Status Comm::CheckCounts(std::span<const int64_t> send_counts, std::span<const int64_t> recv_counts) const {
  if (static_cast<int>(send_counts.size()) != size() || static_cast<int>(recv_counts.size()) != size())
    return Status::InvalidArgument(fmt::format("alltoallv needs {} counts per side, got {} and {}", size(),
                                               send_counts.size(), recv_counts.size()));
  for (int p = 0; p < size(); ++p) {
    if (send_counts[p] < 0 || recv_counts[p] < 0)
      return Status::InvalidArgument(fmt::format("alltoallv: negative count for rank {}", p));
  }
  return Status::Ok();
}

Status Comm::Alltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                       std::span<const int64_t> recv_counts) {
  return IAlltoallv(send, send_counts, recv, recv_counts).Wait();
}

Status Comm::Send(const void* data, int64_t bytes, int peer, int tag) { return ISend(data, bytes, peer, tag).Wait(); }

Status Comm::Recv(void* data, int64_t bytes, int peer, int tag) { return IRecv(data, bytes, peer, tag).Wait(); }

bool LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

bool MpiAvailable() { return comm::MpiBackendAvailable(); }

CommOptions::Backend ChosenBackend(const CommOptions& options) {
  using Backend = CommOptions::Backend;
  if (options.backend != Backend::kAuto) return options.backend;
  return LaunchedByMpirun() && MpiAvailable() ? Backend::kMpi : Backend::kLocal;
}

Status RunOnRanks(const CommOptions& options, const std::function<Status(Comm&)>& fn) {
  if (ChosenBackend(options) == CommOptions::Backend::kMpi) {
    if (!MpiAvailable()) return Status::Unavailable("this build has no MPI backend (DISTCA_WITH_MPI is off)");
    return comm::RunMpi(fn);
  }
  return comm::RunLocal(options.local_ranks, options.timeout_seconds, fn);
}

}  // namespace distca
