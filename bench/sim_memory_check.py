#!/usr/bin/env python3
"""Checks distca-sim's memory model against the runs the DistCA artifact
recorded as fitting or running out of memory on H200s.

bench/data/artifact-memory-outcomes.csv holds the outcomes the artifact's
34B sweep configurations record (hao-ai-lab/distca,
benchmarks/_250923_test_pp_34b/config_sweep_memory.config*.sh): one row per
distinct configuration of CodeLlama-34B (48 layers) on the Pretrain sample
(`runs` says how many recorded runs it stands for; repeated runs of one
configuration never disagree on fitting), with `pass` (every sampled
iteration ran), `partial` (at least one did) or `oom` (the log holds
OutOfMemoryError). Left out: runs that failed for another or
an unknown reason, runs on the ProLong sample or whose sample is uncertain,
and debug runs of single full-length documents. How a row becomes a batch
(tests/test_wlb_e2e.py, tests/test_megatron_e2e_pipeline_with_cp.py):

- both modes read 2 bs mb sequences of exactly t tokens per iteration and
  run mb micro-batches, MLP recomputed (selective checkpointing, the
  launcher's default), the optimizer never stepped (so Adam's moments are
  never allocated): distca-sim --batch-size 2 bs mb --micro-batches mb
  --recompute-mlp --no-optimizer-step, elongate t / 64K as the launcher;
- the WLB baseline's per-document CP keeps the K/V prefixes it
  concatenates for its query chunks besides the gathered K/V (wlbllm's
  PerDocumentCPAttention): --wlb-artifact-kv;
- wlbllm (the WLB baseline) runs per-document CP of degree cp over
  8 n / (tp pp cp) replicas: wlb-ideal with --cp cp;
- d2 (DistCA) has no CP degree: its `cp` is the ranks per stage, 8 n / (tp
  pp); distca-paper with the NVSHMEM buffer as --comm-budget. Whether it
  recomputes the MLP is not settled (its worker does not pass the MLP to
  Megatron's selective recomputation), so d2 rows are run both ways.

Usage: bench/sim_memory_check.py [--bin build/bin/distca-sim] [--batches N]
                                 [--set FIELD=VALUE ...]
(N caps the sampled batches per run; default: as many as the run sampled,
1, 5 or 30; --set changes a field of the h200-dgx profile, as distca-sim
--hardware-set, e.g. memory_bytes=130e9). Prints, per mode, how many runs the model puts on the right side
of the device's memory, and every miss with the predicted peak.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_report import PRETRAIN, ROOT  # noqa: E402 (the Pretrain recipe's flags, the repository root)

DATA = os.path.join(ROOT, "bench", "data", "artifact-memory-outcomes.csv")


def simulate(binary, row, batches, recompute_mlp, overrides):
    """One recorded run (a dict with nodes, bs, mb, t, mode, cp, pp, tp,
    layers, buffer_gb) through distca-sim; its JSON result."""
    nodes, bs, mb, t = int(row["nodes"]), int(row["bs"]), int(row["mb"]), int(row["t"])
    cmd = [binary, "--json", "--threads", "2", "--no-grad-sync", "--no-optimizer-step", *PRETRAIN,
           "--model", "llama-34b", "--num-layers", row["layers"], "--gpus", str(8 * nodes), "--tp", row["tp"],
           "--pp", row["pp"], "--max-doc-len", str(t), "--batch-size", str(2 * bs * mb), "--micro-batches",
           str(mb), "--elongate", repr(t / 65536), "--batches", str(batches)]
    if recompute_mlp:
        cmd.append("--recompute-mlp")
    if row["mode"] == "wlbllm":
        cmd += ["--strategies", "wlb-ideal", "--cp", row["cp"], "--wlb-artifact-kv"]
    else:
        cmd += ["--strategies", "distca-paper", "--comm-budget", str(int(float(row["buffer_gb"]) * 2**30))]
    return run_json(cmd, overrides)[0]


def run_json(cmd, overrides):
    """A distca-sim --json command's results, one dict per line, with each
    FIELD=VALUE of `overrides` as --hardware-set; exits with its error if it
    fails."""
    for spec in overrides:
        cmd = cmd + ["--hardware-set", spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def parse_check_args(doc, batches_default, batches_help):
    """The artifact checks' flags: --bin, --batches, --set."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "distca-sim"))
    ap.add_argument("--batches", type=int, default=batches_default, help=batches_help)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="change a field of the hardware profile (distca-sim --hardware-set); repeatable")
    return ap.parse_args()


def main():
    a = parse_check_args(__doc__, 0, "cap on the sampled batches per run (default: none)")
    rows = list(csv.DictReader(open(DATA)))
    variants = [("wlbllm", "wlb-ideal, MLP recomputed", True), ("d2", "distca-paper, MLP recomputed", True),
                ("d2", "distca-paper, MLP kept", False)]
    for mode, label, recompute in variants:
        tally = {}
        misses = []
        for row in rows:
            if row["mode"] != mode:
                continue
            recompute_row = recompute and row["selective_ckpt"] == "1"
            batches = int(row["samples"])
            if a.batches:
                batches = min(batches, a.batches)
            r = simulate(a.bin, row, batches, recompute_row, a.set)
            predicted, peak = ("fits" if r["memory_fits"] else "oom"), f"{r['memory_max_bytes'] / 1e9:.1f} GB"
            key = (row["outcome"], predicted)
            tally[key] = tally.get(key, 0) + 1
            right = (row["outcome"] in ("pass", "partial")) == (predicted == "fits")
            if not right:
                misses.append(f"  {row['outcome']:>7} predicted {predicted:>5} {peak:>9}: n {row['nodes']} bs "
                              f"{row['bs']} mb {row['mb']} t {row['t']} cp {row['cp']} pp {row['pp']}")
        total = sum(tally.values())
        right = sum(v for (o, p), v in tally.items() if (o in ("pass", "partial")) == (p == "fits"))
        print(f"## {mode}: {label}: {right} of {total} on the right side of the device's memory")
        for (o, p), v in sorted(tally.items()):
            print(f"- recorded {o}, predicted {p}: {v}")
        if misses:
            print("misses:")
            print("\n".join(misses))
        print()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
