// Bad input comes back as an InvalidArgument Status naming the argument.
#include "attn/attention_testing.h"
#include "common/cpu_features.h"

namespace distca::testing {
namespace {

class ErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    batch_ = PackedBatch({{10, 12}, {5, 5}}, 4, 2, 8, true, 1);
    out_.assign(batch_.QSize(), 0.0f);
    lse_.assign(batch_.LseSize(), 0.0f);
    dq_.assign(batch_.QSize(), 0.0f);
    dk_.assign(batch_.KSize(), 0.0f);
    dv_.assign(batch_.KSize(), 0.0f);
  }
  AttentionForwardArgs Fwd() { return {batch_.q.data(), batch_.k.data(), batch_.v.data(), out_.data(), lse_.data()}; }
  AttentionBackwardArgs Bwd() {
    AttentionBackwardArgs a;
    a.q = batch_.q.data();
    a.k = batch_.k.data();
    a.v = batch_.v.data();
    a.dout = batch_.dout.data();
    a.lse = lse_.data();
    a.out = out_.data();
    a.dq = dq_.data();
    a.dk = dk_.data();
    a.dv = dv_.data();
    return a;
  }
  // Expects InvalidArgument whose message contains `needle`, from forward and backward.
  void ExpectRejected(const AttentionShape& shape, const std::vector<AttentionTask>& tasks, const std::string& needle) {
    for (const Status& s : {AttentionForward(shape, tasks, Fwd()), AttentionBackward(shape, tasks, Bwd())}) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
    }
  }

  Batch batch_;
  std::vector<float> out_, lse_, dq_, dk_, dv_;
};

TEST_F(ErrorsTest, ValidBatchIsAccepted) {
  EXPECT_TRUE(AttentionForward(batch_.shape, batch_.tasks, Fwd()).ok());
  EXPECT_TRUE(AttentionBackward(batch_.shape, batch_.tasks, Bwd()).ok());
}

TEST_F(ErrorsTest, BadShapes) {
  AttentionShape s = batch_.shape;
  s.kv_heads = 3;
  ExpectRejected(s, batch_.tasks, "not a multiple of shape.kv_heads");
  s = batch_.shape;
  s.q_heads = 0;
  ExpectRejected(s, batch_.tasks, "shape.q_heads");
  s = batch_.shape;
  s.head_dim = 0;
  ExpectRejected(s, batch_.tasks, "shape.head_dim");
  s.head_dim = AttentionShape::kMaxHeadDim + 1;
  ExpectRejected(s, batch_.tasks, "shape.head_dim");
  s = batch_.shape;
  s.total_q = -1;
  ExpectRejected(s, batch_.tasks, "shape.total_q");
  s = batch_.shape;
  s.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(s, batch_.tasks, "softmax_scale");
}

TEST_F(ErrorsTest, BadTasks) {
  std::vector<AttentionTask> t = batch_.tasks;
  t[1].q_len = -1;
  ExpectRejected(batch_.shape, t, "tasks[1] has a negative field");
  t = batch_.tasks;
  t[1].q_len = 6;  // runs past total_q = 15
  ExpectRejected(batch_.shape, t, "beyond shape.total_q");
  t = batch_.tasks;
  t[0].kv_len = 1000;
  ExpectRejected(batch_.shape, t, "beyond shape.total_k");
  t = batch_.tasks;
  t[1].q_offset = 9;  // overlaps task 0's rows [0, 10)
  t[1].q_len = 2;
  ExpectRejected(batch_.shape, t, "overlapping query rows");
  t = batch_.tasks;
  t[0].k_offset = std::numeric_limits<int64_t>::max();  // must not overflow
  ExpectRejected(batch_.shape, t, "beyond shape.total_k");
}

TEST_F(ErrorsTest, NullBuffers) {
  AttentionForwardArgs f = Fwd();
  f.v = nullptr;
  Status s = AttentionForward(batch_.shape, batch_.tasks, f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("args.v"), std::string::npos);
  f = Fwd();
  f.lse = nullptr;
  EXPECT_NE(AttentionForward(batch_.shape, batch_.tasks, f).message().find("args.lse"), std::string::npos);
  AttentionBackwardArgs b = Bwd();
  b.dk = nullptr;
  EXPECT_NE(AttentionBackward(batch_.shape, batch_.tasks, b).message().find("args.dk"), std::string::npos);
}

TEST_F(ErrorsTest, BackwardNeedsExactlyOneOfOutAndDelta) {
  AttentionBackwardArgs b = Bwd();
  b.out = nullptr;
  EXPECT_NE(AttentionBackward(batch_.shape, batch_.tasks, b).message().find("exactly one"), std::string::npos);
  b = Bwd();
  b.delta = lse_.data();
  EXPECT_NE(AttentionBackward(batch_.shape, batch_.tasks, b).message().find("exactly one"), std::string::npos);
}

TEST_F(ErrorsTest, BadCuSeqlens) {
  AttentionShape s = batch_.shape;
  const std::vector<int32_t> good_q = {0, 10, 15}, good_k = {0, 12, 17};
  EXPECT_TRUE(AttentionVarlenForward(s, good_q, good_k, Fwd()).ok());
  EXPECT_TRUE(AttentionVarlenBackward(s, good_q, good_k, Bwd()).ok());
  // Forward and backward alike.
  auto fails_with = [&](std::vector<int32_t> cq, std::vector<int32_t> ck, const std::string& needle) {
    for (const Status& st : {AttentionVarlenForward(s, cq, ck, Fwd()), AttentionVarlenBackward(s, cq, ck, Bwd())}) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      EXPECT_NE(st.message().find(needle), std::string::npos) << st.ToString();
    }
  };
  fails_with({0, 10, 9}, good_k, "cu_seqlens_q is not non-decreasing");
  fails_with(good_q, {0, 13, 12}, "cu_seqlens_k is not non-decreasing");
  fails_with({-1, 10, 15}, good_k, "cu_seqlens_q[0] must be 0");
  fails_with({0, 10}, good_k, "entries");
  fails_with({}, {}, "empty");
  fails_with({0, 10, 14}, good_k, "shape has total_q");
}

TEST_F(ErrorsTest, MergePartialsArguments) {
  std::vector<float> o(8), l(2);
  const auto expect_refused = [](const Status& s, const std::string& needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  expect_refused(MergePartials(1, 1, 8, o.data(), l.data(), nullptr, l.data(), o.data(), l.data()), "out2 is null");
  expect_refused(MergePartials(1, 0, 8, o.data(), l.data(), o.data(), l.data(), o.data(), l.data()),
                 "heads must be positive, got 0");
  expect_refused(MergePartials(1, 1, 0, o.data(), l.data(), o.data(), l.data(), o.data(), l.data()),
                 "head_dim must be positive, got 0");
  expect_refused(MergePartials(-1, 1, 8, o.data(), l.data(), o.data(), l.data(), o.data(), l.data()),
                 "rows is negative (-1)");
}

TEST_F(ErrorsTest, HugeSizesAreOutOfRange) {
  AttentionShape s = batch_.shape;
  s.total_q = std::numeric_limits<int64_t>::max() / 2;  // * heads * head_dim overflows int64
  const Status st = AttentionForward(s, {}, Fwd());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_NE(st.message().find("tensor sizes overflow 64-bit indexing"), std::string::npos) << st.ToString();
}

// A vector kernel the CPU (or DISTCA_CPU_MAX_ISA) does not allow is refused
// by name, not run. ctest also runs this under the scalar cap, so that it
// checks something on a machine that has every instruction set.
TEST_F(ErrorsTest, KernelBeyondTheCpuIsRefused) {
  const std::vector<AttentionKernel> available = AvailableAttentionKernels();
  for (AttentionKernel kernel : {AttentionKernel::kAvx2, AttentionKernel::kAvx512}) {
    if (std::find(available.begin(), available.end(), kernel) != available.end()) continue;
    const AttentionExec exec{kernel, 1};
    for (const Status& st : {AttentionForward(batch_.shape, batch_.tasks, Fwd(), exec),
                             AttentionBackward(batch_.shape, batch_.tasks, Bwd(), exec)}) {
      EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
      EXPECT_NE(st.message().find(std::string("attention kernel '") + AttentionKernelName(kernel) +
                                  "' needs instructions this CPU does not have"),
                std::string::npos)
          << st.ToString();
    }
  }
}

// The kernels offered follow the detected CPU (tests/common checks the
// detection against the kernel's flags).
TEST_F(ErrorsTest, AvailableKernelsFollowTheCpu) {
  const std::vector<AttentionKernel> available = AvailableAttentionKernels();
  const auto has = [&](AttentionKernel k) {
    return std::find(available.begin(), available.end(), k) != available.end();
  };
  EXPECT_TRUE(has(AttentionKernel::kReference));
  EXPECT_TRUE(has(AttentionKernel::kScalar));
#if defined(__x86_64__)
  EXPECT_EQ(has(AttentionKernel::kAvx2), DetectCpuFeatures().avx2_fma);
  EXPECT_EQ(has(AttentionKernel::kAvx512), DetectCpuFeatures().avx512);
#endif
}

TEST_F(ErrorsTest, ThreadCountsOutsideTheEnginesRangeAreRefused) {
  for (int threads : {-1, 1 << 20}) {
    const AttentionExec exec{AttentionKernel::kAuto, threads};
    for (const Status& st : {AttentionForward(batch_.shape, batch_.tasks, Fwd(), exec),
                             AttentionBackward(batch_.shape, batch_.tasks, Bwd(), exec)}) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << threads;
      EXPECT_NE(st.message().find("exec.num_threads must be in [0, 1024]"), std::string::npos) << st.ToString();
    }
  }
}

TEST_F(ErrorsTest, EmptyBatchIsFine) {
  AttentionShape s = batch_.shape;
  s.total_q = 0;
  s.total_k = 0;
  EXPECT_TRUE(AttentionForward(s, {}, {}).ok());
  EXPECT_TRUE(AttentionBackward(s, {}, {}).ok());
}

}  // namespace
}  // namespace distca::testing
