// `distca-bench profile`: measures this machine and writes a hardware
// profile for the simulator (docs/simulator.md, "Measuring a profile"):
// GEMM peak, the CA engine's cost table, the link between two ranks, memory,
// and the linear MFU and attention level fitted to colocated training steps;
// then checks the profile against colocated (in sample) and CAD (out of
// sample) steps of the same runs.
#pragma once

#include <string>

namespace distca::bench {

// The most runs per mix and mode: each is a few training runs of every mix.
inline constexpr int kMaxProfileReps = 100;

struct ProfileBenchOptions {
  std::string out;              // profile JSON to write; the table goes next to it (STEM-attention.csv)
  std::string name;             // the profile's "name"; Default: the file's stem
  std::string model = "small";  // distca-train preset the steps train. Default: small (tiny with short_mode)
  // CI mode: tiny model, 4096 tokens per rank, one run per mode, a small
  // table (refuses --model and --reps). Default: false
  bool short_mode = false;
  bool json = false;    // one JSON object (the profile's figures and the check) instead of a table. Default: false
  int reps = 3;         // runs per mix and mode, 1 to kMaxProfileReps (short mode: 1). Default: 3
  int local_ranks = 2;  // ranks when not launched by mpirun. Default: 2
};

// Runs on every rank of the backend (at least 2); rank 0 measures, fits,
// writes and prints. False with *error on failure.
bool RunProfileBench(const ProfileBenchOptions& options, std::string* error);

}  // namespace distca::bench
