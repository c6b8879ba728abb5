#!/usr/bin/env python3
"""Run planned core-attention servers on one GPU and compare with the table.

For every plan (`distca-plan --emit-plan`) given, each server's tasks run as
one packed FlashAttention-2 varlen call, forward and backward, as a CAD
attention server runs them (tasks of one document whose query ranges touch are
merged first, as the simulator merges them). Prints, per plan, the measured
seconds of every server against the attention table's prediction (the same
bilinear interpolation and causal-pair scaling as the planner's CostModel), and
the measured max/mean load against the predicted one.

Runs on the device machine; not part of the build or the tests.
Usage: h200_plan_check.py TABLE.csv OUT.csv PLAN.json...
"""
import bisect
import json
import re
import statistics
import sys

import torch

DEV, DT = "cuda", torch.bfloat16
FWD = torch.ops.aten._flash_attention_forward
BWD = torch.ops.aten._flash_attention_backward


class Table:
    """The planner's CostModel::TableSeconds, on the CSV it reads."""

    def __init__(self, path):
        pts, self.heads = {}, None
        for line in open(path):
            line = line.strip()
            shape = re.search(r"(\d+) q heads, (\d+) kv heads, head_dim (\d+)", line) if line.startswith("#") else None
            if shape:
                self.heads = tuple(int(x) for x in shape.groups())
            if not line or line.startswith("#") or line.startswith("q_len"):
                continue
            q, kv, s = line.split(",")
            pts[(float(q), float(kv))] = float(s)
        if self.heads is None:
            sys.exit(f"{path}: no '# ... N q heads, M kv heads, head_dim D' line (h200_attention_table.py writes one)")
        self.qs = sorted({q for q, _ in pts})
        self.kvs = sorted({kv for _, kv in pts})
        self.s = {}
        for q in self.qs:
            for kv in self.kvs:
                s = pts.get((q, kv), pts.get((kv, kv)) if kv < q else None)
                if s is None:
                    sys.exit(f"{path}: not a full grid: no row for q_len {q:g}, kv_len {kv:g}")
                self.s[(q, kv)] = s

    @staticmethod
    def bracket(grid, x):
        if len(grid) == 1:
            return 0, 0, 0.0
        x = min(max(x, grid[0]), grid[-1])
        i = min(max(bisect.bisect_right(grid, x), 1), len(grid) - 1) - 1
        return i, i + 1, (x - grid[i]) / (grid[i + 1] - grid[i])

    def seconds(self, q, kv):
        qi, qj, qw = self.bracket(self.qs, q)
        ki, kj, kw = self.bracket(self.kvs, kv)
        at = lambda a, b: self.s[(self.qs[a], self.kvs[b])]
        v = (1 - qw) * ((1 - kw) * at(qi, ki) + kw * at(qi, kj)) + qw * ((1 - kw) * at(qj, ki) + kw * at(qj, kj))
        qc, kc = min(max(q, self.qs[0]), self.qs[-1]), min(max(kv, self.kvs[0]), self.kvs[-1])
        if (qc, kc) == (q, kv):
            return v
        pairs = lambda a, b: a * b - a * (a - 1) / 2
        inside = pairs(min(qc, kc), kc)
        return v * pairs(q, kv) / inside if inside > 0 else v


def server_tasks(plan):
    """(q_len, kv_len) of each server's tasks, touching ranges of a document merged."""
    by = {}
    for t in plan["tasks"]:
        by.setdefault((t["server"], t["doc"]), []).append((t["q_begin"], t["q_end"]))
    servers = {s: [] for s in range(plan["ranks"] + plan["dedicated_servers"])}
    for (server, _), ranges in by.items():
        ranges.sort()
        merged = [list(ranges[0])]
        for b, e in ranges[1:]:
            if b == merged[-1][1]:
                merged[-1][1] = e
            else:
                merged.append([b, e])
        servers[server].extend((e - b, e) for b, e in merged)
    return servers


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def run_server(tasks, hq, hkv, d):
    qs = [q for q, _ in tasks]
    ks = [kv for _, kv in tasks]
    q = torch.randn(sum(qs), hq, d, device=DEV, dtype=DT)
    k = torch.randn(sum(ks), hkv, d, device=DEV, dtype=DT)
    v = torch.randn(sum(ks), hkv, d, device=DEV, dtype=DT)
    cq = torch.tensor([0] + qs, device=DEV, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    ck = torch.tensor([0] + ks, device=DEV, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    mq, mk = max(qs), max(ks)
    f = timed(lambda: FWD(q, k, v, cq, ck, mq, mk, 0.0, True, False))
    out, lse, rng, unused, _ = FWD(q, k, v, cq, ck, mq, mk, 0.0, True, False)
    do = torch.randn_like(q)
    b = timed(lambda: BWD(do, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, rng, unused))
    return f + b


def main():
    table, out_csv, plans = Table(sys.argv[1]), sys.argv[2], sys.argv[3:]
    rows = []
    print(f"{'plan':40s} {'servers':>7s} {'meas max/mean':>13s} {'pred max/mean':>13s} "
          f"{'meas/pred mean':>14s} {'worst server':>12s}", flush=True)
    for path in plans:
        plan = json.load(open(path))
        m = plan["model"]
        if (m["q_heads"], m["kv_heads"], m["head_dim"]) != table.heads:
            sys.exit(f"{path}: planned for {m['q_heads']} x {m['kv_heads']} heads of {m['head_dim']}, the table was "
                     f"measured for {table.heads[0]} x {table.heads[1]} of {table.heads[2]} (distca-plan --q-heads "
                     f"--kv-heads --head-dim set the plan's)")
        servers = server_tasks(plan)
        meas, pred = {}, {}
        for s, tasks in sorted(servers.items()):
            meas[s] = run_server(tasks, m["q_heads"], m["kv_heads"], m["head_dim"]) if tasks else 0.0
            pred[s] = sum(table.seconds(q, kv) for q, kv in tasks)
            rows.append((path.rsplit("/", 1)[-1], s, len(tasks), sum(q for q, _ in tasks), meas[s], pred[s]))
        mm, pm = statistics.mean(meas.values()), statistics.mean(pred.values())
        worst = max((abs(meas[s] / pred[s] - 1) for s in meas if pred[s] > 0), default=0.0)
        print(f"{path.rsplit('/', 1)[-1]:40s} {len(meas):7d} {max(meas.values()) / mm:13.3f} "
              f"{max(pred.values()) / pm:13.3f} {mm / pm:14.3f} {worst:11.1%}", flush=True)
    with open(out_csv, "w") as fh:
        fh.write("plan,server,tasks,rows,measured_s,table_s\n")
        for r in rows:
            fh.write(",".join(str(x) for x in r) + "\n")


if __name__ == "__main__":
    main()
