#!/usr/bin/env python3
"""Measure core attention (and the linear layers' GEMMs) on one GPU.

Writes the simulator's attention tables (configs/hardware/*.csv, columns
q_len,kv_len,seconds: forward + backward seconds of one task, a query range of
q_len rows whose causal K/V prefix is kv_len long, bottom-right aligned; and, in
*-forward.csv on the same grid, the forward seconds alone, a profile's
"forward_file") for the
head shapes one tensor-parallel rank runs, timed with PyTorch's FlashAttention-2
varlen kernels (torch.ops.aten._flash_attention_forward / _backward, the kernels
under torch.nn.attention.varlen). Small tasks are packed many to one call, as a
CAD attention server packs them, and the time is divided by their number.

Runs on the device machine (`python3` there holds PyTorch); it is not part of the
build or the tests. Usage: h200_attention_table.py OUTDIR [NAME:HQ:HKV:D ...]
(default shapes: one TP-8 rank of Llama-3-8B and of Llama-34B).
"""
import json
import math
import statistics
import sys

import torch

DEV = "cuda"
DT = torch.bfloat16
FWD = torch.ops.aten._flash_attention_forward
BWD = torch.ops.aten._flash_attention_backward

# (name, q heads, kv heads, head_dim): what one rank runs at TP 8.
SHAPES = [("llama3-8b-tp8", 4, 1, 128), ("llama-34b-tp8", 8, 1, 128)]
Q_GRID = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
KV_GRID = Q_GRID + [131072, 262144, 524288]
MIN_FLOPS = 4e11        # forward FLOPs per timed call (about 1 ms)
MAX_ROWS = 1 << 21      # query rows per call
MAX_BYTES = 60e9        # device memory one call may take


def pairs(q, kv):
    return q * kv - q * (q - 1) // 2


def cu(n, step):
    return torch.arange(n + 1, device=DEV, dtype=torch.int32) * step


def run(q, k, v, cq, ck, mq, mk, backward, dout=None):
    out, lse, rng, unused, _ = FWD(q, k, v, cq, ck, mq, mk, 0.0, True, False)
    if not backward:
        return out, lse
    return BWD(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, rng, unused)


def reference(q, k, v, q_len, kv_len):
    """float64 bottom-right causal attention with GQA, autograd-ready."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    qd = q.double().transpose(0, 1)                        # (hq, q, d)
    kd = k.double().repeat_interleave(g, 1).transpose(0, 1)
    vd = v.double().repeat_interleave(g, 1).transpose(0, 1)
    s = qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1])
    i = torch.arange(q_len, device=DEV)[:, None]
    j = torch.arange(kv_len, device=DEV)[None, :]
    s = s.masked_fill(j > i + (kv_len - q_len), float("-inf"))
    return (torch.softmax(s, -1) @ vd).transpose(0, 1)


def check(hq, hkv, d):
    """Forward and backward of one packed call against float64 (two tasks)."""
    lens = [(96, 300), (200, 200)]
    qs = [torch.randn(a, hq, d, device=DEV, dtype=DT) for a, _ in lens]
    ks = [torch.randn(b, hkv, d, device=DEV, dtype=DT) for _, b in lens]
    vs = [torch.randn(b, hkv, d, device=DEV, dtype=DT) for _, b in lens]
    dos = [torch.randn(a, hq, d, device=DEV, dtype=DT) for a, _ in lens]
    cq = torch.tensor([0, 96, 296], device=DEV, dtype=torch.int32)
    ck = torch.tensor([0, 300, 500], device=DEV, dtype=torch.int32)
    q, k, v, do = (torch.cat(t) for t in (qs, ks, vs, dos))
    out, _ = run(q, k, v, cq, ck, 200, 300, False)
    dq, dk, dv = run(q, k, v, cq, ck, 200, 300, True, do)
    worst = 0.0
    for t, (a, b) in enumerate(lens):
        qr, kr, vr = (x.double().requires_grad_() for x in (qs[t], ks[t], vs[t]))
        o = reference(qr, kr, vr, a, b)
        o.backward(dos[t].double())
        got = [out[cq[t]:cq[t + 1]], dq[cq[t]:cq[t + 1]], dk[ck[t]:ck[t + 1]], dv[ck[t]:ck[t + 1]]]
        for g_, r in zip(got, [o, qr.grad, kr.grad, vr.grad]):
            worst = max(worst, ((g_.double() - r).norm() / r.norm()).item())
    return worst


def timed(fn, min_reps=3, budget_s=0.1):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); fn(); b.record(); torch.cuda.synchronize()
    first = a.elapsed_time(b) / 1e3
    reps = max(min_reps, min(30, int(budget_s / max(first, 1e-6))))
    times = []
    for _ in range(reps):
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


def tasks(q_len, kv_len, hq, d, blocks, bytes_per_task):
    """Tasks per timed call: enough work to time (MIN_FLOPS) and to fill the
    chip (4 waves of thread blocks, as a server's call packs many tasks), within
    the memory and grid limits."""
    fwd_flops = 4.0 * d * hq * pairs(q_len, kv_len)
    n = max(math.ceil(MIN_FLOPS / fwd_flops), math.ceil(4 * SMS / blocks))
    # FlashAttention launches one block row per task: CUDA caps grid.y at 65535.
    return max(1, min(n, MAX_ROWS // q_len, 32768, int(MAX_BYTES // bytes_per_task)))


def packed(n, q_len, kv_len, hq, hkv, d):
    q = torch.randn(n * q_len, hq, d, device=DEV, dtype=DT)
    k = torch.randn(n * kv_len, hkv, d, device=DEV, dtype=DT)
    v = torch.randn(n * kv_len, hkv, d, device=DEV, dtype=DT)
    return q, k, v, cu(n, q_len), cu(n, kv_len)


def measure(hq, hkv, d, q_len, kv_len):
    """Forward and backward seconds of one task, each timed in calls that pack
    as many tasks as fill the chip."""
    fwd_flops = 4.0 * d * hq * pairs(q_len, kv_len)
    # Forward: thread blocks over (128-row query tiles, tasks, heads); memory Q, O, K, V.
    nf = tasks(q_len, kv_len, hq, d, hq * math.ceil(q_len / 128), 2 * d * (2 * q_len * hq + 2 * kv_len * hkv))
    q, k, v, cq, ck = packed(nf, q_len, kv_len, hq, hkv, d)
    f = timed(lambda: FWD(q, k, v, cq, ck, q_len, kv_len, 0.0, True, False)) / nf
    del q, k, v
    # Backward: blocks over (128-row key tiles, tasks, heads); memory adds dQ (fp32
    # accumulator), dO, dK/dV (expanded to the query heads under GQA).
    nb = tasks(q_len, kv_len, hq, d, hq * math.ceil(kv_len / 128),
               2 * d * (4 * q_len * hq + 2 * kv_len * hkv + 2 * kv_len * hq) + 4 * d * q_len * hq)
    q, k, v, cq, ck = packed(nb, q_len, kv_len, hq, hkv, d)
    out, lse, rng, unused, _ = FWD(q, k, v, cq, ck, q_len, kv_len, 0.0, True, False)
    do = torch.randn_like(q)
    b = timed(lambda: BWD(do, q, k, v, out, lse, cq, ck, q_len, kv_len, 0.0, True, rng, unused)) / nb
    del q, k, v, out, lse, do
    return (nf, nb), f, b, fwd_flops


def gemm_rates():
    """bf16 GEMMs of Llama-3-8B's linear layers at TP 8, forward and backward."""
    h, kv, ffn, tp = 4096, 1024, 14336, 8
    layers = [(h, (h + 2 * kv) // tp), (h // tp, h), (h, 2 * ffn // tp), (ffn // tp, h)]
    result = {}
    for tokens in (4096, 16384, 65536):
        flops = 0.0
        def step():
            for x, w, dy in mats:
                y = x @ w
                dy @ w.t()
                x.t() @ dy
        mats = []
        for i, o in layers:
            mats.append((torch.randn(tokens, i, device=DEV, dtype=DT), torch.randn(i, o, device=DEV, dtype=DT),
                         torch.randn(tokens, o, device=DEV, dtype=DT)))
            flops += 3 * 2.0 * tokens * i * o
        t = timed(step)
        result[tokens] = flops / t
        del mats
    a = torch.randn(8192, 8192, device=DEV, dtype=DT)
    b = torch.randn(8192, 8192, device=DEV, dtype=DT)
    result["8192^3"] = 2 * 8192 ** 3 / timed(lambda: a @ b)
    return result


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    shapes = SHAPES
    if len(sys.argv) > 2:
        shapes = [(n, int(a), int(b), int(c)) for n, a, b, c in (x.split(":") for x in sys.argv[2:])]
    props = torch.cuda.get_device_properties(0)
    head = f"{props.name}, torch {torch.__version__}, FlashAttention-2 varlen (aten._flash_attention_forward/_backward), bf16"
    print(head, flush=True)
    summary = {"device": head, "shapes": {}}
    for name, hq, hkv, d in shapes:
        err = check(hq, hkv, d)
        print(f"{name}: rel. error vs float64 (out, dq, dk, dv, worst) {err:.2e}", flush=True)
        if not err < 2e-2:
            raise SystemExit(f"{name}: kernel disagrees with the reference ({err:.2e}); no table written")
        rows, detail = [], []
        for q_len in Q_GRID:
            for kv_len in KV_GRID:
                if kv_len < q_len:
                    continue
                n, f, b, flops = measure(hq, hkv, d, q_len, kv_len)
                rows.append((q_len, kv_len, f + b, f))
                detail.append((q_len, kv_len, n, f, b, flops / f / 1e12, 2.5 * flops / b / 1e12 if b > 0 else 0.0))
                print(f"  q {q_len:6d} kv {kv_len:6d} tasks {n[0]:5d}/{n[1]:5d} fwd {f * 1e3:10.4f} ms ({detail[-1][5]:6.1f} TF/s) "
                      f"bwd {b * 1e3:10.4f} ms ({detail[-1][6]:6.1f} TF/s) bwd/fwd {b / f:5.2f}", flush=True)
        for suffix, what, column in (("", "forward + backward", 2), ("-forward", "forward only", 3)):
            with open(f"{out_dir}/h200-attention-{name}{suffix}.csv", "w") as fh:
                fh.write(f"# h200_attention_table.py: seconds per task, {what}, {head}, "
                         f"{hq} q heads, {hkv} kv heads, head_dim {d} (shape {name})\n")
                fh.write("q_len,kv_len,seconds\n")
                for row in rows:
                    fh.write(f"{row[0]},{row[1]},{row[column]:.6e}\n")
        with open(f"{out_dir}/detail-{name}.csv", "w") as fh:
            fh.write("q_len,kv_len,fwd_tasks_per_call,bwd_tasks_per_call,fwd_s,bwd_s,fwd_tflops,bwd_tflops\n")
            for q_len, kv_len, n, f, b, tf, tb in detail:
                fh.write(f"{q_len},{kv_len},{n[0]},{n[1]},{f:.6e},{b:.6e},{tf:.1f},{tb:.1f}\n")
        summary["shapes"][name] = {"check_rel_error": err}
    if shapes is SHAPES:
        g = gemm_rates()
        summary["gemm_tflops"] = {str(k): v / 1e12 for k, v in g.items()}
        print("GEMM TFLOP/s (8B linear layers at TP 8, fwd+bwd):",
              ", ".join(f"{k}: {v / 1e12:.0f}" for k, v in g.items()), flush=True)
    with open(f"{out_dir}/summary.json", "w") as fh:
        json.dump(summary, fh, indent=1)


if __name__ == "__main__":
    main()
