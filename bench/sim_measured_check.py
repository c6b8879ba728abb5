#!/usr/bin/env python3
"""Compares distca-sim's iteration times with the ones the DistCA artifact
measured on H200s for its WLB baseline and for DistCA.

bench/data/artifact-measured-times.csv holds the artifact's measured tables
(hao-ai-lab/DistCA, benchmarks2/_251020_perseq_dpcp/table.tsv,
benchmarks2/_251025_perseq_pp/table.tsv and
benchmarks2/_251029_perseq_dpcp_v2/table.tsv, October 2025): one row per run
of CodeLlama-34B (48 layers, tp 8), with the mean, smallest and largest
iteration time over its sampled batches. The check takes the runs on the
Pretrain sample (dataset `wlbllm`) of the paper's two systems: `wlbllm`,
the WLB baseline with per-document CP of degree `cp` (wlb-ideal with --cp
and --wlb-artifact-kv),
and `d2`, DistCA (distca-paper, its 2 GB NVSHMEM buffer as --comm-budget).
Left out: the ProLong runs (no ProLong length distribution here) and
`wlbllm_perseq` (per-sequence CP over variable-length packing, which no
strategy here models). How a row becomes a batch is as in
bench/sim_memory_check.py: 2 bs mb sequences of exactly t tokens in mb
micro-batches, elongation t / 64K, the MLP recomputed, the optimizer never
stepped (--no-optimizer-step) and the gradients never synchronized
(--no-grad-sync): its benchmark (tests/test_e2e_combined.py) times
forward and backward between barriers, with its planning outside the timing,
and neither calls Megatron's gradient reduction nor, under the sweep's
EXPERIMENT_SKIP_OPTIMIZER_STEP, the optimizer. Batch i holds the same
documents in both systems (one seeded stream), so their means compare.
The test ArtifactTimesTest keeps the agreement below.

A second, earlier set is of Llama-3-8B's shape (DeepSeek-R1-Distill-Llama-8B
cut to 4 layers) on 8 nodes at tp 8, August 2025
(benchmarks/_250809_e2e_benchmark/data/0827.d2_vs_wlb.256k/*.json): 20
batches of four 256K-token sequences (the documents as listed in
bench/data/artifact-8b-256k-batches.json), each timed by the WLB baseline at
DP x CP 8x1, 4x2, 2x4 and 1x8 and by DistCA (bench/data/
artifact-8b-256k-times.csv, milliseconds). That benchmark timed forward,
backward and the optimizer step with no gradient reduction, the MLP kept,
and re-balanced the documents over data-parallel replicas as wlb-ideal does;
the check runs the listed batches (--docs-file) with --no-grad-sync.

The earliest set (August 9-13, 2025, same folder's data/ and analysis/;
bench/data/artifact-8b-dp-runs.csv) has the same model at 2, 4 or 8 layers
on 2 or 4 nodes at tp 8 with no CP: each of DP ranks r runs sequences r and
r + DP as given, the baseline with its own documents' attention (megatron
at CP 1 here), DistCA rebalancing core attention over the ranks in two
ping-pong halves. The layer counts of its first three sets are inferred
(their durations match stored runs that record them), so this set is
printed, not tested.

Prints each run's measured and predicted seconds, and per configuration the
speedup of DistCA over the fastest WLB degree, measured and predicted (over
the CP degrees that were measured).

Usage: bench/sim_measured_check.py [--bin build/bin/distca-sim] [--batches N] [--set FIELD=VALUE ...]
(N: sampled batches per run, default 30; --set changes a field of the
h200-dgx profile, as distca-sim --hardware-set). Takes about a second on 2 cores.
"""
import csv
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim_memory_check as memory_check  # noqa: E402
from sim_report import ROOT  # noqa: E402 (the repository root)

DATA = os.path.join(ROOT, "bench", "data", "artifact-measured-times.csv")
BATCHES_8B = os.path.join(ROOT, "bench", "data", "artifact-8b-256k-batches.json")
TIMES_8B = os.path.join(ROOT, "bench", "data", "artifact-8b-256k-times.csv")
DP_RUNS_8B = os.path.join(ROOT, "bench", "data", "artifact-8b-dp-runs.csv")


def simulate(binary, row, batches, overrides):
    """A measured run as sim_memory_check runs a recorded one: tp 8, 48
    layers, the MLP recomputed, DistCA's 2 GB buffer."""
    run = dict(row, t=row["num_tokens"], tp="8", layers="48", buffer_gb="2")
    return memory_check.simulate(binary, run, batches, True, overrides)


def runs_34b():
    """The 34B runs the check compares: the Pretrain sample's (`wlbllm`)
    runs of the WLB baseline and of DistCA, as rows of the measured table."""
    return [r for r in csv.DictReader(open(DATA)) if r["dataset"] == "wlbllm" and r["mode"] in ("wlbllm", "d2")]


def main():
    a = memory_check.parse_check_args(__doc__, 30, "sampled batches per run (default 30)")
    rows = runs_34b()
    groups = {}
    print("| config | system | measured s (batches) | predicted s | measured / predicted | predicted fits |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for row in rows:
        r = simulate(a.bin, row, a.batches, a.set)
        measured, predicted = float(row["mean_ms"]) / 1000, r["iteration_s"]
        key = (int(row["nodes"]), int(row["num_tokens"]), int(row["bs"]), int(row["mb"]), int(row["pp"]))
        system = "DistCA" if row["mode"] == "d2" else f"WLB cp {row['cp']}"
        groups.setdefault(key, {})[system] = (measured, predicted, int(row["num_samples"]))
        ratios.append((measured / predicted, int(row["num_samples"]) >= 30))
        name = f"{key[0]} nodes, {key[1] // 1024}K, {2 * key[2] * key[3]} chunks"
        print(f"| {name} | {system} | {measured:.2f} ({row['num_samples']}) | {predicted:.2f} | "
              f"{measured / predicted:.3f} | {'yes' if r['memory_fits'] else 'no'} |")
    for label, subset in (("all runs", [r for r, _ in ratios]), ("runs over 30 batches", [r for r, w in ratios if w])):
        print(f"\nmeasured / predicted, {label}: {min(subset):.3f}-{max(subset):.3f}, mean "
              f"{statistics.mean(subset):.3f}, median {statistics.median(subset):.3f} ({len(subset)} runs)")
    print()
    print("| config | fastest WLB, measured | DistCA over it, measured | fastest WLB, predicted | predicted |")
    print("|---|---|---|---|---|")
    for (nodes, t, bs, mb, pp), runs in groups.items():
        wlb = {s: v for s, v in runs.items() if s.startswith("WLB")}
        if "DistCA" not in runs or not wlb:
            continue
        best_m = min(wlb, key=lambda s: wlb[s][0])
        best_p = min(wlb, key=lambda s: wlb[s][1])
        d = runs["DistCA"]
        # The means are over the batches each run got through; where DistCA
        # stopped early they are not over the same batches.
        batches = f"{d[2]} batches" if d[2] == wlb[best_m][2] else f"DistCA over {d[2]} batches, WLB {wlb[best_m][2]}"
        print(f"| {nodes} nodes, {t // 1024}K, {2 * bs * mb} chunks | {best_m} | {wlb[best_m][0] / d[0]:.3f} "
              f"({batches}) | {best_p} | {wlb[best_p][1] / d[1]:.3f} |")
    check_8b(a.bin, a.set)
    check_8b_dp(a.bin, a.set)


def measured_8b():
    """The Llama-3-8B runs' measured seconds: per system ("d2" or
    "wlbllm_cpC", the times file's columns) one time per listed batch."""
    rows = list(csv.DictReader(open(TIMES_8B)))
    return {k[:-3]: [float(r[k]) / 1000 for r in rows] for k in rows[0] if k.endswith("_ms")}


def predicted_8b(binary, overrides):
    """The same runs' predicted seconds, keyed and listed as measured_8b's."""
    predicted = {}
    for cp in (1, 2, 4, 8):
        cmd = [binary, "--model", "llama3-8b", "--num-layers", "4", "--gpus", "64", "--tp", "8", "--cp", str(cp),
               "--docs-file", BATCHES_8B, "--micro-batches", "1", "--no-grad-sync", "--json",
               "--strategies", "wlb-ideal" + (",distca-paper" if cp == 1 else "")]
        for r in memory_check.run_json(cmd, overrides):
            predicted["d2" if r["strategy"] == "distca-paper" else f"wlbllm_cp{cp}"] = r["iteration_per_batch_s"]
    return predicted


def check_8b(binary, overrides):
    """The Llama-3-8B runs: mean measured and predicted seconds per system
    over the 20 listed batches, and DistCA over the fastest WLB degree."""
    per_batch = measured_8b()
    measured = {k: statistics.mean(v) for k, v in per_batch.items()}
    predicted = {k: statistics.mean(v) for k, v in predicted_8b(binary, overrides).items()}
    print(f"\nLlama-3-8B shape, 4 layers, 8 nodes, tp 8, {len(per_batch['d2'])} batches of 4 x 256K tokens (August 2025):\n")
    print("| system | measured s | predicted s | measured / predicted |")
    print("|---|---|---|---|")

    def name(k):  # "d2" or "wlbllm_cpC", the times file's columns
        cp = int(k.removeprefix("wlbllm_cp")) if k != "d2" else 0
        return f"WLB dp {8 // cp} cp {cp}" if cp else "DistCA"

    for k, m in measured.items():
        print(f"| {name(k)} | {m:.3f} | {predicted[k]:.3f} | {m / predicted[k]:.3f} |")
    wlb = [k for k in measured if k != "d2"]
    best_m = min(wlb, key=measured.get)
    best_p = min(wlb, key=predicted.get)
    print(f"\nfastest WLB: measured {name(best_m)}, predicted {name(best_p)}; DistCA over it: measured "
          f"{measured[best_m] / measured['d2']:.3f}, predicted {predicted[best_p] / predicted['d2']:.3f}")


def check_8b_dp(binary, overrides):
    """The earliest Llama-3-8B runs, plain data parallelism against DistCA:
    per set, the mean measured and predicted seconds of both."""
    sets = {}
    for r in csv.DictReader(open(DP_RUNS_8B)):
        sets.setdefault(r["set"], []).append(r)
    print("\nLlama-3-8B shape, plain data parallelism, tp 8 (August 2025):\n")
    print("| set | layers | GPUs | batches | baseline measured / predicted s | ratio | DistCA measured / predicted s "
          "| ratio | DistCA's gain, measured / predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows in sets.items():
            dp = int(rows[0]["dp"])
            batches = []
            for r in rows:  # rank k holds sequences k and k + DP, in that order
                seqs = json.loads(r["lists"])
                batches.append([n for k in range(dp) for n in seqs[k] + seqs[k + dp]])
            docs = os.path.join(tmp, "batches.json")
            with open(docs, "w") as f:
                json.dump({"batches": batches}, f)
            cmd = [binary, "--model", "llama3-8b", "--num-layers", rows[0]["layers"], "--gpus", str(8 * dp), "--tp",
                   "8", "--cp", "1", "--docs-file", docs, "--no-grad-sync", "--json", "--strategies",
                   "megatron,distca-paper"]
            p = {r["strategy"]: r["iteration_s"] for r in memory_check.run_json(cmd, overrides)}
            mb = statistics.mean(float(r["baseline_ms"]) for r in rows) / 1000
            md = statistics.mean(float(r["d2_ms"]) for r in rows) / 1000
            pb, pd = p["megatron"], p["distca-paper"]
            print(f"| {name} | {rows[0]['layers']} | {8 * dp} | {len(rows)} | {mb:.3f} / {pb:.3f} | {mb / pb:.3f} | "
                  f"{md:.3f} / {pd:.3f} | {md / pd:.3f} | {mb / md:.3f} / {pb / pd:.3f} |")


if __name__ == "__main__":
    main()
