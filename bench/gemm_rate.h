// This machine's fp32 GEMM rate with oneDNN: the yardstick that attention
// kernel throughput is reported against.
#pragma once

namespace distca::bench {

// GFLOP/s of a row-major n x n x n dnnl_sgemm on `threads` OpenMP threads:
// the best of repeated runs lasting at least `min_seconds` in all.
double MeasureGemmGflops(int n, int threads, double min_seconds);

}  // namespace distca::bench
