#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <thread>

#include "comm/comm_checks.h"

namespace distca::testing {
namespace {

Status RunLocal(int ranks, const std::function<Status(Comm&)>& fn, double timeout = 60) {
  CommOptions o;
  o.backend = CommOptions::Backend::kLocal;
  o.local_ranks = ranks;
  o.timeout_seconds = timeout;
  return RunOnRanks(o, fn);
}

TEST(LocalCommTest, ContractOnManyRankCounts) {
  for (int ranks : {1, 2, 3, 4, 8}) {
    const Status s = RunLocal(ranks, CheckCommContract);
    EXPECT_TRUE(s.ok()) << ranks << " ranks: " << s.ToString();
  }
}

// The local all-reduce sums each element once, in rank order, and sends the
// sum to every rank: every rank holds the same bits, those of the plain sum
// in rank order, also with fewer elements than ranks and with none.
TEST(LocalCommTest, AllreduceIsTheRankOrderSumOnEveryRank) {
  const auto value = [](int rank, int64_t i) { return 0.1f * float(rank + 1) / float(i + 3); };
  for (int ranks : {1, 3, 5, 8}) {
    for (int64_t count : {int64_t{0}, int64_t{2}, int64_t{7}, int64_t{1001}}) {
      const Status s = RunLocal(ranks, [&](Comm& c) {
        std::vector<float> v(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) v[size_t(i)] = value(c.rank(), i);
        DISTCA_RETURN_IF_ERROR(c.AllreduceSum(v.data(), count));
        for (int64_t i = 0; i < count; ++i) {
          float sum = 0.0f;
          for (int p = 0; p < c.size(); ++p) sum += value(p, i);
          if (std::memcmp(&sum, &v[size_t(i)], sizeof sum) != 0)
            return Status::Internal(
                fmt::format("rank {}: element {} is {}, the rank-order sum {}", c.rank(), i, v[size_t(i)], sum));
        }
        return Status::Ok();
      });
      EXPECT_TRUE(s.ok()) << ranks << " ranks, " << count << " elements: " << s.ToString();
    }
  }
}

TEST(LocalCommTest, AllRanksShareTheMachine) {
  const Status s = RunLocal(
      3, [](Comm& c) { return c.machine_ranks() == 3 ? Status::Ok() : Status::Internal("machine_ranks is not 3"); });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(LocalCommTest, ContractWithInjectedDelays) {
  for (uint64_t seed : {1, 2, 3}) {
    const Status s = RunLocal(4, [&](Comm& c) {
      auto faulty = MakeFaultInjectingComm(&c, {.seed = seed * 100 + uint64_t(c.rank()), .max_delay_us = 300});
      return CheckCommContract(*faulty);
    });
    EXPECT_TRUE(s.ok()) << "seed " << seed << ": " << s.ToString();
  }
}

TEST(LocalCommTest, OneFailingRankStopsTheOthersQuickly) {
  const auto start = std::chrono::steady_clock::now();
  const Status s = RunLocal(4, [](Comm& c) -> Status {
    if (c.rank() == 2) return Status::InvalidArgument("bad plan on rank 2");
    int64_t x = 0;
    return c.Recv(&x, sizeof x, 2, 0);  // never sent: must not hang
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 2 failed: bad plan on rank 2"), std::string::npos) << s.ToString();
  EXPECT_LT(seconds, 5.0);
}

TEST(LocalCommTest, ExceptionsAreFailures) {
  const Status s = RunLocal(3, [](Comm& c) -> Status {
    if (c.rank() == 0) throw std::runtime_error("boom");
    return c.Barrier();
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("boom"), std::string::npos) << s.ToString();
  // An allocation that fails is said as such, not as an internal error.
  const Status oom = RunLocal(2, [](Comm& c) -> Status {
    if (c.rank() == 1) throw std::bad_alloc();
    return c.Barrier();
  });
  EXPECT_EQ(oom.code(), StatusCode::kUnavailable) << oom.ToString();
  EXPECT_NE(oom.message().find("rank 1 failed: out of memory"), std::string::npos) << oom.ToString();
}

TEST(LocalCommTest, WaitsTimeOutInsteadOfHanging) {
  const Status s = RunLocal(
      2,
      [](Comm& c) -> Status {
        int64_t x = 0;
        return c.Recv(&x, sizeof x, 1 - c.rank(), 0);  // both wait, nobody sends
      },
      0.2);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("waited"), std::string::npos) << s.ToString();
}

// A barrier after long work on one rank (rank 0 writing a checkpoint) waits
// past the message timeout; a plain barrier does not. A failure still ends
// the long wait at once.
TEST(LocalCommTest, BarrierAfterLongWorkOutwaitsTheTimeout) {
  const auto late_rank0 = [](bool long_barrier) {
    return [long_barrier](Comm& c) -> Status {
      if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
      return long_barrier ? c.BarrierAfterLongWork() : c.Barrier();
    };
  };
  EXPECT_TRUE(RunLocal(3, late_rank0(true), 0.1).ok());
  const Status plain = RunLocal(3, late_rank0(false), 0.1);
  EXPECT_EQ(plain.code(), StatusCode::kUnavailable) << plain.ToString();
  const auto start = std::chrono::steady_clock::now();
  const Status failed = RunLocal(
      3,
      [](Comm& c) -> Status {
        if (c.rank() == 0) return Status::IoError("the save failed");
        return c.BarrierAfterLongWork();
      },
      0.1);
  EXPECT_NE(failed.message().find("the save failed"), std::string::npos) << failed.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A receive that is only polled (Test) times out as a blocking one does:
// Test turns true at its deadline and Wait reports the missing peer.
TEST(LocalCommTest, PolledReceivesTimeOutToo) {
  const Status s = RunLocal(
      2,
      [](Comm& c) -> Status {
        if (c.rank() == 1) return Status::Ok();  // never sends
        int64_t x = 0;
        CommRequest r = c.IRecv(&x, sizeof x, 1, 0);
        while (!r.Test()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return r.Wait();
      },
      0.2);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("rank 0 waited 0.2 s for a message from rank 1"), std::string::npos) << s.ToString();
}

// Timeouts too long for the clock's nanoseconds (infinity included) wait
// for the message rather than fail at once.
TEST(LocalCommTest, HugeTimeoutsStillWait) {
  for (double timeout : {1e10, std::numeric_limits<double>::infinity()}) {
    const Status s = RunLocal(
        2,
        [](Comm& c) -> Status {
          int64_t x = 5;
          if (c.rank() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            return c.Send(&x, sizeof x, 1, 0);
          }
          return c.Recv(&x, sizeof x, 0, 0);
        },
        timeout);
    EXPECT_TRUE(s.ok()) << timeout << ": " << s.ToString();
  }
}

TEST(LocalCommTest, SizeMismatchIsAnError) {
  const Status s = RunLocal(2, [](Comm& c) -> Status {
    int64_t x = 1;
    if (c.rank() == 0) return c.Send(&x, sizeof x, 1, 0);
    int32_t y = 0;
    return c.Recv(&y, sizeof y, 0, 0);
  });
  EXPECT_NE(s.message().find("expected 4 bytes"), std::string::npos) << s.ToString();
}

TEST(CommTest, BackendChoice) {
  CommOptions o;
  o.local_ranks = 2;
  std::string backend;
  ASSERT_TRUE(RunOnRanks(o, [&](Comm& c) {
                if (c.rank() == 0) backend = c.backend();
                return Status::Ok();
              }).ok());
  EXPECT_EQ(backend, LaunchedByMpirun() ? "mpi" : "local");
  const Status none = RunLocal(0, [](Comm&) { return Status::Ok(); });
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("local backend needs ranks >= 1, got 0"), std::string::npos) << none.ToString();
  // More threads than one process should run: refused before any starts.
  const Status many = RunLocal(kMaxLocalRanks + 1, [](Comm&) { return Status::Ok(); });
  EXPECT_EQ(many.code(), StatusCode::kOutOfRange);
  EXPECT_NE(many.message().find("local backend runs at most " + std::to_string(kMaxLocalRanks) + " ranks"),
            std::string::npos)
      << many.ToString();
}

}  // namespace
}  // namespace distca::testing
