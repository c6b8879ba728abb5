#!/usr/bin/env python3
"""Scans fields of the h200-dgx profile over the DistCA artifact's measured
iteration times: how well each combination of values predicts them.

The measured runs are bench/sim_measured_check.py's: the 11 runs of
CodeLlama-34B on 32 nodes over a whole sample (30 batches; each run's mean)
and the 100 (system, batch) times of Llama-3-8B's shape on 8 nodes (WLB at
CP 1, 2, 4, 8 and DistCA, 20 listed batches). For every combination of the
given values it prints the root mean square of log(measured / predicted)
over each set and over both, the mean of that log over both (positive:
predicted too fast), and DistCA's gain over the fastest WLB degree at the
two configurations where both systems ran a whole sample (34B 256K, 8
chunks; the 8B runs), measured and predicted.

Usage: bench/sim_fit_scan.py [--bin build/bin/distca-sim] FIELD=V1,V2,... [FIELD=...]
e.g. bench/sim_fit_scan.py network.inter_node.bandwidth=30e9,40e9,50e9 linear_mfu=0.53,0.56
(FIELD as distca-sim --hardware-set). About half a second per combination.
"""
import argparse
import itertools
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_measured_check as measured_check  # noqa: E402
from sim_report import ROOT  # noqa: E402 (the repository root)


def rms(values):
    return math.sqrt(sum(v * v for v in values) / len(values))


def gain(times):
    """DistCA over the fastest WLB degree, from {system: seconds} with DistCA
    under "d2" and the WLB degrees under any other key."""
    return min(t for k, t in times.items() if k != "d2") / times["d2"]


def cell_key(row):
    """A 34B run's system within its configuration: "d2" or its CP degree."""
    return "d2" if row["mode"] == "d2" else row["cp"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "distca-sim"))
    ap.add_argument("fields", nargs="+", metavar="FIELD=V1,V2,...")
    a = ap.parse_args()
    axes = []
    for spec in a.fields:
        field, sep, values = spec.partition("=")
        if not sep or not field or not values:
            sys.exit(f"sim_fit_scan: '{spec}' is not FIELD=V1,V2,...")
        axes.append([f"{field}={v}" for v in values.split(",")])

    runs = [r for r in measured_check.runs_34b() if int(r["num_samples"]) >= 30]
    # The configuration where both systems ran a whole sample: 34B 256K, 8 chunks.
    in_cell = [(r["nodes"], r["num_tokens"], r["bs"], r["mb"]) == ("32", "262144", "4", "1") for r in runs]
    measured_8b = measured_check.measured_8b()
    m34 = {cell_key(r): float(r["mean_ms"]) / 1000 for r, c in zip(runs, in_cell) if c}
    m8 = {k: statistics.mean(v) for k, v in measured_8b.items()}
    print(f"DistCA over the fastest WLB, measured: 34B 256K {gain(m34):.3f}, 8B {gain(m8):.3f}\n")
    print("| setting | rms 34B (11 runs) | rms 8B (100 batches) | rms, both | mean log, both | "
          "gain 34B 256K | gain 8B |")
    print("|---|---|---|---|---|---|---|")
    for overrides in itertools.product(*axes):
        logs34, p34 = [], {}
        for r, c in zip(runs, in_cell):
            predicted = measured_check.simulate(a.bin, r, 30, list(overrides))["iteration_s"]
            logs34.append(math.log(float(r["mean_ms"]) / 1000 / predicted))
            if c:
                p34[cell_key(r)] = predicted
        predicted_8b = measured_check.predicted_8b(a.bin, list(overrides))
        logs8 = [math.log(m / p) for k in measured_8b for m, p in zip(measured_8b[k], predicted_8b[k])]
        p8 = {k: statistics.mean(v) for k, v in predicted_8b.items()}
        both = logs34 + logs8
        print(f"| {' '.join(overrides)} | {rms(logs34):.4f} | {rms(logs8):.4f} | {rms(both):.4f} | "
              f"{statistics.mean(both):+.4f} | {gain(p34):.3f} | {gain(p8):.3f} |", flush=True)


if __name__ == "__main__":
    main()
