// Checks of the Comm contract that run on any backend. They report through
// Status (not gtest asserts) so that MPI processes can run them too.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "distca/comm.h"

namespace distca::testing {

// Size of the message rank `from` sends to rank `to` in round `round` (some zero).
inline int64_t MessageSize(int from, int to, int round) { return ((from * 7 + to * 13 + round * 5) % 11) * 37; }

inline std::byte MessageByte(int from, int to, int round, int64_t i) {
  return static_cast<std::byte>((from * 31 + to * 17 + round * 3 + i) & 0xff);
}

inline Status Expect(bool ok, const std::string& what) { return ok ? Status::Ok() : Status::Internal(what); }

// Exercises every operation; returns the first deviation from the contract.
inline Status CheckCommContract(Comm& c) {
  const int R = c.size(), me = c.rank();
  DISTCA_RETURN_IF_ERROR(Expect(c.machine_ranks() >= 1 && c.machine_ranks() <= R, "machine_ranks outside [1, size]"));
  DISTCA_RETURN_IF_ERROR(c.Barrier());

  // Allreduce: exact in float for these small integers and halves.
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(me) + 0.5f * float(i);
  DISTCA_RETURN_IF_ERROR(c.AllreduceSum(v.data(), int64_t(v.size())));
  for (size_t i = 0; i < v.size(); ++i)
    DISTCA_RETURN_IF_ERROR(Expect(v[i] == float(R * (R - 1) / 2) + 0.5f * float(R) * float(i),
                                  fmt::format("rank {}: allreduce[{}] = {}", me, i, v[i])));

  // Broadcast from every root.
  for (int root = 0; root < R; ++root) {
    std::vector<int32_t> b(257, me == root ? root * 1000 + 7 : -1);
    DISTCA_RETURN_IF_ERROR(c.Broadcast(b.data(), int64_t(b.size() * sizeof(int32_t)), root));
    for (int32_t x : b) DISTCA_RETURN_IF_ERROR(Expect(x == root * 1000 + 7, fmt::format("broadcast from {}", root)));
  }

  // Alltoallv with uneven (and zero) sizes; two overlapping nonblocking rounds.
  for (int round = 0; round < 3; round += 2) {
    std::vector<int64_t> sc[2], rc[2];
    std::vector<std::byte> sb[2], rb[2];
    std::vector<CommRequest> reqs;
    for (int k = 0; k < 2; ++k) {
      for (int p = 0; p < R; ++p) {
        sc[k].push_back(MessageSize(me, p, round + k));
        rc[k].push_back(MessageSize(p, me, round + k));
        for (int64_t i = 0; i < sc[k].back(); ++i) sb[k].push_back(MessageByte(me, p, round + k, i));
      }
      int64_t total = 0;
      for (int64_t x : rc[k]) total += x;
      rb[k].assign(size_t(total), std::byte{0});
      reqs.push_back(c.IAlltoallv(sb[k].data(), sc[k], rb[k].data(), rc[k]));
    }
    for (int k = 1; k >= 0; --k) DISTCA_RETURN_IF_ERROR(reqs[k].Wait());  // out of order
    for (int k = 0; k < 2; ++k) {
      int64_t off = 0;
      for (int p = 0; p < R; ++p) {
        for (int64_t i = 0; i < rc[k][p]; ++i)
          DISTCA_RETURN_IF_ERROR(Expect(rb[k][off + i] == MessageByte(p, me, round + k, i),
                                        fmt::format("rank {}: alltoallv byte {} from rank {}", me, i, p)));
        off += rc[k][p];
      }
    }
  }

  // Point to point around a ring: three messages on one tag keep their order,
  // receives are posted before the sends and waited out of order.
  const int next = (me + 1) % R, prev = (me + R - 1) % R;
  std::vector<int64_t> in(3, -1);
  std::vector<CommRequest> recvs;
  for (int k = 0; k < 3; ++k) recvs.push_back(c.IRecv(&in[k], sizeof(int64_t), prev, 5));
  std::vector<int64_t> out = {me * 10 + 0, me * 10 + 1, me * 10 + 2};
  std::vector<CommRequest> sends;
  for (int k = 0; k < 3; ++k) sends.push_back(c.ISend(&out[k], sizeof(int64_t), next, 5));
  for (int k : {2, 0, 1}) DISTCA_RETURN_IF_ERROR(recvs[k].Wait());
  for (CommRequest& s : sends) DISTCA_RETURN_IF_ERROR(s.Wait());
  for (int k = 0; k < 3; ++k)
    DISTCA_RETURN_IF_ERROR(Expect(in[k] == prev * 10 + k, fmt::format("rank {}: ring message {} = {}", me, k, in[k])));

  // Blocking send/recv of an empty message, and different tags not mixed.
  if (R > 1) {
    int64_t a = 0, b = 0;
    if (me == 0) {
      const int64_t x = 11, y = 22;
      DISTCA_RETURN_IF_ERROR(c.Send(&y, sizeof y, 1, 2));
      DISTCA_RETURN_IF_ERROR(c.Send(&x, sizeof x, 1, 1));
      DISTCA_RETURN_IF_ERROR(c.Send(nullptr, 0, 1, 3));
    } else if (me == 1) {
      DISTCA_RETURN_IF_ERROR(c.Recv(&a, sizeof a, 0, 1));
      DISTCA_RETURN_IF_ERROR(c.Recv(&b, sizeof b, 0, 2));
      DISTCA_RETURN_IF_ERROR(c.Recv(nullptr, 0, 0, 3));
      DISTCA_RETURN_IF_ERROR(Expect(a == 11 && b == 22, "tags were mixed"));
    }
  }

  // Transfers of 128 bytes, a multiple of the small message size the MPI
  // tests set (64: two whole messages and an empty one), polled with Test;
  // and a receive of 128 that gets 64 (its last message is cancelled).
  if (R > 1) {
    const int tag = Comm::kMaxUserTag - 1;
    std::vector<std::byte> sent(128), got(128);
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = std::byte(i * 7 + me);
    CommRequest recv = c.IRecv(got.data(), 128, prev, tag);
    DISTCA_RETURN_IF_ERROR(c.Send(sent.data(), 128, next, tag));
    while (!recv.Test()) std::this_thread::yield();
    DISTCA_RETURN_IF_ERROR(recv.Wait());
    for (size_t i = 0; i < got.size(); ++i)
      DISTCA_RETURN_IF_ERROR(
          Expect(got[i] == std::byte(i * 7 + prev), fmt::format("rank {}: 128-byte byte {}", me, i)));
    if (me == 0) DISTCA_RETURN_IF_ERROR(c.Send(sent.data(), 64, 1, tag));
    if (me == 1) {
      const Status shorter = c.Recv(got.data(), 128, 0, tag);
      DISTCA_RETURN_IF_ERROR(
          Expect(!shorter.ok() && shorter.message().find("expected 128 bytes from rank 0") != std::string::npos,
                 "64 bytes where 128 are expected: " + shorter.ToString()));
    }
    // The tag is usable again: nothing of the failed receive is left posted.
    DISTCA_RETURN_IF_ERROR(c.Barrier());
    if (me == 0) DISTCA_RETURN_IF_ERROR(c.Send(sent.data(), 8, 1, tag));
    if (me == 1) {
      std::vector<std::byte> eight(8);
      DISTCA_RETURN_IF_ERROR(c.Recv(eight.data(), 8, 0, tag));
      DISTCA_RETURN_IF_ERROR(Expect(eight[7] == std::byte(7 * 7), "rank 1: the 8 bytes after a failed receive"));
    }
  }

  // A receive of another size than was sent is an error naming the sizes (on
  // a tag of its own: nothing else is in flight on it).
  if (R > 1) {
    const int tag = Comm::kMaxUserTag;
    int64_t wide = 7;
    int32_t narrow = 3;
    if (me == 0) {
      DISTCA_RETURN_IF_ERROR(c.Send(&wide, sizeof wide, 1, tag));      // 8 bytes where 4 are expected
      DISTCA_RETURN_IF_ERROR(c.Send(&narrow, sizeof narrow, 1, tag));  // 4 where 8 are
    } else if (me == 1) {
      const Status longer = c.Recv(&narrow, sizeof narrow, 0, tag);
      DISTCA_RETURN_IF_ERROR(
          Expect(!longer.ok() && longer.message().find("expected 4 bytes from rank 0") != std::string::npos,
                 "a longer message than the receive's: " + longer.ToString()));
      const Status shorter = c.Recv(&wide, sizeof wide, 0, tag);
      DISTCA_RETURN_IF_ERROR(
          Expect(!shorter.ok() && shorter.message().find("expected 8 bytes from rank 0") != std::string::npos,
                 "a shorter message than the receive's: " + shorter.ToString()));
    }
  }

  // Bad arguments are errors, not crashes.
  int64_t x = 0;
  const auto refused = [](const Status& s, const std::string& needle) {
    return !s.ok() && s.message().find(needle) != std::string::npos;
  };
  DISTCA_RETURN_IF_ERROR(
      Expect(refused(c.Send(&x, sizeof x, R, 0),
                     "rank " + std::to_string(R) + " does not exist (size " + std::to_string(R) + ")"),
             "send to a missing rank not refused by name"));
  DISTCA_RETURN_IF_ERROR(
      Expect(refused(c.Send(&x, sizeof x, 0, -1), "tag -1 is outside [0, "), "negative tag not refused by name"));
  DISTCA_RETURN_IF_ERROR(Expect(refused(c.Send(&x, sizeof x, 0, Comm::kMaxUserTag + 1),
                                        "tag " + std::to_string(Comm::kMaxUserTag + 1) + " is outside"),
                                "internal tag not refused by name"));
  return c.Barrier();
}

}  // namespace distca::testing
