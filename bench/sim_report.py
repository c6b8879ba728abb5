#!/usr/bin/env python3
"""Runs distca-sim on the paper's grids, calibration point and ablations, and
prints the tables and ranges that docs/simulator.md ("Results") and
docs/performance.md ("Simulator") record, so that they can be regenerated
after any change to the simulator or a hardware profile.

Usage: bench/sim_report.py [--bin build/bin/distca-sim] [--hardware FILE] [--set FIELD=VALUE ...] [--out DIR]
                           [--seeds N]
(relative paths are taken from the repository root). Needs only python3
(Debian's) and a built distca-sim; takes 30-50 s on 2 cores.
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAIN = ["--lengths", os.path.join(ROOT, "data", "doc-lengths-pretrain.json"), "--upsample", "4",
            "--filter-ratio", "0.5"]
K = 1024


class Sim:
    def __init__(self, binary, hardware, overrides):
        self.binary, self.hardware, self.overrides = binary, hardware, overrides

    def run(self, *args):
        cmd = [self.binary, "--threads", "2", *PRETRAIN, *args]
        if self.hardware:
            cmd += ["--hardware", self.hardware]
        for spec in self.overrides:
            cmd += ["--hardware-set", spec]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        return done.stdout

    def json(self, *args):
        """One dict per strategy (per eps with --tolerance-sweep)."""
        return [json.loads(line) for line in self.run("--json", *args).splitlines() if line.startswith("{")]

    def grid(self, which, out, *args):
        start = time.perf_counter()
        self.run("--paper-grid", which, "--out", out, *args)
        seconds = time.perf_counter() - start
        rows = list(csv.DictReader(open(os.path.join(out, f"grid_{which}.csv"))))
        return rows, seconds


def configs(rows):
    """{config name: {strategy: row}} in grid order."""
    out = {}
    for r in rows:
        out.setdefault(r["config"], {})[r["strategy"]] = r
    return out


def span(values):
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def in_range(values, lo, hi, slack=5e-3):
    """How many values lie in [lo, hi], allowing for the printed rounding
    (speedups at 2 decimals; pass 5e-4 for fractions printed as 0.1%)."""
    return sum(1 for v in values if lo - slack <= v <= hi + slack)


def grid_table(grid):
    print("| config | B | wlb-ideal s (c, idle) | megatron (c) | distca-paper (eps, idle) | distca (eps, idle) |")
    print("|---|---|---|---|---|---|")
    for name, s in grid.items():
        w, m, p, d = s["wlb-ideal"], s["megatron"], s["distca-paper"], s["distca"]
        idle = lambda r: f"{100 * float(r['idle_fraction']):.1f}%"
        over = lambda r: "" if r["memory_fits"] == "1" else "!"
        cad = lambda r: f"{float(r['speedup']):.3f}{over(r)} ({float(r['tolerance_used']):.2f}, {idle(r)})"
        print(f"| {name} | {w['batch_size']} | {float(w['iteration_s']):.2f}{over(w)} ({w['cp']}, {idle(w)}) | "
              f"{float(m['speedup']):.3f}{over(m)} ({m['cp']}) | {cad(p)} | {cad(d)} |")
    if any(r["memory_fits"] != "1" for s in grid.values() for r in s.values()):
        print("\n! over the device memory at every degree tried")


def artifact_buffer_gib(row):
    """The NVSHMEM buffer the artifact's 3D large-scale sweep
    (benchmarks/_250830_large_scale_v3) gives a configuration instead of 2 GB:
    on 8 and 16 nodes 4 / 8 / 16 GB at 128K / 256K / 512K, on 32 nodes 16 GB."""
    L, nodes = int(row["max_doc_len"]) // K, int(row["gpus"]) // 8
    return 16 if nodes >= 32 else {128: 4, 256: 8, 512: 16}[L]


def grid_with_artifact_buffers(sim, out, name, *args):
    """The 3D grid, each configuration run with artifact_buffer_gib."""
    by_budget = {gib: configs(sim.grid("3d", os.path.join(out, f"{name}-{gib}"), "--comm-budget", str(gib << 30),
                                       *args)[0]) for gib in (4, 8, 16)}
    return {n: by_budget[artifact_buffer_gib(next(iter(s.values())))][n] for n, s in by_budget[4].items()}


# The paper's ranges of distca-paper's speedup over wlb-ideal, per grid and model.
PAPER_RANGES = {"3d": {"llama3-8b": (1.07, 1.20), "llama-34b": (1.07, 1.20)},
                "4d": {"llama3-8b": (1.15, 1.30), "llama-34b": (0.0, 1.15)}}


def point_args(rows):
    """distca-sim flags that rerun a grid configuration (its CSV rows by
    strategy) outside the grid, with its Pretrain elongation, MLP
    recomputation and micro-batches (CAD's, where they differ)."""
    w = rows["wlb-ideal"]
    args = ["--model", w["model"], "--gpus", w["gpus"], "--tp", w["tp"], "--max-doc-len", w["max_doc_len"],
            "--batch-size", w["batch_size"], "--micro-batches", w["micro_batches"], "--elongate",
            str(int(w["max_doc_len"]) // (64 * K))]
    cad = rows.get("distca-paper", rows.get("distca", w))["micro_batches"]
    if cad != w["micro_batches"]:
        args += ["--cad-micro-batches", cad]
    return args + (["--recompute-mlp"] if w["recompute_mlp"] in ("1", "true", "True") else [])


def speedups(grid, strategy, model):
    return [float(s[strategy]["speedup"]) for n, s in grid.items() if s[strategy]["model"] == model]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin/distca-sim")
    ap.add_argument("--hardware", default="", help="profile (default: distca-sim's, h200-dgx)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="change a field of the profile for every run (distca-sim --hardware-set), e.g. "
                         "network.inter_node.bandwidth=25e9; repeatable")
    ap.add_argument("--out", default="", help="keep the grids' CSV and charts here")
    ap.add_argument("--seeds", type=int, default=1,
                    help="also run the grids with seeds 1..N-1 and print each configuration's spread (default 1: seed 0 only)")
    a = ap.parse_args()
    at_root = lambda p: p if not p or os.path.isabs(p) else os.path.join(ROOT, p)
    sim = Sim(at_root(a.bin), at_root(a.hardware), a.set)
    out = at_root(a.out) if a.out else tempfile.mkdtemp(prefix="sim-report-")

    print("## Calibration point (8 nodes, 8B, 128K, CP 8; paper: CA 35 / 104 ms, linear 43-45 / 82-85, "
          "all-gather 20-26, reduce-scatter 20, DistCA 1.13x)\n")
    for batches in ("1", "30"):
        res = sim.json("--gpus", "64", "--max-doc-len", str(128 * K), "--batch-size", "16", "--elongate", "2",
                       "--cp", "8", "--batches", batches)
        by = {r["strategy"]: r for r in res}
        b = by["wlb-ideal"]["breakdown_per_layer_s"]
        print(f"- {batches} batch(es): wlb-ideal CA fwd {1e3 * b['forward_attention']:.1f} / bwd "
              f"{1e3 * b['backward_attention']:.1f} ms, linear {1e3 * b['forward_linear']:.1f} / "
              f"{1e3 * b['backward_linear']:.1f}, all-gather {1e3 * b['forward_comm']:.1f}, reduce-scatter "
              f"{1e3 * b['backward_comm']:.1f}; distca-paper {by['distca-paper']['speedup_over_wlb_ideal']:.3f}x, "
              f"distca {by['distca']['speedup_over_wlb_ideal']:.3f}x")

    grids = {}
    for which, extra, title in [("3d", [], "3D"),
                                ("4d", [], "4D, WLB balancing as the artifact's benchmark calls it (default)"),
                                ("4d", ["--wlb-scope", "whole-batch"], "4D, --wlb-scope whole-batch"),
                                ("4d", ["--wlb-scope", "per-micro-batch"], "4D, --wlb-scope per-micro-batch")]:
        key = which + "".join(extra[1:])
        rows, seconds = sim.grid(which, os.path.join(out, key), *extra)
        grids[key] = configs(rows)
        print(f"\n## {title} ({seconds:.1f} s)\n")
        grid_table(grids[key])
        for model, (lo, hi) in PAPER_RANGES[which].items():
            for strategy in ("distca-paper", "distca"):
                v = speedups(grids[key], strategy, model)
                print(f"- {model} {strategy}: {span(v)}x, {in_range(v, lo, hi)} of {len(v)} in {lo:.2f}-{hi:.2f}")

    print("\n## Whole documents (--packing whole: documents capped at L, none cut at chunk boundaries)\n")
    for which in ("3d", "4d"):
        rows, seconds = sim.grid(which, os.path.join(out, which + "-whole"), "--packing", "whole")
        whole = configs(rows)
        for model, (lo, hi) in PAPER_RANGES[which].items():
            for strategy in ("distca-paper", "distca"):
                v = speedups(whole, strategy, model)
                print(f"- {which} {model} {strategy}: {span(v)}x, {in_range(v, lo, hi)} of {len(v)} in "
                      f"{lo:.2f}-{hi:.2f}")
        idle = lambda grid: span([100 * float(s["wlb-ideal"]["idle_fraction"]) for s in grid.values()])
        print(f"- {which} wlb-ideal idle {idle(whole)}% (chunks: {idle(grids[which])}%)")

    if a.seeds > 1:
        print(f"\n## Sampling: distca-paper's speedup over seeds 0-{a.seeds - 1} (30 batches each)\n")
        for which in ("3d", "4d"):
            runs = [grids[which]] + [configs(sim.grid(which, os.path.join(out, f"{which}-seed{seed}"), "--seed",
                                                      str(seed), "--strategies", "wlb-ideal,distca-paper")[0])
                                     for seed in range(1, a.seeds)]
            spread, inside = [], 0
            for name, s in grids[which].items():
                v = [float(r[name]["distca-paper"]["speedup"]) for r in runs]
                lo, hi = PAPER_RANGES[which][s["wlb-ideal"]["model"]]
                spread.append(max(v) - min(v))
                inside += in_range(v, lo, hi) > 0
                print(f"- {which} {name}: {min(v):.3f}-{max(v):.3f}")
            print(f"- {which}: spread {min(spread):.3f}-{max(spread):.3f} (median {statistics.median(spread):.3f}); "
                  f"{inside} of {len(spread)} configurations reach their range at some seed")

    print("\n## distca vs distca-paper (same grid)\n")
    for key in ("3d", "4d"):
        g = grids[key].values()
        ratio = lambda f: [float(s["distca"][f]) / float(s["distca-paper"][f]) for s in g
                           if float(s["distca-paper"][f]) > 0]
        speed = [float(s["distca"]["speedup"]) / float(s["distca-paper"]["speedup"]) for s in g]
        print(f"- {key}: bytes {span(ratio('bytes_moved_gb'))}x, buffer {span(ratio('max_buffer_gb'))}x, "
              f"speed {span(speed)}x ({sum(1 for v in speed if v > 1)} of {len(speed)} faster)")
        balance = lambda s: span([float(c[s]["load_max_over_mean"]) for c in g])
        print(f"- {key}: the plans' busiest server over the mean: distca-paper {balance('distca-paper')} "
              f"(FLOPs), distca {balance('distca')} (the measured table's seconds)")
    # What planning by the measured table instead of FLOPs is worth.
    for key in ("3d", "4d"):
        rows, _ = sim.grid(key, os.path.join(out, f"{key}-flops"), "--plan-by-flops",
                           "--strategies", "wlb-ideal,distca-paper,distca")
        g = configs(rows)
        by_table = [float(grids[key][n]["distca"]["speedup"]) / float(s["distca"]["speedup"]) for n, s in g.items()]
        speed = [float(s["distca"]["speedup"]) / float(s["distca-paper"]["speedup"]) for s in g.values()]
        balance = span([float(s["distca"]["load_max_over_mean"]) for s in g.values()])
        print(f"- {key}, distca planning by FLOPs (--plan-by-flops; balance {balance} in FLOPs): speed against "
              f"distca-paper {span(speed)}x ({sum(1 for v in speed if v > 1)} of {len(speed)} faster); planning "
              f"by the table is {span(by_table)}x that")
    # Each strategy runs its own wire format (distca-paper DistCA's, distca
    # this runtime's); with the same for both, the planners alone differ.
    for wire in ("distca-artifact", "distca"):
        for key in ("3d", "4d"):
            rows, _ = sim.grid(key, os.path.join(out, f"{key}-wire-{wire}"), "--wire", wire,
                               "--strategies", "wlb-ideal,distca-paper,distca")
            g = configs(rows).values()
            speed = [float(s["distca"]["speedup"]) / float(s["distca-paper"]["speedup"]) for s in g]
            moved = [float(s["distca"]["bytes_moved_gb"]) / float(s["distca-paper"]["bytes_moved_gb"]) for s in g]
            own = [float(s["distca"]["speedup"]) / float(grids[key][n]["distca"]["speedup"])
                   for n, s in configs(rows).items()]
            print(f"- {key}, both with the {wire} wire format: bytes {span(moved)}x, speed {span(speed)}x "
                  f"({sum(1 for v in speed if v > 1)} of {len(speed)} faster); distca against its own format "
                  f"{span(own)}x")

    print("\n## 3D in DistCA's format without the resend of Q/K/V (--wire distca-artifact-no-resend)\n")
    rows, _ = sim.grid("3d", os.path.join(out, "3d-no-resend"), "--wire", "distca-artifact-no-resend",
                       "--strategies", "wlb-ideal,distca-paper")
    for name, s in configs(rows).items():
        p, base = s["distca-paper"], grids["3d"][name]["distca-paper"]
        fits = "" if p["memory_fits"] == "1" else ", does not fit"
        print(f"- {name}: distca-paper {float(base['speedup']):.3f}x -> {float(p['speedup']):.3f}x, memory "
              f"{float(base['memory_max_gb']):.1f} -> {float(p['memory_max_gb']):.1f} GB{fits}")

    print("\n## 3D with the artifact's large-scale buffer sizes (4 / 8 / 16 GiB by L on 8-16 nodes, 16 on 32)\n")
    picked = grid_with_artifact_buffers(sim, out, "3d-buffer")
    for name, s in grids["3d"].items():
        p, d = picked[name]["distca-paper"], picked[name]["distca"]
        print(f"- {name} ({artifact_buffer_gib(s['wlb-ideal'])} GiB): distca-paper {float(p['speedup']):.3f}x "
              f"(eps {float(p['tolerance_used']):.2f}, {float(p['memory_max_gb']):.1f} GB), distca "
              f"{float(d['speedup']):.3f}x (2 GiB: {float(s['distca-paper']['speedup']):.3f}x / "
              f"{float(s['distca']['speedup']):.3f}x)")
    for model, (lo, hi) in PAPER_RANGES["3d"].items():
        for strategy in ("distca-paper", "distca"):
            v = speedups(picked, strategy, model)
            print(f"- {model} {strategy}: {span(v)}x, {in_range(v, lo, hi)} of {len(v)} in {lo:.2f}-{hi:.2f}")

    print("\n## 3D with wlb-ideal held at CP = nodes (DP 1, the artifact's wlbllm-cpMax runs)\n")
    held = {}
    for name, s in grids["3d"].items():
        w = s["wlb-ideal"]
        nodes = int(w["gpus"]) // int(w["tp"])  # one tp-8 rank per node: CP over every rank
        by = {r["strategy"]: r for r in sim.json(*point_args(s), "--cp", str(nodes), "--strategies",
                                                 "wlb-ideal,distca-paper")}
        fits = by["wlb-ideal"]["memory_fits"]
        speedup = by["distca-paper"]["speedup_over_wlb_ideal"]
        if fits:
            held.setdefault(w["model"], []).append(speedup)
        print(f"- {name}: cp {nodes}, wlb-ideal idle {100 * by['wlb-ideal']['idle_fraction']:.1f}%"
              f"{'' if fits else ' (over memory)'}; distca-paper {speedup:.3f}x "
              f"(swept: cp {w['cp']}, {float(s['distca-paper']['speedup']):.3f}x)")
    for model, v in held.items():
        lo, hi = PAPER_RANGES["3d"][model]
        print(f"- {model}, where cp = nodes fits: {span(v)}x, {in_range(v, lo, hi)} of {len(v)} in {lo:.2f}-{hi:.2f}")

    print("\n## 4D, pp searched per strategy (--search --tp 8; each strategy's best shape against wlb-ideal's)\n")
    start = time.perf_counter()
    pp1 = {"wlb-ideal": 0, "distca-paper": 0, "distca": 0}
    gains = {}
    points = grids["4d"]
    for name, s in points.items():
        w = s["wlb-ideal"]
        best = {r["strategy"]: r for r in sim.json(*point_args(s), "--search", "--strategies",
                                                   "wlb-ideal,distca-paper,distca")}
        for strategy in pp1:
            pp1[strategy] += best[strategy]["pp"] == 1
        for strategy in ("distca-paper", "distca"):
            gains.setdefault((w["model"], strategy), []).append(best[strategy]["speedup_over_wlb_ideal"])
        print(f"- {name}: wlb-ideal pp {best['wlb-ideal']['pp']} {best['wlb-ideal']['iteration_s']:.2f} s; "
              f"distca-paper pp {best['distca-paper']['pp']} {best['distca-paper']['speedup_over_wlb_ideal']:.3f}x, "
              f"distca pp {best['distca']['pp']} {best['distca']['speedup_over_wlb_ideal']:.3f}x")
    print(f"- pp 1 is the best shape in {pp1['wlb-ideal']} of {len(points)} for wlb-ideal, "
          f"{pp1['distca-paper']} for distca-paper, {pp1['distca']} for distca "
          f"({time.perf_counter() - start:.0f} s)")
    for (model, strategy), v in gains.items():
        print(f"- {model} {strategy}: {span(v)}x")

    print("\n## Ping-pong off (slowdown of the same strategy)\n")
    for which in ("3d", "4d"):
        rows, _ = sim.grid(which, os.path.join(out, which + "-no-ping-pong"), "--no-ping-pong",
                           "--strategies", "distca-paper,distca")
        off = configs(rows)
        for strategy in ("distca-paper", "distca"):
            slow = {n: float(off[n][strategy]["iteration_s"]) / float(grids[which][n][strategy]["iteration_s"]) - 1
                    for n in off}
            v = list(slow.values())
            print(f"- {which} {strategy}: {100 * min(v):.1f}-{100 * max(v):.1f}% (median "
                  f"{100 * statistics.median(v):.1f}%)")
            if which == "3d" and strategy == "distca-paper":
                abl = [slow[n] for n in slow if n.endswith(" 64") or n.endswith(" 128")]
                print(f"  - the paper's ablation configurations (8 and 16 nodes): {100 * min(abl):.1f}-"
                      f"{100 * max(abl):.1f}% (median {100 * statistics.median(abl):.1f}%), "
                      f"{in_range(abl, 0.10, 0.17, 5e-4)} of {len(abl)} in 10-17%")
                for n in slow:
                    if n.endswith(" 64") or n.endswith(" 128"):
                        print(f"    - {n}: {100 * slow[n]:.1f}%")
    on = picked
    off = grid_with_artifact_buffers(sim, out, "3d-buffer-no-ping-pong", "--no-ping-pong",
                                     "--strategies", "distca-paper")
    abl = {n: float(off[n]["distca-paper"]["iteration_s"]) / float(on[n]["distca-paper"]["iteration_s"]) - 1
           for n in on if n.endswith(" 64") or n.endswith(" 128")}
    v = list(abl.values())
    print(f"- the ablation configurations with the artifact's buffer sizes: {100 * min(v):.1f}-{100 * max(v):.1f}% "
          f"(median {100 * statistics.median(v):.1f}%), {in_range(v, 0.10, 0.17, 5e-4)} of {len(v)} in 10-17%; "
          + ", ".join(f"{n} {100 * x:.1f}%" for n, x in abl.items()))

    print("\n## Idle of variable-length chunking (8B, 512K, 8 nodes, B = 8; paper 1.7 (DP 1) / ~2 / 19.2 / 55.4%, DistCA 2.1%)\n")
    for cp, dp in (("8", 1), ("4", 2), ("2", 4), ("1", 8)):
        res = {r["strategy"]: r for r in sim.json(
            "--model", "llama3-8b", "--gpus", "64", "--max-doc-len", str(512 * K), "--batch-size", "8",
            "--micro-batches", "1", "--recompute-mlp", "--elongate", "8", "--cp", cp,
            "--strategies", "wlb-ideal,distca-paper,distca")}
        per_batch = sorted(res["wlb-ideal"]["idle_per_batch"])
        deciles = statistics.quantiles(per_batch, n=10)
        print(f"- DP {dp}: wlb-ideal idle {100 * res['wlb-ideal']['idle_fraction']:.1f}% (per batch: "
              f"{100 * per_batch[0]:.0f}-{100 * per_batch[-1]:.0f}%, 10th-90th percentile "
              f"{100 * deciles[0]:.0f}-{100 * deciles[-1]:.0f}%), distca-paper "
              f"{100 * res['distca-paper']['idle_fraction']:.1f}%, distca {100 * res['distca']['idle_fraction']:.1f}%")
    res = {r["strategy"]: r for r in sim.json(
        "--model", "llama3-8b", "--gpus", "64", "--max-doc-len", str(512 * K), "--batch-size", "8",
        "--micro-batches", "1", "--recompute-mlp", "--elongate", "8", "--comm-budget", str(16 << 30),
        "--strategies", "distca-paper,distca")}
    print(f"- with the artifact's 16 GiB buffer for 512K on 8 nodes: distca-paper "
          f"{100 * res['distca-paper']['idle_fraction']:.1f}%, distca {100 * res['distca']['idle_fraction']:.1f}%")

    print("\n## Tolerance sweep (128K; 8B on 64 GPUs, B 8; 34B on 128 GPUs, B 4): iteration s / max buffer GB\n")
    for model, gpus, b in (("llama3-8b", "64", "8"), ("llama-34b", "128", "4")):
        res = sim.json("--model", model, "--gpus", gpus, "--batch-size", b, "--max-doc-len", str(128 * K),
                       "--micro-batches", "1", "--elongate", "2", "--tolerance-sweep")
        for strategy in ("distca-paper", "distca"):
            pts = [f"{r['tolerance']:.2f}: {r['iteration_s']:.2f} / {r['max_buffer_bytes'] / 1e9:.2f}"
                   for r in res if r["strategy"] == strategy]
            print(f"- {model} {strategy}: " + ", ".join(pts))
    print(f"\n(grids kept in {out})")


if __name__ == "__main__":
    main()
