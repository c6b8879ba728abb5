// Layer kernels: every backward against central finite differences in double
// (tiny shapes), and the float kernels (GEMM through oneDNN) against the
// double ones.
//
// Each check uses the scalar loss f = sum(out * R) for a fixed random R, so
// dL/dout = R, and compares the kernel's gradient with
// (f(p + h) - f(p - h)) / (2h) for every input element p.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "model/layers.h"

namespace distca::model {
namespace {

std::vector<double> Random(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences with h = 1e-5 on inputs of size O(1): the truncation
// error is h^2/6 |f'''| ~ 1e-11 and the rounding error ~ eps_double |f| / h ~
// 1e-10 for |f| ~ 10, so a correct gradient agrees to ~1e-9. The tolerance
// 1e-7 (1 + |g|) leaves a 100x margin; a wrong term errs by O(0.1).
constexpr double kStep = 1e-5;
constexpr double kTolerance = 1e-7;

void ExpectGradient(const char* what, std::vector<double>* param, const std::vector<double>& grad,
                    const std::function<double()>& loss) {
  ASSERT_EQ(param->size(), grad.size()) << what;
  for (size_t i = 0; i < param->size(); ++i) {
    const double saved = (*param)[i];
    (*param)[i] = saved + kStep;
    const double plus = loss();
    (*param)[i] = saved - kStep;
    const double minus = loss();
    (*param)[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    EXPECT_NEAR(grad[i], numeric, kTolerance * (1.0 + std::abs(numeric))) << what << "[" << i << "]";
  }
}

TEST(LayerGradientTest, Embedding) {
  constexpr int V = 5, C = 3;
  const std::vector<int32_t> tokens = {2, 0, 2, 4};  // token 2 twice: its gradient is a sum
  const int64_t N = int64_t(tokens.size());
  std::vector<double> table = Random(V * C, 1), R = Random(size_t(N) * C, 2);
  std::vector<double> out(size_t(N) * C);
  auto loss = [&] {
    EmbeddingForward(out.data(), tokens.data(), table.data(), N, C);
    return Dot(out, R);
  };
  std::vector<double> dtable(V * C, 0.5);  // accumulates onto 0.5
  EmbeddingBackward(dtable.data(), R.data(), tokens.data(), N, C);
  for (double& g : dtable) g -= 0.5;
  ExpectGradient("dtable", &table, dtable, loss);
}

TEST(LayerGradientTest, RmsNorm) {
  constexpr int64_t N = 3;
  constexpr int C = 7;
  constexpr float eps = 1e-5f;
  std::vector<double> x = Random(N * C, 3), w = Random(C, 4), R = Random(N * C, 5);
  for (double& v : w) v += 1.0;
  std::vector<double> out(N * C), rstd(N);
  auto loss = [&] {
    RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return Dot(out, R);
  };
  loss();
  std::vector<double> dx(N * C, 0.25), dw(C, -1.0);  // both accumulate
  RmsNormBackward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (double& g : dx) g -= 0.25;
  for (double& g : dw) g += 1.0;
  ExpectGradient("dx", &x, dx, loss);
  ExpectGradient("dweight", &w, dw, loss);
  // rstd is 1 / sqrt(mean(x^2) + eps).
  double sum_sq = 0;
  for (int c = 0; c < C; ++c) sum_sq += x[c] * x[c];
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(sum_sq / C + eps), 1e-15);
}

TEST(LayerGradientTest, Linear) {
  constexpr int64_t N = 4;
  constexpr int I = 5, O = 3;
  std::vector<double> x = Random(N * I, 6), W = Random(O * I, 7), R = Random(N * O, 8);
  std::vector<double> out(N * O);
  auto loss = [&] {
    EXPECT_TRUE(LinearForward(out.data(), x.data(), W.data(), N, I, O, false).ok());
    return Dot(out, R);
  };
  std::vector<double> dx(N * I, 3.0), dW(O * I, 2.0);
  ASSERT_TRUE(LinearBackward(dx.data(), dW.data(), R.data(), x.data(), W.data(), N, I, O, false).ok());
  for (double& g : dW) g -= 2.0;  // dW accumulates; dx was overwritten
  ExpectGradient("dx", &x, dx, loss);
  ExpectGradient("dW", &W, dW, loss);

  // accumulate_dx adds; accumulate (forward) adds x W^T to out.
  std::vector<double> dx2(N * I, 3.0), dW2(O * I, 0.0);
  ASSERT_TRUE(LinearBackward(dx2.data(), dW2.data(), R.data(), x.data(), W.data(), N, I, O, true).ok());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], dx[i] + 3.0, 1e-14);
  std::vector<double> out2(N * O, 1.0);
  ASSERT_TRUE(LinearForward(out2.data(), x.data(), W.data(), N, I, O, true).ok());
  loss();
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out2[i], out[i] + 1.0, 1e-14);
}

TEST(LayerGradientTest, Rope) {
  constexpr int H = 2, D = 6;
  const std::vector<int64_t> positions = {0, 1, 7, 1000};  // e.g. a document piece starting at 1000
  const int64_t N = int64_t(positions.size());
  std::vector<double> cs(size_t(N) * D / 2), sn(size_t(N) * D / 2);
  RopeTables(cs.data(), sn.data(), positions.data(), N, D, 10000.0);
  std::vector<double> x = Random(size_t(N) * H * D, 9), R = Random(size_t(N) * H * D, 10);
  std::vector<double> out(x.size());
  auto loss = [&] {
    RopeForward(out.data(), H * D, x.data(), H * D, cs.data(), sn.data(), N, H, D);
    return Dot(out, R);
  };
  std::vector<double> dx(x.size());
  RopeBackward(dx.data(), H * D, R.data(), H * D, cs.data(), sn.data(), N, H, D);
  ExpectGradient("dx", &x, dx, loss);

  // The rotate_half convention: pair (i, i + D/2) turns by pos * theta^(-2i/D).
  loss();
  const int64_t row = 3, h = 1;
  for (int i = 0; i < D / 2; ++i) {
    const double angle = 1000.0 * std::pow(10000.0, -2.0 * i / D);
    const double x1 = x[(row * H + h) * D + i], x2 = x[(row * H + h) * D + i + D / 2];
    EXPECT_NEAR(out[(row * H + h) * D + i], x1 * std::cos(angle) - x2 * std::sin(angle), 1e-12);
    EXPECT_NEAR(out[(row * H + h) * D + i + D / 2], x2 * std::cos(angle) + x1 * std::sin(angle), 1e-12);
  }
  // Position 0 is the identity; in place with a row stride gives the same as out of place.
  for (int i = 0; i < H * D; ++i) EXPECT_EQ(out[i], x[i]);
  std::vector<double> padded(size_t(N) * (H * D + 3));
  for (int64_t n = 0; n < N; ++n) std::copy_n(x.begin() + n * H * D, H * D, padded.begin() + n * (H * D + 3));
  RopeForward(padded.data(), H * D + 3, padded.data(), H * D + 3, cs.data(), sn.data(), N, H, D);
  for (int64_t n = 0; n < N; ++n)
    for (int i = 0; i < H * D; ++i) EXPECT_EQ(padded[n * (H * D + 3) + i], out[n * H * D + i]);
}

TEST(LayerGradientTest, SwiGlu) {
  constexpr int64_t N = 3;
  constexpr int F = 4;
  std::vector<double> gate_up = Random(N * 2 * F, 11, 3.0), R = Random(N * F, 12);
  std::vector<double> out(N * F);
  auto loss = [&] {
    SwiGluForward(out.data(), gate_up.data(), N, F);
    return Dot(out, R);
  };
  std::vector<double> dgu(gate_up.size());
  SwiGluBackward(dgu.data(), R.data(), gate_up.data(), N, F);
  ExpectGradient("dgate_up", &gate_up, dgu, loss);
  loss();
  const double g = gate_up[1], u = gate_up[F + 1];
  EXPECT_NEAR(out[1], g / (1 + std::exp(-g)) * u, 1e-15);
}

TEST(LayerGradientTest, CrossEntropy) {
  constexpr int64_t N = 4;
  constexpr int V = 6;
  constexpr double scale = 0.3;
  const std::vector<int32_t> targets = {2, -1, 0, 5};
  std::vector<double> logits = Random(N * V, 13, 4.0);
  std::vector<double> losses(N), dlogits(N * V);
  auto loss = [&] {
    CrossEntropyForwardBackward(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, scale);
    double s = 0;
    for (double l : losses) s += l;
    return scale * s;
  };
  loss();
  const std::vector<double> analytic = dlogits;
  ExpectGradient("dlogits", &logits, analytic, loss);
  loss();  // back at the unperturbed logits
  EXPECT_EQ(losses[1], 0.0);
  for (int i = 0; i < V; ++i) EXPECT_EQ(analytic[V + i], 0.0);  // the ignored row

  // In place, and stable for huge logits: shifting a row does not change it.
  std::vector<double> shifted = logits;
  for (double& l : shifted) l += 1e4;
  std::vector<double> losses2(N);
  EXPECT_EQ(CrossEntropyForwardBackward(losses2.data(), shifted.data(), shifted.data(), targets.data(), N, V, scale),
            3);
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(losses2[n], losses[n], 1e-11);
  for (size_t i = 0; i < shifted.size(); ++i) EXPECT_NEAR(shifted[i], analytic[i], 1e-12);
  std::vector<float> big = {1e30f, -1e30f, 0.0f};
  float l = 0;
  const int32_t t = 1;
  CrossEntropyForwardBackward(&l, big.data(), big.data(), &t, 1, 3, 1.0);
  // log-sum-exp 1e30 less the target's -1e30; softmax (1, 0, 0) less the
  // one-hot of the target.
  EXPECT_EQ(l, 2e30f);
  EXPECT_EQ(big, (std::vector<float>{1.0f, -1.0f, 0.0f}));
}

// ---------------------------------------------------------------------------
// float kernels against double kernels on the same (float-representable) inputs.

std::vector<float> ToFloat(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }
std::vector<double> ToDouble(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Element-wise kernels do a few fp32 operations per output (plus exp or
// sqrt, within a few ulp each) on O(1) values, with sums over a row of C
// terms accumulated in double, so their error is a small multiple of
// eps_fp32 times the magnitude of the array; 64 eps * max|ref| is safe and
// far below the size of any real bug.
void ExpectClose(const char* what, const std::vector<float>& got, const std::vector<double>& ref) {
  ASSERT_EQ(got.size(), ref.size());
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  const double tol = 64 * std::numeric_limits<float>::epsilon() * std::max(scale, 1e-30);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref[i], tol) << what << "[" << i << "]";
}

TEST(LayerFloatTest, GemmThroughOneDnnMatchesDouble) {
  // Odd sizes and all four transpose cases; inner dimension K.
  constexpr int64_t M = 7, N = 13, K = 37;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<double> a = ToDouble(ToFloat(Random(M * K, 14))), b = ToDouble(ToFloat(Random(K * N, 15)));
      const std::vector<double> c0 = ToDouble(ToFloat(Random(M * N, 16)));
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<double> cd = c0;
      std::vector<float> cf = ToFloat(c0);
      ASSERT_TRUE(Gemm(ta, tb, M, N, K, 0.5, a.data(), lda, b.data(), ldb, 1.0, cd.data(), N).ok());
      const std::vector<float> af = ToFloat(a), bf = ToFloat(b);
      ASSERT_TRUE(Gemm(ta, tb, M, N, K, 0.5f, af.data(), lda, bf.data(), ldb, 1.0f, cf.data(), N).ok());
      // Standard bound for a K-term fp32 dot product: |error| <= K eps sum|a_k b_k| (+ the final add).
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double abs_sum = std::abs(c0[i * N + j]);
          for (int64_t k = 0; k < K; ++k)
            abs_sum += 0.5 * std::abs((ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]));
          const double tol = (K + 2) * std::numeric_limits<float>::epsilon() * abs_sum;
          EXPECT_NEAR(cf[i * N + j], cd[i * N + j], tol) << "ta " << ta << " tb " << tb << " (" << i << "," << j << ")";
        }
      }
    }
  }
  // Degenerate sizes: M = 0 touches nothing, K = 0 gives beta * C.
  std::vector<float> c = {1.0f, 2.0f};
  ASSERT_TRUE(Gemm(false, false, 0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, nullptr, 2).ok());
  ASSERT_TRUE(Gemm(false, false, 1, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2).ok());
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.0f}));
  const Status narrow = Gemm(false, false, 2, 2, 3, 1.0f, c.data(), 2, c.data(), 2, 0.0f, c.data(), 2);  // lda < K
  EXPECT_NE(narrow.message().find("leading dimensions lda=2 ldb=2 ldc=2 are too small for M=2 N=2 K=3"),
            std::string::npos)
      << narrow.ToString();
}

TEST(LayerFloatTest, KernelsMatchDouble) {
  constexpr int64_t N = 5;
  constexpr int C = 64, V = 50, F = 24, H = 2, D = 8;
  const std::vector<int32_t> tokens = {3, 49, 0, 3, 17};
  const std::vector<int32_t> targets = {1, -1, 49, 0, 7};
  const std::vector<int64_t> positions = {0, 5, 130, 4096, 70000};
  // Inputs rounded to float once, so both precisions see the same values.
  const std::vector<double> x = ToDouble(ToFloat(Random(N * C, 20))), w = ToDouble(ToFloat(Random(C, 21)));
  const std::vector<double> dy = ToDouble(ToFloat(Random(N * C, 22)));
  const std::vector<double> table = ToDouble(ToFloat(Random(size_t(V) * C, 23)));
  const std::vector<double> gu = ToDouble(ToFloat(Random(N * 2 * F, 24, 3.0)));
  const std::vector<double> dact = ToDouble(ToFloat(Random(N * F, 25)));
  const std::vector<double> logits = ToDouble(ToFloat(Random(N * V, 26, 5.0)));
  const std::vector<double> qk = ToDouble(ToFloat(Random(N * H * D, 27)));

  {  // embedding
    std::vector<double> od(N * C), dtd(size_t(V) * C);
    std::vector<float> of(N * C), dtf(size_t(V) * C);
    const std::vector<float> tf = ToFloat(table), dyf = ToFloat(dy);
    EmbeddingForward(od.data(), tokens.data(), table.data(), N, C);
    EmbeddingForward(of.data(), tokens.data(), tf.data(), N, C);
    EmbeddingBackward(dtd.data(), dy.data(), tokens.data(), N, C);
    EmbeddingBackward(dtf.data(), dyf.data(), tokens.data(), N, C);
    ExpectClose("embedding out", of, od);
    ExpectClose("embedding dtable", dtf, dtd);
  }
  {  // RMSNorm
    std::vector<double> od(N * C), rd(N), dxd(N * C), dwd(C);
    std::vector<float> of(N * C), rf(N), dxf(N * C), dwf(C);
    const std::vector<float> xf = ToFloat(x), wf = ToFloat(w), dyf = ToFloat(dy);
    RmsNormForward(od.data(), rd.data(), x.data(), w.data(), N, C, 1e-5f);
    RmsNormForward(of.data(), rf.data(), xf.data(), wf.data(), N, C, 1e-5f);
    RmsNormBackward(dxd.data(), dwd.data(), dy.data(), x.data(), w.data(), rd.data(), N, C);
    RmsNormBackward(dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), rf.data(), N, C);
    ExpectClose("rmsnorm out", of, od);
    ExpectClose("rmsnorm rstd", rf, rd);
    ExpectClose("rmsnorm dx", dxf, dxd);
    ExpectClose("rmsnorm dweight", dwf, dwd);
  }
  {  // RoPE at large positions: angles are computed in double, so float tables lose nothing but rounding
    std::vector<double> cd(N * D / 2), sd(N * D / 2), od(qk.size()), bd(qk.size());
    std::vector<float> cf(N * D / 2), sf(N * D / 2), of(qk.size()), bf(qk.size());
    const std::vector<float> qf = ToFloat(qk);
    RopeTables(cd.data(), sd.data(), positions.data(), N, D, 500000.0);
    RopeTables(cf.data(), sf.data(), positions.data(), N, D, 500000.0);
    RopeForward(od.data(), H * D, qk.data(), H * D, cd.data(), sd.data(), N, H, D);
    RopeForward(of.data(), H * D, qf.data(), H * D, cf.data(), sf.data(), N, H, D);
    RopeBackward(bd.data(), H * D, qk.data(), H * D, cd.data(), sd.data(), N, H, D);
    RopeBackward(bf.data(), H * D, qf.data(), H * D, cf.data(), sf.data(), N, H, D);
    ExpectClose("rope forward", of, od);
    ExpectClose("rope backward", bf, bd);
  }
  {  // SwiGLU
    std::vector<double> od(N * F), dd(N * 2 * F);
    std::vector<float> of(N * F), df(N * 2 * F);
    const std::vector<float> guf = ToFloat(gu), daf = ToFloat(dact);
    SwiGluForward(od.data(), gu.data(), N, F);
    SwiGluForward(of.data(), guf.data(), N, F);
    SwiGluBackward(dd.data(), dact.data(), gu.data(), N, F);
    SwiGluBackward(df.data(), daf.data(), guf.data(), N, F);
    ExpectClose("swiglu out", of, od);
    ExpectClose("swiglu dgate_up", df, dd);
  }
  {  // cross-entropy
    std::vector<double> ld(N), dd(N * V);
    std::vector<float> lf(N), df(N * V);
    const std::vector<float> logf = ToFloat(logits);
    EXPECT_EQ(CrossEntropyForwardBackward(ld.data(), dd.data(), logits.data(), targets.data(), N, V, 0.25), 4);
    EXPECT_EQ(CrossEntropyForwardBackward(lf.data(), df.data(), logf.data(), targets.data(), N, V, 0.25), 4);
    ExpectClose("cross-entropy losses", lf, ld);
    ExpectClose("cross-entropy dlogits", df, dd);
  }
  {  // linear (oneDNN) forward and backward, inner dimensions C and O = 40
    constexpr int O = 40;
    const std::vector<double> W = ToDouble(ToFloat(Random(O * C, 28))), g = ToDouble(ToFloat(Random(N * O, 29)));
    std::vector<double> od(N * O), dxd(N * C), dWd(O * C);
    std::vector<float> of(N * O), dxf(N * C), dWf(O * C);
    const std::vector<float> xf = ToFloat(x), Wf = ToFloat(W), gf = ToFloat(g);
    ASSERT_TRUE(LinearForward(od.data(), x.data(), W.data(), N, C, O, false).ok());
    ASSERT_TRUE(LinearForward(of.data(), xf.data(), Wf.data(), N, C, O, false).ok());
    ASSERT_TRUE(LinearBackward(dxd.data(), dWd.data(), g.data(), x.data(), W.data(), N, C, O, false).ok());
    ASSERT_TRUE(LinearBackward(dxf.data(), dWf.data(), gf.data(), xf.data(), Wf.data(), N, C, O, false).ok());
    // The fp32 GEMM bound |error| <= (K + 2) eps sum_k |a_k b_k| per element; the sums of |a_k b_k| are the
    // same layers run in double on absolute values.
    auto absolute = [](std::vector<double> v) {
      for (double& e : v) e = std::abs(e);
      return v;
    };
    std::vector<double> ob(N * O), dxb(N * C), dWb(O * C);
    ASSERT_TRUE(LinearForward(ob.data(), absolute(x).data(), absolute(W).data(), N, C, O, false).ok());
    ASSERT_TRUE(LinearBackward(dxb.data(), dWb.data(), absolute(g).data(), absolute(x).data(), absolute(W).data(), N, C,
                               O, false)
                    .ok());
    auto expect_within = [](const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                            const std::vector<double>& abs_sum, int64_t K) {
      for (size_t i = 0; i < got.size(); ++i) {
        const double tol = double(K + 2) * std::numeric_limits<float>::epsilon() * abs_sum[i];
        EXPECT_NEAR(got[i], ref[i], tol) << what << "[" << i << "]";
      }
    };
    expect_within("linear out", of, od, ob, C);
    expect_within("linear dx", dxf, dxd, dxb, O);
    expect_within("linear dW", dWf, dWd, dWb, N);
  }
}

// Shapes past the row-wise kernels' OpenMP thresholds: 1 and 4 threads give
// the same bits (layers.h: every row is computed by one thread, and sums
// over rows run serially). The GEMMs (oneDNN) promise no such thing and are
// not checked here.
TEST(LayerFloatTest, ThreadCountDoesNotChangeResults) {
  constexpr int64_t N = 640;
  constexpr int C = 64, V = 256, F = 64, H = 4, D = 16;
  const std::vector<float> x = ToFloat(Random(N * C, 40)), w = ToFloat(Random(C, 41));
  const std::vector<float> dy = ToFloat(Random(N * C, 42)), table = ToFloat(Random(size_t(V) * C, 43));
  const std::vector<float> gu = ToFloat(Random(N * 2 * F, 44, 3.0)), dact = ToFloat(Random(N * F, 45));
  const std::vector<float> logits = ToFloat(Random(N * V, 46, 5.0)), qk = ToFloat(Random(N * H * D, 47));
  std::vector<int32_t> tokens(N), targets(N);
  std::vector<int64_t> positions(N);
  for (int64_t n = 0; n < N; ++n) {
    tokens[size_t(n)] = int32_t((n * 37) % V);
    targets[size_t(n)] = n % 9 == 0 ? -1 : int32_t((n * 11) % V);
    positions[size_t(n)] = n * 13;
  }
  // Every output of every float kernel, back to back.
  const auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> out;
    out.reserve(32);  // the pointers handed out stay valid
    const auto add = [&](size_t n) -> float* { return out.emplace_back(n).data(); };
    EmbeddingForward(add(N * C), tokens.data(), table.data(), N, C);
    EmbeddingBackward(add(size_t(V) * C), dy.data(), tokens.data(), N, C);
    float* rstd = add(N);
    RmsNormForward(add(N * C), rstd, x.data(), w.data(), N, C, 1e-5f);
    RmsNormBackward(add(N * C), add(C), dy.data(), x.data(), w.data(), rstd, N, C);
    float* cos_table = add(N * D / 2);
    float* sin_table = add(N * D / 2);
    RopeTables(cos_table, sin_table, positions.data(), N, D, 500000.0);
    RopeForward(add(qk.size()), H * D, qk.data(), H * D, cos_table, sin_table, N, H, D);
    RopeBackward(add(qk.size()), H * D, qk.data(), H * D, cos_table, sin_table, N, H, D);
    SwiGluForward(add(N * F), gu.data(), N, F);
    SwiGluBackward(add(N * 2 * F), dact.data(), gu.data(), N, F);
    float* losses = add(N);
    const int64_t count = CrossEntropyForwardBackward(losses, add(N * V), logits.data(), targets.data(), N, V, 0.5);
    add(1)[0] = float(count);
    omp_set_num_threads(saved);
    return out;
  };
  const auto one = run(1), four = run(4);
  ASSERT_EQ(one.size(), four.size());
  for (size_t k = 0; k < one.size(); ++k)
    EXPECT_EQ(std::memcmp(one[k].data(), four[k].data(), sizeof(float) * one[k].size()), 0) << "output " << k;
}

}  // namespace
}  // namespace distca::model
