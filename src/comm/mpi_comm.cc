// The MPI backend: OpenMPI with MPI_THREAD_MULTIPLE. Every MPI call is
// checked (errors return, they do not abort); large transfers are cut into
// messages of at most 1 GiB so counts fit MPI's int. A failing rank prints its
// reason and calls MPI_Abort, which terminates every rank of the job: nobody
// is left waiting on it. (After an MPI error the library's state is undefined,
// MPI 4.0 section 9.3, so a call that fails partway through posting, such as
// an alltoallv, returns its error without waiting for or cancelling what it
// had posted: the job ends right after.)
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include "comm/mpi_comm.h"

namespace distca::comm {
namespace {

constexpr int64_t kMaxMessage = int64_t{1} << 30;
// Tags above the user range carry the collectives built from point-to-point.
constexpr int kInternalTagBase = Comm::kMaxUserTag + 1;

Status MpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Internal(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(len))));
}

class MpiRequest : public CommRequest::Impl {
 public:
  std::vector<MPI_Request> requests;
  Status Wait() override {
    if (done_) return status_;
    status_ =
        MpiCheck(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    done_ = true;
    return status_;
  }
  bool Test() override {
    if (done_) return true;
    int flag = 0;
    if (MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      return true;  // Wait() will report the error
    return flag != 0;
  }

 private:
  bool done_ = false;
  Status status_;
};

class MpiComm : public Comm {
 public:
  MpiComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks sharing this node's memory.
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_size(node, &machine_ranks_);
      MPI_Comm_free(&node);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int machine_ranks() const override { return machine_ranks_; }
  const char* backend() const override { return "mpi"; }

  Status Barrier() override { return MpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  Status AllreduceSum(float* data, int64_t count) override {
    if (count < 0) return Status::InvalidArgument("allreduce: negative count");
    for (int64_t done = 0; done < count;) {
      const int n = static_cast<int>(std::min(count - done, kMaxMessage / 4));
      DISTCA_RETURN_IF_ERROR(
          MpiCheck(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce"));
      done += n;
    }
    return Status::Ok();
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    DISTCA_RETURN_IF_ERROR(CheckPeer(root, "broadcast root"));
    if (bytes < 0) return Status::InvalidArgument("broadcast: negative size");
    auto* p = static_cast<char*>(data);
    for (int64_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min(bytes - done, kMaxMessage));
      DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Bcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"));
      done += n;
    }
    return Status::Ok();
  }

  CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "send"); !s.ok()) return CommRequest::Done(s);
    auto r = std::make_shared<MpiRequest>();
    if (Status s = PostSend(data, bytes, peer, tag, r.get()); !s.ok()) return CommRequest::Done(s);
    return CommRequest(r);
  }

  CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "recv"); !s.ok()) return CommRequest::Done(s);
    auto r = std::make_shared<MpiRequest>();
    if (Status s = PostRecv(data, bytes, peer, tag, r.get()); !s.ok()) return CommRequest::Done(s);
    return CommRequest(r);
  }

  CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                         std::span<const int64_t> recv_counts) override {
    if (Status s = CheckCounts(send_counts, recv_counts); !s.ok()) return CommRequest::Done(s);
    // A tag of its own per call, so that overlapping alltoallvs never match
    // each other's messages (collective order is the same on every rank).
    const int tag = kInternalTagBase + static_cast<int>(collectives_++ % (Comm::kMaxUserTag + 1));
    auto r = std::make_shared<MpiRequest>();
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
      if (Status s = PostRecv(out, recv_counts[p], p, tag, r.get()); !s.ok()) return CommRequest::Done(s);
      out += recv_counts[p];
    }
    for (int p = 0; p < size_; ++p) {
      if (Status s = PostSend(in, send_counts[p], p, tag, r.get()); !s.ok()) return CommRequest::Done(s);
      in += send_counts[p];
    }
    return CommRequest(r);
  }

  void Abort(const Status& why) override {
    std::fprintf(stderr, "distca: rank %d of %d is aborting the job: %s\n", rank_, size_, why.ToString().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  Status Check(int peer, int tag, int64_t bytes, const char* what) const {
    DISTCA_RETURN_IF_ERROR(CheckPeer(peer, what));
    DISTCA_RETURN_IF_ERROR(CheckTag(tag));
    if (bytes < 0) return Status::InvalidArgument(fmt::format("{}: negative size", what));
    return Status::Ok();
  }

  // Messages of at most kMaxMessage bytes; zero-byte transfers still send one
  // (empty) message so that the receive side always matches.
  Status PostSend(const void* data, int64_t bytes, int peer, int tag, MpiRequest* r) {
    const auto* p = static_cast<const char*>(data);
    int64_t done = 0;
    do {
      const int n = static_cast<int>(std::min(bytes - done, kMaxMessage));
      r->requests.emplace_back();
      DISTCA_RETURN_IF_ERROR(
          MpiCheck(MPI_Isend(p + done, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r->requests.back()), "MPI_Isend"));
      done += n;
    } while (done < bytes);
    return Status::Ok();
  }

  Status PostRecv(void* data, int64_t bytes, int peer, int tag, MpiRequest* r) {
    auto* p = static_cast<char*>(data);
    int64_t done = 0;
    do {
      const int n = static_cast<int>(std::min(bytes - done, kMaxMessage));
      r->requests.emplace_back();
      DISTCA_RETURN_IF_ERROR(
          MpiCheck(MPI_Irecv(p + done, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r->requests.back()), "MPI_Irecv"));
      done += n;
    } while (done < bytes);
    return Status::Ok();
  }

  int rank_ = 0;
  int size_ = 1;
  int machine_ranks_ = 1;
  int64_t collectives_ = 0;
};

}  // namespace

bool MpiBackendAvailable() { return true; }

Status RunMpi(const std::function<Status(Comm&)>& fn) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return Status::FailedPrecondition("MPI was already finalized: RunOnRanks runs once per process");
  // The ping-pong executor calls MPI from two threads.
  if (!initialized) {
    int provided = 0;
    DISTCA_RETURN_IF_ERROR(
        MpiCheck(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread"));
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      return Status::Unavailable("this MPI does not provide MPI_THREAD_MULTIPLE");
    }
  } else {
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      return Status::FailedPrecondition("MPI was initialized without MPI_THREAD_MULTIPLE, which the runtime needs");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MpiComm comm;
  Status result;
  try {
    result = fn(comm);
  } catch (const std::exception& e) {
    result = Status::Internal(fmt::format("exception: {}", e.what()));
  } catch (...) {
    result = Status::Internal("unknown exception");
  }
  if (!result.ok()) {
    comm.Abort(result);  // terminates the job; should it return, the failure still stands
    return result;
  }
  // MPI initialized by the caller is the caller's to finalize.
  if (!initialized) DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Finalize(), "MPI_Finalize"));
  return Status::Ok();
}

}  // namespace distca::comm
