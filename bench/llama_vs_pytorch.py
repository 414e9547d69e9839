#!/usr/bin/env python3
"""train_llama's tokens/s against PyTorch FSDP2 (fully_shard, gloo on the CPU) training transformers'
LlamaForCausalLM of the same configuration on the same text, at 1 and 2 ranks. Prints figures, never fails
on a timing. Needs torch and transformers from PyPI (measurement only; the tests do not).

    python3 bench/llama_vs_pytorch.py [BUILD_DIR] [--steps 20] [--ranks 1,2] [--rounds 3]

Both sides: train_llama's defaults (4 layers, dim 128, hidden 352, 4 heads, 2 kv heads, rope_theta 1e4,
seq 64, vocab 256, untied), float32, AdamW (lr 2e-3, weight decay 0.01 on 2-D weights), clip 1.0,
global batch 16 windows (1,024 tokens per step) split over the ranks, one BLAS thread per rank;
kfsdp ZeRO3 with block bucketing (each decoder layer a unit, as fully_shard per layer), PyTorch
reshard_after_forward=True (ZeRO3). A run's figure is the median of its steps after 3 warm-up steps: for
train_llama, its per-step tokens/s (--metrics); for PyTorch, from the slowest rank's step time. The rounds
alternate the two programs, so that load on a shared machine falls on both; the table shows the median
over rounds and the range.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

LAYERS, DIM, HIDDEN, HEADS, KV_HEADS, SEQ, VOCAB, BATCH, LR, WD, CLIP = 4, 128, 352, 4, 2, 64, 256, 16, 2e-3, 0.01, 1.0
WARMUP = 3


def torch_worker(steps, data_path):
    """One rank of the PyTorch FSDP2 run (under torchrun); rank 0 prints the median tokens/s."""
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ,
                         rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    text = open(data_path, "rb").read()
    windows = len(text) // (SEQ + 1)
    generator = torch.Generator().manual_seed(1337)
    local = BATCH // world
    times = []
    for step in range(steps):
        picks = torch.randint(0, windows, (BATCH,), generator=generator)[rank * local:(rank + 1) * local]
        rows = torch.tensor([list(text[w * (SEQ + 1):(w + 1) * (SEQ + 1)]) for w in picks.tolist()], dtype=torch.long)
        dist.barrier()
        start = time.perf_counter()
        logits = model(input_ids=rows[:, :SEQ]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
        if rank == 0 and step in (0, steps - 1):
            print(f"pytorch step {step + 1}: loss {loss.item():.4f}", file=sys.stderr)
    if rank == 0:
        print(json.dumps({"tokens_per_s": BATCH * SEQ / statistics.median(times[WARMUP:])}))
    dist.barrier()  # no rank tears gloo down while another still uses it (rank 1 aborted at exit)
    dist.destroy_process_group()


def kfsdp_tokens_per_s(build, ranks, steps, data_path):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), os.path.join(build, "examples", "train_llama"),
               "--data", data_path, "--steps", str(steps), "--batch", str(BATCH), "--sharding", "zero3",
               "--bucketing", "block", "--metrics", metrics, "--log-every", str(steps)]
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1",
                                                                  "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                                                  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        lines = [json.loads(line) for line in open(metrics)]
        return statistics.median(line["tokens_per_s"] for line in lines[WARMUP:])


def pytorch_tokens_per_s(ranks, steps, data_path):
    cmd = ["torchrun", "--standalone", f"--nproc_per_node={ranks}", os.path.abspath(__file__), "--worker",
           "--steps", str(steps), "--data", data_path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build", nargs="?", default="build")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default="data/kjv-genesis-exodus.txt")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args.steps, args.data)
    print("| ranks | train_llama tokens/s | PyTorch FSDP2 tokens/s | train_llama / PyTorch |")
    print("| --- | --- | --- | --- |")
    for ranks in map(int, args.ranks.split(",")):
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(kfsdp_tokens_per_s(args.build, ranks, args.steps, args.data))
            theirs.append(pytorch_tokens_per_s(ranks, args.steps, args.data))
        ratios = [a / b for a, b in zip(ours, theirs)]
        span = lambda xs, f: f"{f(statistics.median(xs))} ({f(min(xs))}–{f(max(xs))})"
        print(f"| {ranks} | {span(ours, '{:,.0f}'.format)} | {span(theirs, '{:,.0f}'.format)} | "
              f"{span(ratios, '{:.2f}'.format)} |", flush=True)


if __name__ == "__main__":
    main()
