#!/usr/bin/env python3
"""bench/scale_model.py's paper mode: the table's rows, its bytes against the formulas, its invariants;
and the schedule replay on a case worked by hand. Figures only: no timing is checked."""
import importlib.util
import json
import subprocess
import sys

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
print("scale_model: paper table and schedule replay as expected")
