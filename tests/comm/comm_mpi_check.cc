// Run under mpirun: the Comm contract on the MPI backend, and failure
// propagation. Exit 0 when every rank passes.
//   comm_mpi_check contract     all checks (also with injected delays)
//   comm_mpi_check fail         rank 1 fails; the job must end non-zero
//   comm_mpi_check kill         rank 1 is killed by SIGKILL; the job must end
//   comm_mpi_check short|long   rank 0 sends rank 1 100 bytes where 200 are
//                               expected, or 200 where 100 are: rank 1 must
//                               fail, naming the sizes, and the job end (run
//                               with DISTCA_MPI_MAX_MESSAGE=64, so that the
//                               transfers are cut into different numbers of
//                               messages)
//   comm_mpi_check pending_send rank 1's alltoallv receives 100 bytes from
//                               rank 0 where 200 are expected while its
//                               1 MiB send to rank 0 is still in flight (rank
//                               0 makes no MPI call for 3 s, so the send
//                               cannot complete): the job must end inside
//                               the failed wait, which says so, before the
//                               caller could free the send's buffer
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/comm_checks.h"

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "contract";
  distca::CommOptions o;
  o.backend = distca::CommOptions::Backend::kMpi;
  const distca::Status s = distca::RunOnRanks(o, [&](distca::Comm& c) -> distca::Status {
    if (std::strcmp(mode, "contract") == 0) {
      // mpirun starts every rank on this machine: they all share it.
      if (c.machine_ranks() != c.size())
        return distca::Status::Internal("machine_ranks() is not size() with every rank on one machine");
      DISTCA_RETURN_IF_ERROR(distca::testing::CheckCommContract(c));
      auto faulty = distca::MakeFaultInjectingComm(&c, {.seed = uint64_t(c.rank()) + 7, .max_delay_us = 300});
      return distca::testing::CheckCommContract(*faulty);
    }
    DISTCA_RETURN_IF_ERROR(c.Barrier());
    const bool short_send = std::strcmp(mode, "short") == 0;
    if (short_send || std::strcmp(mode, "long") == 0) {
      std::vector<char> buffer(200, 'x');
      if (c.rank() == 0) return c.Send(buffer.data(), short_send ? 100 : 200, 1, 0);
      if (c.rank() == 1) return c.Recv(buffer.data(), short_send ? 200 : 100, 0, 0);
      return c.Barrier();  // waits for ranks 0 and 1: ends when the job is aborted
    }
    if (std::strcmp(mode, "pending_send") == 0) {
      if (c.size() != 2) return distca::Status::InvalidArgument("pending_send runs on 2 ranks");
      constexpr int64_t kLarge = int64_t{1} << 20;  // far above any eager limit
      std::vector<char> send(kLarge, 's'), recv(kLarge, 'r');
      const bool zero = c.rank() == 0;
      const std::vector<int64_t> send_counts = zero ? std::vector<int64_t>{0, 100} : std::vector<int64_t>{kLarge, 0};
      const std::vector<int64_t> recv_counts = zero ? std::vector<int64_t>{0, kLarge} : std::vector<int64_t>{200, 0};
      distca::CommRequest r = c.IAlltoallv(send.data(), send_counts, recv.data(), recv_counts);
      if (zero) std::this_thread::sleep_for(std::chrono::seconds(3));  // no MPI progress meanwhile
      const distca::Status waited = r.Wait();
      if (!zero && !waited.ok()) {
        std::fprintf(stderr, "comm_mpi_check: rank 1's failed alltoallv returned with its send in flight\n");
        std::fflush(stderr);
      }
      return waited;
    }
    if (c.rank() == 1) {
      if (std::strcmp(mode, "kill") == 0) std::raise(SIGKILL);
      return distca::Status::InvalidArgument("injected failure on rank 1");
    }
    int64_t x = 0;
    return c.Recv(&x, sizeof x, 1, 0);  // never arrives: the job must still end
  });
  if (!s.ok()) {
    std::fprintf(stderr, "comm_mpi_check: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
