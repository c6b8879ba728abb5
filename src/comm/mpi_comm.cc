// The MPI backend: OpenMPI with MPI_THREAD_MULTIPLE. Every MPI call is
// checked (errors return rather than abort, but see below); large transfers are cut into
// messages of at most 1 GiB so counts fit MPI's int: whole messages of that
// size, then always one shorter final message (empty when the size is a
// multiple), so that a receive that expects a different size than was sent
// fails at its first message that differs instead of waiting for one that
// never comes (or leaving one unmatched). A failing rank prints its
// reason and calls MPI_Abort, which terminates every rank of the job: nobody
// is left waiting on it. A failed transfer returns its error (the caller adds
// context, and RunOnRanks ends the job), except when one of its sends is
// still posted: MPI may read that send's buffer until the send completes, and
// the caller, unwinding, would free it first (a rendezvous send's data moves
// only once the peer has matched it, which after a failure may be never), so
// the job ends there, with the failure's reason. A call that fails
// partway through posting, such as an alltoallv, ends the same way: what it
// had posted is cancelled (receives) or ends the job (sends), best effort,
// since after an MPI error the library's state is undefined (MPI 4.0
// section 9.3).
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/mpi_comm.h"
#include "comm/run_rank.h"

namespace distca::comm {
namespace {

constexpr int64_t kMaxMessage = int64_t{1} << 30;
// DISTCA_MPI_MAX_MESSAGE=N (kMinMessage <= N <= kMaxMessage) lowers the
// message size limit, so that tests exercise the cutting of transfers with
// small ones. Not below 64 bytes: at 1 byte (one float per all-reduce call)
// a run of the tiny model took minutes.
constexpr int64_t kMinMessage = 64;
constexpr const char* kMaxMessageEnv = "DISTCA_MPI_MAX_MESSAGE";
// Tags above the user range carry the collectives built from point-to-point.
constexpr int kInternalTagBase = Comm::kMaxUserTag + 1;

// Prints why this rank fails and ends every rank of the job, with the exit
// status the tools give a failed run (2; mpirun passes it on).
void AbortJob(int rank, int size, const Status& why) {
  std::fprintf(stderr, "distca: rank %d of %d is aborting the job: %s\n", rank, size, why.ToString().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
}

Status MpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::Internal(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(len))));
}

// The messages of one or more transfers. Receives are completed in posting
// order and each checked against the size it expects, so that the first
// message that differs ends the wait with an error naming the sizes.
class MpiRequest : public CommRequest::Impl {
 public:
  struct Part {
    MPI_Request request = MPI_REQUEST_NULL;
    int64_t expected = -1;  // bytes a receive expects; -1 for a send
    int peer = 0, tag = 0;
    int64_t transfer_bytes = 0;  // the whole transfer's size, for messages
    bool done = false;
  };
  MpiRequest(int rank, int size) : rank_(rank), size_(size) {}
  std::vector<Part> parts;

  Status Wait() override {
    if (done_) return status_;
    for (Part& p : parts) {
      if (p.done) continue;
      MPI_Status st;
      if (Status s = Complete(p, MPI_Wait(&p.request, &st), st); !s.ok()) return Fail(s);
    }
    done_ = true;
    return status_;
  }
  bool Test() override {
    if (done_) return true;
    bool all = true;
    for (Part& p : parts) {
      if (p.done) continue;
      int flag = 0;
      MPI_Status st;
      const int rc = MPI_Test(&p.request, &flag, &st);
      if (rc != MPI_SUCCESS || flag != 0) {
        if (Status s = Complete(p, rc, st); !s.ok()) {
          (void)Fail(s);  // Wait() reports it
          return true;
        }
      } else {
        all = false;
      }
    }
    return all;
  }

  // Ends the transfer with `why`. The receives still posted would match (and
  // write into this buffer) messages of later transfers on the same peer and
  // tag: they are cancelled. A send cannot be taken back (and a sender's
  // surplus messages leave that peer and tag out of step: RunOnRanks ends
  // the job on the error); one still posted ends the job here (see the top).
  Status Fail(Status why) {
    status_ = std::move(why);
    done_ = true;
    CancelReceives();
    for (Part& p : parts) {
      if (p.done) continue;
      int flag = 0;
      if (MPI_Test(&p.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag == 0) {
        AbortJob(rank_, size_,
                 Status(status_.code(), status_.message() +
                                            " (a send of the failed transfer is still in flight and reads the "
                                            "caller's buffer, so the job ends here)"));
      }
      p.done = true;
    }
    return status_;
  }

 private:
  void CancelReceives() {
    for (Part& p : parts) {
      if (p.done || p.expected < 0) continue;
      MPI_Cancel(&p.request);
      MPI_Wait(&p.request, MPI_STATUS_IGNORE);
      p.done = true;
    }
  }
  Status Complete(Part& p, int rc, const MPI_Status& st) {
    p.done = true;
    if (p.expected < 0) return MpiCheck(rc, "MPI_Isend");
    if (rc == MPI_ERR_TRUNCATE) return Mismatch(p, "more (a longer message arrived)");
    DISTCA_RETURN_IF_ERROR(MpiCheck(rc, "MPI_Irecv"));
    int count = 0;
    DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Get_count(&st, MPI_BYTE, &count), "MPI_Get_count"));
    if (count != p.expected) return Mismatch(p, "less (a shorter message arrived)");
    return Status::Ok();
  }
  Status Mismatch(const Part& p, const char* got) const {
    return Status::InvalidArgument(fmt::format("rank {} expected {} bytes from rank {} (tag {}), got {}", rank_,
                                               p.transfer_bytes, p.peer, p.tag, got));
  }

  const int rank_, size_;  // this rank and the job's size, for messages
  bool done_ = false;
  Status status_;
};

class MpiComm : public Comm {
 public:
  explicit MpiComm(int64_t max_message) : max_message_(max_message) {
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
      const int n = static_cast<int>(std::min(count - done, std::max<int64_t>(1, max_message_ / 4)));
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
      const int n = static_cast<int>(std::min(bytes - done, max_message_));
      DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Bcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"));
      done += n;
    }
    return Status::Ok();
  }

  CommRequest ISend(const void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "send"); !s.ok()) return CommRequest::Done(s);
    auto r = std::make_shared<MpiRequest>(rank_, size_);
    if (Status s = PostSend(data, bytes, peer, tag, r.get()); !s.ok()) return CommRequest::Done(r->Fail(s));
    return CommRequest(r);
  }

  CommRequest IRecv(void* data, int64_t bytes, int peer, int tag) override {
    if (Status s = Check(peer, tag, bytes, "recv"); !s.ok()) return CommRequest::Done(s);
    auto r = std::make_shared<MpiRequest>(rank_, size_);
    if (Status s = PostRecv(data, bytes, peer, tag, r.get()); !s.ok()) return CommRequest::Done(r->Fail(s));
    return CommRequest(r);
  }

  CommRequest IAlltoallv(const void* send, std::span<const int64_t> send_counts, void* recv,
                         std::span<const int64_t> recv_counts) override {
    if (Status s = CheckCounts(send_counts, recv_counts); !s.ok()) return CommRequest::Done(s);
    // A tag of its own per call, so that overlapping alltoallvs never match
    // each other's messages (collective order is the same on every rank).
    const int tag = kInternalTagBase + static_cast<int>(collectives_++ % (Comm::kMaxUserTag + 1));
    auto r = std::make_shared<MpiRequest>(rank_, size_);
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    for (int p = 0; p < size_; ++p) {
      if (Status s = PostRecv(out, recv_counts[p], p, tag, r.get()); !s.ok()) return CommRequest::Done(r->Fail(s));
      out += recv_counts[p];
    }
    for (int p = 0; p < size_; ++p) {
      if (Status s = PostSend(in, send_counts[p], p, tag, r.get()); !s.ok()) return CommRequest::Done(r->Fail(s));
      in += send_counts[p];
    }
    return CommRequest(r);
  }

  void Abort(const Status& why) override { AbortJob(rank_, size_, why); }

 private:
  Status Check(int peer, int tag, int64_t bytes, const char* what) const {
    DISTCA_RETURN_IF_ERROR(CheckPeer(peer, what));
    DISTCA_RETURN_IF_ERROR(CheckTag(tag));
    if (bytes < 0) return Status::InvalidArgument(fmt::format("{}: negative size", what));
    return Status::Ok();
  }

  // Whole messages of max_message_ bytes, then one shorter final message
  // (empty when bytes is a multiple; a zero-byte transfer is that one empty
  // message), so that the receive side always matches message for message.
  Status PostSend(const void* data, int64_t bytes, int peer, int tag, MpiRequest* r) {
    return Post(const_cast<void*>(data), bytes, peer, tag, /*receive=*/false, r);
  }
  Status PostRecv(void* data, int64_t bytes, int peer, int tag, MpiRequest* r) {
    return Post(data, bytes, peer, tag, /*receive=*/true, r);
  }
  Status Post(void* data, int64_t bytes, int peer, int tag, bool receive, MpiRequest* r) {
    auto* p = static_cast<char*>(data);
    for (int64_t done = 0;;) {
      const int n = static_cast<int>(std::min(bytes - done, max_message_));
      MpiRequest::Part& part = r->parts.emplace_back();
      part.expected = receive ? n : -1;
      part.peer = peer;
      part.tag = tag;
      part.transfer_bytes = bytes;
      const int rc = receive ? MPI_Irecv(p + done, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &part.request)
                             : MPI_Isend(p + done, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &part.request);
      if (rc != MPI_SUCCESS) {
        part.done = true;
        return MpiCheck(rc, receive ? "MPI_Irecv" : "MPI_Isend");
      }
      done += n;
      if (n < max_message_) return Status::Ok();
    }
  }

  const int64_t max_message_;
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
  int64_t max_message = kMaxMessage;
  if (const char* env = std::getenv(kMaxMessageEnv); env != nullptr) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(env, &end, 10);
    if (errno != 0 || end == env || *end != '\0' || v < kMinMessage || v > kMaxMessage) {
      const Status bad = Status::InvalidArgument(fmt::format("{}='{}' is not a whole number of bytes in [{}, {}]",
                                                             kMaxMessageEnv, env, kMinMessage, kMaxMessage));
      MpiComm(kMaxMessage).Abort(bad);
      return bad;
    }
    max_message = v;
  }
  MpiComm comm(max_message);
  const Status result = RunRank(fn, comm);
  if (!result.ok()) {
    comm.Abort(result);  // terminates the job; should it return, the failure still stands
    return result;
  }
  // Every rank leaves together: a rank that finished must not be inside
  // MPI_Finalize (or gone) while another calls MPI_Abort, which can leave
  // OpenMPI 4.1's mpiexec waiting forever; here it waits in the barrier and
  // the abort ends it.
  DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier before leaving"));
  // MPI initialized by the caller is the caller's to finalize.
  if (!initialized) DISTCA_RETURN_IF_ERROR(MpiCheck(MPI_Finalize(), "MPI_Finalize"));
  return Status::Ok();
}

}  // namespace distca::comm
