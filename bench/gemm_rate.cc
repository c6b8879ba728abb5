#include "bench/gemm_rate.h"

#include <omp.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/timer.h"
#include "oneapi/dnnl/dnnl.h"

namespace distca::bench {

double MeasureGemmGflops(int n, int threads, double min_seconds) {
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto* m : {&a, &b})
    for (float& x : *m) x = dist(rng);
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(threads);  // oneDNN's OpenMP runtime sizes its team from this
  double best = 1e30, total = 0.0;
  for (int rep = 0; rep < 2 || total < min_seconds; ++rep) {
    WallTimer t;
    const dnnl_status_t st = dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = t.Seconds();
    if (st != dnnl_success) {
      omp_set_num_threads(saved_threads);
      throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(int(st)));
    }
    if (rep > 0) {  // the first run warms up oneDNN's kernel cache
      best = std::min(best, s);
      total += s;
    }
  }
  omp_set_num_threads(saved_threads);
  return 2.0 * double(n) * n * n / best * 1e-9;
}

}  // namespace distca::bench
