#!/usr/bin/env python3
"""bench/scale_model.py: the paper table's rows, its bytes against the formulas, its invariants; the
schedule replay and the cluster mode on cases worked by hand. Figures only: no timing is measured."""
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile

script = sys.argv[1]
spec = importlib.util.spec_from_file_location("scale_model", script)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)

table = json.loads(subprocess.run([sys.executable, script, "--paper", "--json"], check=True, capture_output=True,
                                  text=True).stdout)
rows = table["rows"]
assert abs(table["params"] - 8.03e9) < 0.01e9, table["params"]
variants = {r["variant"] for r in rows}
assert variants == {v for v, _ in m.VARIANTS}, variants
assert len(rows) == len(m.VARIANTS) * len(m.PAPER_NODES) * len(m.PAPER_CONFIGS)
assert {r["nodes"] for r in rows} == set(m.PAPER_NODES) and 1024 in m.PAPER_NODES and 16 in m.PAPER_NODES

embedding, head, block = m.llama_units(m.LLAMA3_8B)
total = embedding + head + 32 * block
for r in rows:
    n, gpus = r["nodes"], r["gpus"]
    assert gpus == 8 * n
    ag, rs = m.wire_bytes(r["dtype"], "all_gather"), m.wire_bytes(r["dtype"], "reduce_scatter")
    if r["strategy"] == "flat":
        # ZeRO3: the blocks gathered twice (forward, backward), the root once, everything reduced once;
        # (N-1)/N of each, an eighth of it on each GPU's NIC
        expected = ((2 * 32 * block + embedding + head) * ag + total * rs) * (gpus - 1) / gpus / 8
    else:
        # HSDP by node: only the all-reduce of the GPU's shard over the nodes leaves the node
        expected = 2 * (n - 1) / n * total * rs / 8
    assert abs(r["nic_bytes"] - expected) <= 1e-9 * expected, (r, expected)
    assert r["step_s"] >= r["compute_s"] * (1 - 1e-12), r  # communication only adds
    assert abs(r["tokens_per_gpu_s"] * r["step_s"] - r["tokens_per_gpu"]) < 1e-6 * r["tokens_per_gpu"]
    assert abs(r["tokens_per_gpu"] * gpus - m.GLOBAL_TOKENS) < 1e-6 * m.GLOBAL_TOKENS
nominal = {(r["nodes"], r["strategy"], r["dtype"]): r for r in rows if r["variant"] == "nominal"}
for n in m.PAPER_NODES:  # bf16 halves f32's bytes
    for s in ("flat", "hsdp"):
        assert abs(nominal[(n, s, "bf16")]["nic_bytes"] * 2 - nominal[(n, s, "f32")]["nic_bytes"]) < 1e-3

# The replay by hand: 2 blocks, zero2, overlap off, a link of 1 byte/s, every bucket 1 byte a direction.
# forward: the root's all-gather waited (1 s), then block 1's (1 s) and block 2's (1 s) as they are
# needed; backward: block 2's reduce-scatter runs while block 1 waits after its backward (1 s), then
# block 1's and the root's (2 s); 1 s of compute in each of the 6 regions and 1 s after.
cost = lambda kind, b: ("link", 0.0, 1.0)
step, waited = m.simulate_step([[0], [1], [2]], [1, 1, 1], [1, 1, 1], [0, 1, 2], cost,
                               {"link": m.Lane(1.0)}, background=False, after=1.0)
assert (step, waited) == (13.0, 6.0), (step, waited)
# With a communication thread the same step hides what compute covers: the gathers of blocks 1 and 2
# behind the root's and block 1's forward, block 2's reduce-scatter behind block 1's backward.
step, waited = m.simulate_step([[0], [1], [2]], [1, 1, 1], [1, 1, 1], [0, 1, 2], cost,
                               {"link": m.Lane(1.0)}, background=True, after=1.0)
assert (step, waited) == (10.0, 3.0), (step, waited)
# ZeRO3 and HSDP with a thread, the paper's case: gathers and reduce-scatters on one lane, the replicas'
# all-reduces on another. The backward gathers block 2 again behind the root's backward and block 1
# behind block 2's; under HSDP each unit's reduce-scatter is waited for right after its backward and
# its all-reduce starts then, beside the next unit's backward. 5 s waited: the root's gather, the
# three reduce-scatters (block 2's queued behind block 1's gather) and the root's all-reduce, alone at the end.
lane_of = {"all_gather": "nvlink", "reduce_scatter": "nvlink", "all_reduce": "net"}
step, waited = m.simulate_step([[0], [1], [2]], [1, 1, 1], [1, 1, 1], [0, 1, 2],
                               lambda kind, b: (lane_of[kind], 0.0, 1.0),
                               {"nvlink": m.Lane(1.0), "net": m.Lane(1.0)}, background=True, zero3=True,
                               replicas=True, after=1.0)
assert (step, waited) == (12.0, 5.0), (step, waited)

# Cluster mode on a run made up here: one block (bucket 1, 2 MB gathered) and the root (bucket 0, 1 MB),
# unshaped and at 100 Mbit/s, overlap off. The 100 Mbit/s link carries 10 MB/s (bench_collectives'
# all-gather and reduce-scatter of a 256 KiB shard moving 7 shards a direction in 183.5008 ms), its
# token bucket 256 KiB, refilled at 12.5 MB/s while it idles. By hand: the root's all-gather after the
# bucket's tokens (73.7856 ms), 1 ms of compute (12.5 kB of tokens), the block's all-gather
# (198.75 ms), 7 ms of compute (87.5 kB), the block's reduce-scatter (0.75 of 2 MB: 141.25 ms), the
# root's (75 ms), the optimizer (1 ms); plus the rest, 11 ms: the unshaped step (20 ms) minus its
# regions (9 ms). 508.7856 ms in all.
with tempfile.TemporaryDirectory() as run:
    def write(name, text):
        with open(os.path.join(run, name), "w") as f:
            f.write(text)
    for rate, step_s, ag_ms, rs_ms in (("none", 0.020, "0.0001", "0.0001"), ("100mbit", 0.400, "100.0", "83.5008")):
        prefix = f"{rate}.flat.1"
        write(prefix + ".jsonl", "".join(json.dumps({"step": i, "step_time_s": step_s}) + "\n" for i in range(6)))
        write(prefix + ".log", "train_gpt: 4 ranks, overlap off\nsim-cluster: host 0 sent 60000000 B and received 1 B\n"
                               "sim-cluster: host 1 sent 60000000 B and received 1 B\n")
        events, t = [], 0.0
        for _ in range(6):
            for name, ms in (("forward root", 1), ("forward transformer.h.0", 2), ("backward root", 1),
                             ("backward transformer.h.0", 4), ("optimizer", 1)):
                events.append({"name": name, "ph": "X", "ts": t, "dur": 1000.0 * ms, "pid": 0, "tid": 0})
                t += 1000.0 * ms
            for kind in ("all_gather", "reduce_scatter"):
                for bucket, nbytes in ((0, 1000000), (1, 2000000)):
                    events.append({"name": kind, "ph": "X", "ts": t, "dur": 1.0, "pid": 0, "tid": 1,
                                   "args": {"bucket": bucket, "bytes": nbytes}})
        write(prefix + ".rank0.json", json.dumps({"traceEvents": events}))
        write(f"collectives.{rate}.1.txt", f"all-gather 262144 {ag_ms}\nreduce-scatter 262144 {rs_ms}\n")
    write("load.txt", "start 1.00 1.00 1.00\n")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        rows = m.cluster_mode(run, ["flat"])
assert [(r["rate"], r["config"]) for r in rows] == [("100mbit", "flat")], rows
assert abs(rows[0]["predicted_ms"] - 508.7856) < 0.01, (rows, printed.getvalue())
assert abs(rows[0]["measured_ms"] - 400.0) < 1e-9 and "load average start 1.00" in printed.getvalue()
print("scale_model: paper table, schedule replay and cluster mode as expected")
