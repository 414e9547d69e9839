#!/usr/bin/env python3
"""A model of a training step's time: measured (or cited) compute per unit, the bytes each strategy
moves per bucket, a link's bandwidth and latency, and the overlap rules of kfsdp's unit scheduler
(docs/scale.md).

  bench/scale_model.py --cluster DIR     predicted beside measured for a `TRACE=DIR bench/cluster` run
  bench/scale_model.py --paper           a Llama-3-8B-sized model on 16 to 1,024 nodes of 8 H100s
  bench/scale_model.py --paper --json    the same table as JSON (what test/test_scale_model.py reads)

The schedule (include/kfsdp/fsdp/scheduler.hpp, src/fsdp/engine.cpp) that both modes replay:
  forward   each unit gathers its buckets and prefetches the next unit's, at most
            --limit-all-gathers (2) all-gathers in flight (the oldest is waited for before another);
  backward  a unit's reduce-scatters are issued after its backward and waited for after the next
            unit's backward (under HSDP at once: they are the shard group's); under HSDP each bucket's
            all-reduce over the replicas is issued as its reduce-scatter is waited for, and all of
            them are waited for before the optimizer.
A lane is a link's direction: its collectives run one after another (FIFO), each taking
latency + bytes / bandwidth, through a token bucket where the link is tbf-shaped. With a
communication thread (overlap thread; NCCL's streams), or with the compute thread testing the
collectives between kernels (overlap polls), a lane runs while the rank computes; with neither
(overlap off: Open MPI's requests progress only inside MPI calls) it runs only while the rank waits.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys


# ------------------------------------------------------------------------------------------ lanes
class Lane:
    """One direction of a link: FIFO collectives; bandwidth in payload bytes/s; a tbf token bucket
    (burst bytes, refilled at refill bytes/s while the lane sends nothing)."""

    def __init__(self, bandwidth, burst=0.0, refill=0.0):
        self.bandwidth, self.burst, self.refill = bandwidth, burst, refill
        self.tokens = burst
        self.queue = []  # [id, latency left (s), bytes left]

    def run(self, dt):
        """Runs for dt seconds; returns the ids completed, with their offsets into dt."""
        done, t = [], 0.0
        while self.queue and t < dt:
            item = self.queue[0]
            if item[1] > 0:  # latency: nothing sent, tokens refill
                step = min(item[1], dt - t)
                item[1] -= step
                self.idle(step)
                t += step
                continue
            if self.tokens > 0 and item[2] > 0:  # the bucket's tokens go at once
                taken = min(self.tokens, item[2])
                self.tokens -= taken
                item[2] -= taken
            need = item[2] / self.bandwidth
            step = min(need, dt - t)
            item[2] -= step * self.bandwidth
            t += step
            if step >= need - 1e-15:
                item[2] = 0.0
                done.append((item[0], t))
                self.queue.pop(0)
        if t < dt:
            self.idle(dt - t)
        return done

    def idle(self, dt):
        self.tokens = min(self.burst, self.tokens + dt * self.refill)

    def time_to_finish(self, cid):
        """Seconds of running until cid completes (a copy of the lane is run)."""
        tokens, t = self.tokens, 0.0
        for ident, latency, left in self.queue:
            tokens = min(self.burst, tokens + latency * self.refill)
            t += latency
            taken = min(tokens, left)
            tokens -= taken
            t += (left - taken) / self.bandwidth
            if ident == cid:
                return t
        raise KeyError(cid)


class Rank:
    """One rank's timeline: compute advances time (lanes run only if background); a wait runs
    every lane until the collective it waits for is done."""

    def __init__(self, lanes, background):
        self.lanes, self.background = lanes, background
        self.now, self.waited = 0.0, 0.0
        self.where = {}  # collective id -> lane name, while in flight
        self.on_done = {}  # collective id -> callback(rank) when it completes (HSDP: issue the all-reduce)
        self.next_id = 0

    def issue(self, lane, latency, nbytes, on_done=None):
        cid = self.next_id
        self.next_id += 1
        if lane is None or (latency <= 0 and nbytes <= 0):
            if on_done:
                on_done(self)
            return cid
        self.lanes[lane].queue.append([cid, latency, float(nbytes)])
        self.where[cid] = lane
        if on_done:
            self.on_done[cid] = on_done
        return cid

    def _run(self, dt, everything):
        for name, lane in self.lanes.items():
            if everything or self.background:
                for cid, _ in lane.run(dt):
                    self.where.pop(cid, None)
            else:
                lane.idle(dt)
        self.now += dt

    def compute(self, seconds):
        self._run(seconds, everything=False)

    def wait(self, cid):
        if cid in self.where:
            dt = self.lanes[self.where[cid]].time_to_finish(cid)
            self._run(dt, everything=True)
            self.waited += dt
        callback = self.on_done.pop(cid, None)
        if callback:
            callback(self)


# ------------------------------------------------------------------------------------ schedule
def simulate_step(units, forward, backward, buckets, cost, lanes, background, limit_all_gathers=2,
                  zero3=False, replicas=False, after=0.0):
    """One step of kfsdp's schedule over units (unit 0 the root, then the blocks in order).

    units: [[bucket ids]]; forward / backward: seconds of compute per unit (forward[0] is the root's
    part before the first block, forward[-1] ends with the head; backward[0] is the head's
    backward, backward[u] the block's); cost(kind, bucket) -> (lane or None, latency s, bytes) for
    kind in all_gather, reduce_scatter, all_reduce; after: seconds after the backward (optimizer
    and the rest). Returns (step seconds, seconds waited)."""
    rank = Rank(lanes, background)
    state = {b: "sharded" for b in buckets}
    gathers, inflight, reducing, reductions, summing = {}, [], [], {}, []

    def begin_unshard(b):
        if state[b] != "sharded":
            return
        while limit_all_gathers > 0 and len(inflight) >= limit_all_gathers:
            finish_unshard(inflight[0])
        gathers[b] = rank.issue(*cost("all_gather", b))
        inflight.append(b)
        state[b] = "gathering"

    def finish_unshard(b):
        if state[b] == "unsharded":
            return
        if state[b] == "sharded":
            begin_unshard(b)
        inflight.remove(b)
        rank.wait(gathers[b])
        state[b] = "unsharded"

    def gather(u, nxt):
        for b in units[u]:
            begin_unshard(b)
        if nxt is not None:
            for b in units[nxt]:
                begin_unshard(b)
        for b in units[u]:
            finish_unshard(b)

    def replica_sum(b):
        def issue(r):
            summing.append(r.issue(*cost("all_reduce", b)))
        return issue if replicas else None

    def after_backward(u):
        for v in reducing:
            for b in units[v]:
                rank.wait(reductions[b])
        reducing.clear()
        for b in units[u]:
            reductions[b] = rank.issue(*cost("reduce_scatter", b), on_done=replica_sum(b))
            state[b] = "sharded"
        if replicas:  # HSDP: the shard group's reduce-scatters finish at once, their all-reduces start
            for b in units[u]:
                rank.wait(reductions[b])
        else:
            reducing.append(u)

    last = len(units) - 1
    gather(0, 1 if last >= 1 else None)
    rank.compute(forward[0])
    for u in range(1, last + 1):
        if zero3 and u > 1:
            for b in units[u - 1]:
                state[b] = "sharded"
        gather(u, u + 1 if u < last else None)
        rank.compute(forward[u])
    if zero3 and last >= 1:
        for b in units[last]:
            state[b] = "sharded"
    gather(0, last if last >= 1 else None)  # begin_backward: the root is held; zero3 prefetches the last block
    rank.compute(backward[0])
    for u in range(last, 0, -1):
        if u != last:
            after_backward(u + 1)
        gather(u, u - 1 if u - 1 >= 1 else None)
        rank.compute(backward[u])
    if last >= 1:
        after_backward(1)
    after_backward(0)
    for v in reducing:  # finish_backward: the reduce-scatters in flight, then every replica sum
        for b in units[v]:
            rank.wait(reductions[b])
    for cid in summing:
        rank.wait(cid)
    rank.compute(after)
    return rank.now, rank.waited


# ---------------------------------------------------------------------- the simulated cluster
RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)bit$")


def rate_bytes(rate):
    """tc's rate in bytes/s (100mbit -> 12.5e6); None for an unshaped link."""
    m = RATE.match(rate)
    if not m:
        return None
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


TBF_BURST = 256 * 1024  # scripts/sim-cluster: tbf ... burst 256kb


def step_regions(path):
    """Per step (after the first two): seconds of each compute region, by name, and the collectives'
    bytes per bucket (the library's counts, from the trace's args)."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    steps, current, coll = [], None, {}
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["tid"] == 0 and e["name"] == "forward root":
            current = {}
            steps.append(current)
        if current is None:
            continue
        if e["tid"] == 0:
            current[e["name"]] = current.get(e["name"], 0.0) + e["dur"] / 1e6
        elif "args" in e:
            coll[(e["name"], e["args"]["bucket"])] = e["args"]["bytes"]
    return steps[2:], coll


def read_run(prefix):
    """A bench/cluster run kept by TRACE: median step seconds after two, median regions (mean over
    ranks), the collectives' bytes, whether overlap was on, bytes between the hosts a step."""
    times = [json.loads(line)["step_time_s"] for line in open(prefix + ".jsonl")]
    steps = len(times)
    regions_by_rank, coll = [], {}
    for path in sorted(glob.glob(prefix + ".rank*.json")):
        rank_steps, rank_coll = step_regions(path)
        if path.endswith(".rank0.json"):
            coll = rank_coll
        names = set().union(*rank_steps) if rank_steps else set()
        regions_by_rank.append({n: statistics.median(s.get(n, 0.0) for s in rank_steps) for n in names})
    names = set().union(*regions_by_rank)
    regions = {n: statistics.mean(r.get(n, 0.0) for r in regions_by_rank) for n in names}
    log = open(prefix + ".log").read()
    overlap = re.search(r"overlap (on|thread|polls|off)", log)
    sent = [int(x) for x in re.findall(r"^sim-cluster: host \d+ sent (\d+) B", log, re.M)]
    return {"step": statistics.median(times[2:]), "regions": regions, "coll": coll,
            "overlap": overlap.group(1) != "off" if overlap else False, "host_bytes": sum(sent) / steps}


def read_collectives(path):
    """bench_collectives at one shard size: the engine's all-gather and reduce-scatter seconds and shard bytes."""
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) > 2 and f[0] in ("all-gather", "reduce-scatter", "replica-sum"):
            out[f[0]] = (int(f[1]), float(f[2]) / 1e3)
    return out


def cluster_bandwidth(files, hosts=2, slots=2):
    """The payload bytes/s a link direction carries, from bench_collectives across the same hosts:
    the bytes one direction carries for an all-gather (every rank to every rank) and a ring
    reduce-scatter of the same shard, over their summed times; median over the files (rounds).
    Beside it, what HSDP's exchange between the replicas reaches alone (its replica-sum row; None
    where the files have none): a cross-check, not an input."""
    ranks = hosts * slots
    figures, exchanges = [], []
    for path in files:
        c = read_collectives(path)
        shard, t_ag = c["all-gather"]
        _, t_rs = c["reduce-scatter"]
        gathered = ranks * shard
        moved = gathered * slots * (hosts - 1) / hosts + gathered * (ranks - 1) / ranks
        figures.append(moved / (t_ag + t_rs))
        if "replica-sum" in c:
            shard, t_sum = c["replica-sum"]
            exchanges.append(slots * shard / t_sum)  # each of a host's ranks sends its shard across
    return statistics.median(figures), statistics.median(exchanges) if exchanges else None


def cluster_cost(coll, config, hosts=2, slots=2):
    """cost(kind, bucket) for the 2-host cluster: the bytes one direction of the link between the hosts
    carries, from the library's counts. Flat: an all-gather sends every rank's shard to the ranks on
    the other host (slots*(hosts-1)/hosts of the gathered bytes a direction); kfsdp's ring
    reduce-scatter crosses each host boundary once ((ranks-1)/ranks). HSDP by node: the all-gathers
    and reduce-scatters stay on the host; the all-reduce over 2 replicas is one exchange both ways
    (each of the host's ranks sends its shard of the group)."""
    ranks = hosts * slots
    hsdp = config.startswith("hsdp")

    def cost(kind, b):
        nbytes = coll.get((kind if kind != "all_reduce" else "replica_all_reduce", b), 0)
        if hsdp:
            if kind == "all_reduce":
                return "link", 0.0, nbytes * slots
            return None, 0.0, 0
        if kind == "all_gather":
            return "link", 0.0, nbytes * slots * (hosts - 1) / hosts
        return "link", 0.0, nbytes * (ranks - 1) / ranks
    return cost


def cluster_units(regions, coll):
    """Units, their buckets and their compute from a trace: region names 'forward X' / 'backward X'."""
    blocks = sorted({n.split(" ", 1)[1] for n in regions if n.startswith(("forward ", "backward ")) and
                     n.split(" ", 1)[1] != "root"},
                    key=lambda s: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)])
    names = ["root"] + blocks
    forward = [regions.get("forward " + n, 0.0) for n in names]
    backward = [regions.get("backward " + n, 0.0) for n in names]
    buckets = sorted({b for (_, b) in coll})
    # block units' buckets: the ones gathered with the block's size, in order (bucketing "block": one a block)
    sizes = {b: coll.get(("all_gather", b), 0) for b in buckets}
    block_size = max(sizes.values()) if sizes else 0
    block_buckets = [b for b in buckets if sizes[b] == block_size and len(blocks) > 0]
    if len(block_buckets) != len(blocks):
        raise SystemExit(f"scale_model: cannot tell the blocks' buckets apart ({len(block_buckets)} for {len(blocks)} blocks)")
    units = [[b for b in buckets if b not in block_buckets]] + [[b] for b in block_buckets]
    return units, forward, backward, buckets


def cluster_mode(directory, configs):
    """Predicted against measured for the runs `TRACE=DIR bench/cluster` kept in directory."""
    load_file = os.path.join(directory, "load.txt")
    loads = [line for line in open(load_file).read().split("\n") if line.strip()] if os.path.exists(load_file) else []
    runs = {}
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        rate, config, _round = os.path.basename(path)[:-len(".jsonl")].split(".")
        runs.setdefault((rate, config), []).append(read_run(path[:-len(".jsonl")]))
    rates = sorted({r for r, _ in runs}, key=lambda r: rate_bytes(r) or float("inf"))
    if "none" not in rates:
        raise SystemExit("scale_model: no run at rate 'none' (unshaped) in " + directory +
                         ": run bench/cluster with RATES=\"none 100mbit 1gbit\" TRACE=DIR")
    measured = {r: cluster_bandwidth(sorted(glob.glob(os.path.join(directory, f"collectives.{r}.*.txt"))))
                for r in rates}
    bandwidth = {r: figure for r, (figure, _) in measured.items()}
    print(f"# scale_model --cluster {directory}: 2 hosts x 2 ranks, {len(runs[('none', configs[0])])} rounds")
    for line in loads:
        print(f"# load average {line}")
    print("# link bandwidth a direction (bench_collectives, 256 KiB shards, all-gather + reduce-scatter):")
    for r in rates:
        shaped = rate_bytes(r)
        eff = f", {bandwidth[r] / shaped:.2f} of the rate" if shaped else ""
        exchange = measured[r][1]
        alone = ""
        if exchange:
            alone = f"; HSDP's exchange alone {exchange / 1e6:.2f} MB/s" + (f", {exchange / shaped:.2f}" if shaped else "")
        print(f"#   {r:8s} {bandwidth[r] / 1e6:8.2f} MB/s{eff}{alone}")
    print(f"{'link':8s} {'config':10s} {'overlap':7s} {'compute':>8s} {'rest':>6s} {'MB/step':>15s} "
          f"{'predicted':>9s} {'measured':>8s} {'pred/meas':>9s}")
    rows = []
    for config in configs:
        base = runs[("none", config)]  # the compute: the unshaped runs of the same rounds
        regions = {n: statistics.median(r["regions"].get(n, 0.0) for r in base)
                   for n in set().union(*(r["regions"] for r in base))}
        overlap = base[0]["overlap"]
        units, forward, backward, buckets = cluster_units(regions, base[0]["coll"])
        after = sum(t for n, t in regions.items() if not n.startswith(("forward ", "backward ")))  # optimizer, unpack
        computed = sum(forward) + sum(backward) + after
        cost = cluster_cost(base[0]["coll"], config)

        def sim(rate, rest):
            refill = rate_bytes(rate)  # tbf's tokens refill at the rate; unshaped: no bucket
            lanes = {"link": Lane(bandwidth[rate], TBF_BURST if refill else 0.0, refill or 0.0)}
            return simulate_step(units, forward, backward, buckets, cost, lanes, overlap,
                                 replicas=config.startswith("hsdp"), after=after + rest)[0]
        # outside the traced regions: data, loss, clipping, the collectives inside a host
        rest = statistics.median(r["step"] for r in base) - sim("none", 0.0)
        model_bytes = 2 * sum(cost(k, b)[2] for b in buckets for k in ("all_gather", "reduce_scatter", "all_reduce"))
        for rate in rates:
            if rate == "none":
                continue
            predicted = sim(rate, rest)
            measured = statistics.median(r["step"] for r in runs[(rate, config)])
            host_mb = statistics.median(r["host_bytes"] for r in runs[(rate, config)]) / 1e6
            rows.append({"rate": rate, "config": config, "predicted_ms": 1e3 * predicted, "measured_ms": 1e3 * measured})
            print(f"{rate:8s} {config:10s} {'on' if overlap else 'off':7s} {1e3 * computed:6.1f}ms "
                  f"{1e3 * rest:4.0f}ms {model_bytes / 1e6:6.2f} / {host_mb:5.2f} "
                  f"{1e3 * predicted:7.0f}ms {1e3 * measured:6.0f}ms {predicted / measured:9.2f}")
    print("# compute: the traced regions of the unshaped runs (forward / backward of each unit, optimizer, unpack);")
    print("# rest: the unshaped step minus the model's step there (so that none is predicted exactly);")
    print("# MB/step: between the hosts, both directions, the model's / sim-cluster's count (start-up included)")
    return rows


# --------------------------------------------------------------------------------- on paper
# Every figure below names its public source (docs/scale.md lists them again).
LLAMA3_8B = dict(layers=32, dim=4096, ffn=14336, heads=32, kv_heads=8, vocab=128256, seq=8192)  # arXiv 2407.21783, Table 3
H100_BF16_DENSE = 989e12   # NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BF16 1,979 TFLOPS with sparsity, half dense
H100_HBM = 3.35e12         # the same datasheet: H100 SXM GPU memory bandwidth 3.35 TB/s
NVLINK = 450e9             # the same datasheet: NVLink 900 GB/s a GPU, both directions together (450 GB/s each way)
NIC = 400e9 / 8            # NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gbit/s a port; DGX H100 datasheet: 8 a node, one a GPU
                           # (arXiv 2407.21783, section 3.3.1: "400 Gbps interconnects between GPUs")
MFU = 0.40                 # arXiv 2407.21783, Table 4: 38-43 % BF16 MFU on H100 (Llama 3 405B); the middle, rounded
GLOBAL_TOKENS = 16 * 2**20  # arXiv 2407.21783, section 3.4.1: batches of 16M tokens (Llama 3 405B's last stage)
# NCCL's own latency model (src/graph/tuning.cc, github.com/NVIDIA/nccl), Simple protocol, microseconds:
NCCL_BASE = 8.4            # baseLat, ring and tree
NCCL_NVLINK_STEP = 3.4     # hwLat[NVLINK][ring]: a ring step inside a node
NCCL_NET_STEP = 14.0       # hwLat[NET][ring] and [tree]: a step between nodes
GPUS_PER_NODE = 8
INT8_BLOCK = 256           # include/kfsdp/fsdp/quantize.hpp: a float scale a block of 256 values


def llama_units(m):
    """Parameters of the root (embedding, final norm, untied output head) and of a block."""
    d, kv = m["dim"], m["dim"] * m["kv_heads"] // m["heads"]
    block = 2 * d * d + 2 * d * kv + 3 * d * m["ffn"] + 2 * d
    embedding, head = m["vocab"] * d, m["vocab"] * d + d
    return embedding, head, block


def wire_bytes(dtype, kind):
    """Bytes a parameter or gradient element travels in. int8 quantizes the all-gathers only (the
    reductions go in bf16, as bench/cluster's flat_int8), with a float scale each 256 values."""
    if dtype == "f32":
        return 4.0
    if dtype == "bf16" or kind != "all_gather":
        return 2.0
    return 1.0 + 4.0 / INT8_BLOCK


def ring_time(gathered, ranks, nodes, nic, nvlink):
    """NCCL ring all-gather / reduce-scatter of a bucket (bytes gathered) over `ranks` GPUs on `nodes`
    nodes: every GPU sends (ranks-1)/ranks of it; between nodes each of the node's 8 rings crosses
    on its own GPU's NIC (1/8 of it a NIC), inside on NVLink (7/8 of it); latency as NCCL models it."""
    frac = (ranks - 1) / ranks
    if nodes > 1:
        wire = max(frac * gathered / GPUS_PER_NODE / nic,
                   frac * gathered * (GPUS_PER_NODE - 1) / GPUS_PER_NODE / nvlink)
    else:
        wire = frac * gathered / nvlink
    steps = ranks - 1
    inter = nodes - 1 if nodes > 1 else 0
    latency = (NCCL_BASE + (steps - inter) * NCCL_NVLINK_STEP + inter * NCCL_NET_STEP) * 1e-6
    return latency, wire


def all_reduce_time(nbytes, nodes, nic, lat_scale=1.0):
    """All-reduce of nbytes over `nodes` GPUs, one a node (HSDP's replica group): NCCL's ring
    (2(n-1)/n of it each way, 2(n-1) steps between nodes) or its tree (log2 n steps up and down, at
    0.92*0.85/2 of the bus bandwidth, as tuning.cc scales it), whichever its model makes faster."""
    if nodes <= 1:
        return 0.0, 0.0
    ring = ((NCCL_BASE + 2 * (nodes - 1) * NCCL_NET_STEP) * 1e-6 * lat_scale,
            2 * (nodes - 1) / nodes * nbytes / nic)
    tree = ((NCCL_BASE + 2 * math.log2(nodes) * NCCL_NET_STEP) * 1e-6 * lat_scale,
            nbytes / (nic * 0.92 * 0.85 * 0.5))
    return min(ring, tree, key=sum)


def paper_step(nodes, strategy, dtype, model=LLAMA3_8B, nic=NIC, nvlink=NVLINK, lat_scale=1.0, mfu=MFU,
               global_tokens=GLOBAL_TOKENS):
    """One step of the 8B model: seconds, the bytes a GPU's NIC sends a step, tokens/s a GPU."""
    gpus = nodes * GPUS_PER_NODE
    tokens = global_tokens / gpus
    embedding, head, block = llama_units(model)
    attention = 4 * model["seq"] * model["dim"]  # a block's attention matmuls a token, forward (PaLM's 6N + 12LHQT)
    flops = mfu * H100_BF16_DENSE
    block_fwd = tokens * (2 * block + attention) / flops
    head_fwd = tokens * 2 * head / flops
    forward = [0.0] + [block_fwd] * model["layers"]
    forward[-1] += head_fwd
    backward = [2 * head_fwd] + [2 * block_fwd] * model["layers"]
    params = {0: embedding, 1: head}  # the root's buckets; then a bucket a block
    units = [[0, 1]]
    for i in range(model["layers"]):
        params[2 + i] = block
        units.append([2 + i])
    hsdp = strategy == "hsdp"
    shard_ranks = GPUS_PER_NODE if hsdp else gpus
    nic_bytes = {"total": 0.0}

    def cost(kind, b):
        nbytes = params[b] * wire_bytes(dtype, kind)
        if kind == "all_reduce":  # HSDP: this GPU's shard, over one GPU a node
            lat, wire = all_reduce_time(nbytes / GPUS_PER_NODE, nodes, nic, lat_scale)
            nic_bytes["total"] += 2 * (nodes - 1) / nodes * nbytes / GPUS_PER_NODE
            return "net", lat, wire * nic
        lat, wire = ring_time(nbytes, shard_ranks, 1 if hsdp else nodes, nic, nvlink)
        lane = "nvlink" if hsdp else "net"
        if not hsdp:
            nic_bytes["total"] += (shard_ranks - 1) / shard_ranks * nbytes / GPUS_PER_NODE
        bandwidth = nvlink if hsdp else nic
        return lane, lat * lat_scale, wire * bandwidth

    lanes = {"net": Lane(nic), "nvlink": Lane(nvlink)}
    shard = (embedding + head + model["layers"] * block) / shard_ranks
    optimizer = shard * 28 / H100_HBM  # AdamW on f32 shards: read param, grad, 2 moments; write param, 2 moments
    step, waited = simulate_step(units, forward, backward, list(params), cost, lanes, background=True,
                                 zero3=True, replicas=hsdp, after=optimizer)
    compute = sum(forward) + sum(backward) + optimizer
    return {"nodes": nodes, "gpus": gpus, "strategy": strategy, "dtype": dtype, "step_s": step,
            "compute_s": compute, "exposed_s": step - compute, "nic_bytes": nic_bytes["total"],
            "tokens_per_gpu_s": tokens / step, "tokens_per_gpu": tokens}


PAPER_NODES = [16, 32, 64, 128, 256, 512, 1024]
PAPER_CONFIGS = [("flat", "f32"), ("flat", "bf16"), ("flat", "int8"), ("hsdp", "f32"), ("hsdp", "bf16"), ("hsdp", "int8")]
VARIANTS = [("nominal", {}), ("NIC -25%", {"nic": NIC * 0.75}), ("NIC +25%", {"nic": NIC * 1.25}),
            ("NVLink -25%", {"nvlink": NVLINK * 0.75}), ("NVLink +25%", {"nvlink": NVLINK * 1.25}),
            ("latency -25%", {"lat_scale": 0.75}), ("latency +25%", {"lat_scale": 1.25})]


def paper_table():
    rows = []
    for variant, kw in VARIANTS:
        for nodes in PAPER_NODES:
            for strategy, dtype in PAPER_CONFIGS:
                r = paper_step(nodes, strategy, dtype, **kw)
                r["variant"] = variant
                rows.append(r)
    return rows


def paper_mode(as_json):
    rows = paper_table()
    embedding, head, block = llama_units(LLAMA3_8B)
    total = embedding + head + LLAMA3_8B["layers"] * block
    if as_json:
        json.dump({"params": total, "rows": rows}, sys.stdout, indent=1)
        print()
        return rows
    name = {"flat": "flat ZeRO3", "hsdp": "HSDP node"}
    print(f"# Llama-3-8B-sized: {total / 1e9:.2f} B parameters, {LLAMA3_8B['layers']} blocks of {block / 1e6:.1f} M; "
          f"global batch {GLOBAL_TOKENS / 2**20:.0f}M tokens, seq {LLAMA3_8B['seq']}; MFU {MFU:.0%} of "
          f"{H100_BF16_DENSE / 1e12:.0f} TFLOPS; NIC {NIC * 8 / 1e9:.0f} Gbit/s a GPU, NVLink {NVLINK / 1e9:.0f} GB/s each way")
    print("# each cell: tokens/s a GPU (step ms); int8: all-gathers in int8, reductions in bf16; * the best of the row")
    print("# where it is more than 1 % ahead of every other (else = after each within 1 % of the best)")
    header = f"{'nodes':>5s} {'GPUs':>5s} {'tok/GPU':>7s}" + "".join(f" {name[s] + ' ' + d:>20s}" for s, d in PAPER_CONFIGS)
    print(header)
    nominal = [r for r in rows if r["variant"] == "nominal"]
    for nodes in PAPER_NODES:
        cells = [r for r in nominal if r["nodes"] == nodes]
        close = leaders(cells)
        line = f"{nodes:5d} {nodes * 8:5d} {cells[0]['tokens_per_gpu']:7.0f}"
        for r in cells:
            mark = ("*" if len(close) == 1 else "=") if r in close else " "
            line += f" {r['tokens_per_gpu_s']:11.0f} ({1e3 * r['step_s']:5.0f}){mark}"
        print(line)
    print("# bytes a GPU's NIC sends a step (GB), by strategy and dtype, at 16 and 1,024 nodes:")
    for nodes in (PAPER_NODES[0], PAPER_NODES[-1]):
        cells = [r for r in nominal if r["nodes"] == nodes]
        print(f"#   {nodes:5d} nodes: " + ", ".join(f"{name[r['strategy']]} {r['dtype']} {r['nic_bytes'] / 1e9:.2f}" for r in cells))
    code = lambda r: ("Z" if r["strategy"] == "flat" else "H") + {"f32": "32", "bf16": "16", "int8": "8"}[r["dtype"]]
    print("# with each link figure at -25 % / +25 %: the best tokens/s a GPU and the configurations within 1 % of it")
    print("# (Z: flat ZeRO3, H: HSDP by node; 32 / 16 / 8: f32, bf16, int8 all-gathers; all: the six)")
    print(f"{'variant':12s}" + "".join(f" {n:>17d}" for n in PAPER_NODES))
    for variant, _ in VARIANTS:
        line = f"{variant:12s}"
        for nodes in PAPER_NODES:
            cells = [r for r in rows if r["variant"] == variant and r["nodes"] == nodes]
            close = leaders(cells)
            others = [code(r) for r in cells if r not in close]
            names = ("all" if not others else "all but " + ",".join(others) if len(others) <= 2
                     else ",".join(code(r) for r in close))
            line += f" {max(r['tokens_per_gpu_s'] for r in cells):5.0f} {names:>11s}"
        print(line)
    return rows


def leaders(cells, within=0.01):
    """The configurations within 1 % of the best tokens/s a GPU."""
    best = max(r["tokens_per_gpu_s"] for r in cells)
    return [r for r in cells if r["tokens_per_gpu_s"] >= best * (1 - within)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", metavar="DIR", help="predicted against measured for the runs TRACE=DIR bench/cluster kept")
    p.add_argument("--configs", default="flat,hsdp,flat_bf16,hsdp_bf16,flat_int8",
                   help="with --cluster: the configurations (bench/cluster's names)")
    p.add_argument("--paper", action="store_true", help="the Llama-3-8B-sized model on 16 to 1,024 H100 nodes")
    p.add_argument("--json", action="store_true", help="with --paper: the table as JSON")
    a = p.parse_args()
    if not a.cluster and not a.paper:
        p.error("give --cluster DIR or --paper")
    if a.cluster:
        cluster_mode(a.cluster, a.configs.split(","))
    if a.paper:
        paper_mode(a.json)


if __name__ == "__main__":
    main()
