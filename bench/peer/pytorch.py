#!/usr/bin/env python3
"""kfsdp's training step beside PyTorch's on the same GPT, ranks, batch and one thread per rank.

    bench/peer/pytorch.py                               # scripts/main's GPT and the 19 M one, 1 and 2 ranks
    bench/peer/pytorch.py --sizes 19m --ranks 2 --steps 10

For every GPT size and rank count it runs, one after the other and --rounds times over (so that a burst
of load from elsewhere falls on all of them), each for --warmup + --steps steps:
  kfsdp    build/bench/bench_step --sharding all --bucketing block (zero2 and zero3) under mpirun;
  eager    PyTorch eager, one process, or DistributedDataParallel at 2 ranks and more (gloo);
  fsdp2    torch.distributed.fsdp.fully_shard per block and at the root, zero2
           (reshard_after_forward=False) and zero3 (True), gloo on the CPU.
The same step everywhere: nanoGPT's GPT (byte vocabulary 256, untied lm_head, biases, erf GELU, causal
attention), f32, AdamW (lr 2e-3, weight decay 0.01), the global gradient norm clipped to 1.0, random
bytes as data. tokens/s = global batch · seq / the median step time (the slowest rank's, each step
starting after a barrier), the median over the rounds. Prints a table; it is a benchmark, not a test.
Without an importable torch it says so and exits 0.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

SIZES = {  # name: (layers, dim, heads, seq, global batch)
    "main": (4, 128, 4, 64, 16),   # scripts/main's (train_gpt's defaults), 0.87 M parameters
    "19m": (6, 512, 8, 128, 8),    # the 19 M one
}
VOCAB = 256


def torch_worker(rank, world, args, kind, queue):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(1)
    layers, dim, heads, seq, batch = SIZES[args.size]
    dist.init_process_group("gloo", rank=rank, world_size=world)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, dim), nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB, bias=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    torch.manual_seed(0)
    model = GPT()
    if kind == "eager" and world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    elif kind.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        reshard = kind == "fsdp2-zero3"
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1 + rank)
    rows = batch // world
    times = []
    for step in range(args.warmup + args.steps):
        data = torch.randint(0, VOCAB, (rows, seq + 1), generator=generator)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times[args.warmup:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put(statistics.median(slowest.tolist()))
    dist.barrier()  # no rank tears gloo down while another still uses it (a rank aborted at exit)
    dist.destroy_process_group()


def run_torch(args, size, ranks, kind):
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as probe:  # a port free now: each run's own (a port just closed may still be taken)
        probe.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    worker_args = argparse.Namespace(size=size, warmup=args.warmup, steps=args.steps)
    try:
        mp.start_processes(torch_worker, args=(ranks, worker_args, kind, queue), nprocs=ranks, start_method="spawn")
    except mp.ProcessExitedException as exited:
        if queue.empty():  # no figure came: the run itself failed
            raise
        # gloo's teardown can abort a rank once the figures are in (torch 2.15 here): keep them
        print(f"# {kind} at {ranks} ranks: {exited} after its figure was in", file=sys.stderr)
    return queue.get()


def run_kfsdp(args, size, ranks):
    layers, dim, heads, seq, batch = SIZES[size]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), args.bench_step,
               "--layers", str(layers), "--dim", str(dim), "--heads", str(heads), "--seq", str(seq),
               "--batch", str(batch), "--sharding", "all", "--bucketing", "block", "--rounds", "1",
               "--warmup", str(args.warmup), "--steps", str(args.steps)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    seconds = {}
    for line in out.splitlines():
        found = re.match(r"\s*(zero[23]) / block: median ([0-9.]+) ms", line)
        if found:
            seconds[found.group(1)] = float(found.group(2)) / 1e3
        if line.startswith("BLAS:"):
            run_kfsdp.blas = line
    if set(seconds) != {"zero2", "zero3"}:
        raise RuntimeError("bench_peer: no zero2/zero3 medians in bench_step's output:\n" + out)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="main,19m", help="comma-separated: main, 19m")
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench-step", default="build/bench/bench_step")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("bench/peer/pytorch.py: torch is not importable: nothing to compare with "
              "(pip install torch)")
        return 0
    print(f"# torch {torch.__version__}, BLAS {torch.backends.mkl.is_available() and 'MKL' or 'other'}; "
          f"{args.rounds} rounds of {args.warmup} warm-up + {args.steps} timed steps; tokens/s of the global batch")
    print("# load average at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    header = "| GPT | ranks | kfsdp zero2 | kfsdp zero3 | eager (DDP) | FSDP2 zero2 | FSDP2 zero3 | kfsdp / eager | kfsdp / FSDP2 (same sharding) |"
    rows = []
    for size in args.sizes.split(","):
        layers, dim, heads, seq, batch = SIZES[size]
        tokens = batch * seq
        for ranks in (int(r) for r in args.ranks.split(",")):
            seconds = {name: [] for name in ("zero2", "zero3", "eager", "fsdp2-zero2", "fsdp2-zero3")}
            for _ in range(args.rounds):
                for name, value in run_kfsdp(args, size, ranks).items():
                    seconds[name].append(value)
                for kind in ("eager", "fsdp2-zero2", "fsdp2-zero3"):
                    seconds[kind].append(run_torch(args, size, ranks, kind))
            rate = {name: tokens / statistics.median(values) for name, values in seconds.items()}
            best = max(rate["zero2"], rate["zero3"])
            rows.append(f"| {size} (--layers {layers} --dim {dim} --heads {heads} --seq {seq} --batch {batch}) | {ranks} "
                        f"| {rate['zero2']:.0f} | {rate['zero3']:.0f} | {rate['eager']:.0f} | {rate['fsdp2-zero2']:.0f} "
                        f"| {rate['fsdp2-zero3']:.0f} | {best / rate['eager']:.2f} "
                        f"| {rate['zero2'] / rate['fsdp2-zero2']:.2f} (zero2), {rate['zero3'] / rate['fsdp2-zero3']:.2f} (zero3) |")
            print(rows[-1], flush=True)
    print("# load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("\nkfsdp " + getattr(run_kfsdp, "blas", "BLAS: ?"))
    print(header)
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
