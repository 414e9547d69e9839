#!/usr/bin/env python3
"""examples/train_gpt on a simulated cluster (scripts/sim-cluster): 4 ranks as 2 hosts x 2 ranks, each host a
network namespace, Open MPI over TCP between them. The losses equal the 1-rank run's (double, 1e-10), flat and
under HSDP by node (a shard group per host). Skipped (exit 77) where namespaces cannot be made.
usage: test_train_gpt_cluster.py SIM_CLUSTER TRAIN_GPT DATA_FILE MPIRUN [MPIRUN_ARGS...]"""
import re, subprocess, sys

sim_cluster, train_gpt, data, mpirun = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
small = ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '12',
         '--dtype', 'f64', '--sample', '0', '--steps', '3']
failures = []

def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)

def finished(p, cmd):
    if p.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}')
    return p.stdout + p.stderr

def losses(out):
    return [float(line.split('|')[1].split()[1]) for line in out.splitlines() if line.startswith('step ')]

def per_rank(out):
    return int(re.search(r'parameters, (\d+) per rank\)', out).group(1))

def close(a, b, tol):
    return len(a) == len(b) > 0 and all(abs(x - y) <= tol * abs(y) for x, y in zip(a, b))

probe = subprocess.run([sim_cluster, '--hosts', '1', '--', 'true'], capture_output=True, text=True, timeout=120)
if probe.returncode == 77:
    print(probe.stderr.strip())
    sys.exit(77)
finished(probe, [sim_cluster, '--hosts', '1', '--', 'true'])

def on_cluster(*flags):
    # mpirun on host 0 with the cluster's arguments; ranks 0-1 there, 2-3 on host 1 (the slots, in order).
    cmd = [sim_cluster, '--hosts', '2', '--slots', '2', '--rate', '1gbit', '--', 'sh', '-c',
           'exec "$0" $KFSDP_SIM_MPIRUN_ARGS "$@"', *mpirun, '--map-by', 'slot', '-np', '4', train_gpt, *small, *flags]
    out = finished(subprocess.run(cmd, capture_output=True, text=True, timeout=600), cmd)
    return out, [int(b) for b in re.findall(r'host \d sent (\d+) B', out)]

reference = subprocess.run([*mpirun, '-np', '1', train_gpt, *small], capture_output=True, text=True, timeout=600)
ref_out = finished(reference, ['train_gpt', '1 rank'])
ref = losses(ref_out)

flat, flat_sent = on_cluster('--sharding', 'zero3', '--bucketing', 'block')
check(close(losses(flat), ref, 1e-10), f'2 hosts x 2 ranks, flat zero3/block: losses {losses(flat)} equal 1 rank\'s {ref}')
check(len(flat_sent) == 2 and min(flat_sent) > 100_000, f'both hosts sent their shards over the links: {flat_sent} bytes')
by_node, node_sent = on_cluster('--sharding', 'zero3', '--bucketing', 'block', '--hybrid-shard', 'node')
check(close(losses(by_node), ref, 1e-10), f'2 hosts x 2 ranks, HSDP by node: losses {losses(by_node)} equal 1 rank\'s')
# A shard group a host: each rank holds half the model (flat: a quarter), and less crosses the links.
check(per_rank(by_node) * 2 >= per_rank(ref_out) and per_rank(flat) * 4 >= per_rank(ref_out) and
      per_rank(by_node) > per_rank(flat), f'HSDP by node shards over the 2 ranks of a host: {per_rank(by_node)} '
      f'parameters a rank, flat {per_rank(flat)}, 1 rank {per_rank(ref_out)}')
check(sum(node_sent) < sum(flat_sent), f'HSDP by node sends less between hosts than flat FSDP: {sum(node_sent)} < '
      f'{sum(flat_sent)} bytes')

print(f'train_gpt on a simulated cluster: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
