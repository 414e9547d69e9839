#!/usr/bin/env python3
"""examples/slurm/train_gpt.sbatch on 2 nodes x 2 tasks of a local cluster (scripts/slurm-cluster --nodes 2: each
node a network namespace with its own hostname, Open MPI over TCP between them): HSDP by node (a shard group a
node, replicas across) trains with the losses of 1 rank (double, 1e-10). Skipped (exit 77) where the cluster
cannot start. usage: test_slurm_nodes.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT"""
import json, os, re, subprocess, sys, tempfile

from slurm_jobs import arguments, check, failures, small_gpt

train_gpt, data, job_script = arguments(nodes=2)
flags = small_gpt(data, 3) + ['--sharding', 'zero3']

def losses(name):  # rank 0's --metrics: the losses in full
    return [json.loads(line)['loss'] for line in open(os.path.join(tmp, f'{name}.jsonl'))]

def close(a, b, tol):
    return len(a) == len(b) > 0 and all(abs(x - y) <= tol * abs(y) for x, y in zip(a, b))

# In the cluster's folder, which slurm-cluster removes however the test ends.
with tempfile.TemporaryDirectory(dir=os.environ['KFSDP_SLURM_DIR']) as tmp:
    subnet = os.environ['KFSDP_SLURM_SUBNET']
    # The nodes reach each other over their veth links only.
    env = {**os.environ, 'TRAIN_GPT': train_gpt, 'SAVE_EVERY': '0', 'OMPI_MCA_btl': 'self,tcp',
           'OMPI_MCA_btl_tcp_if_include': subnet, 'OMPI_MCA_oob_tcp_if_include': subnet}

    def job(name, nodes, per_node):
        out_file = os.path.join(tmp, f'{name}.out')
        cmd = ['sbatch', '--wait', f'--nodes={nodes}', f'--ntasks-per-node={per_node}', '--chdir', tmp,
               '--output', out_file, job_script, *flags, '--metrics', os.path.join(tmp, f'{name}.jsonl')]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=150,
                           env={**env, 'CHECKPOINT': os.path.join(tmp, f'{name}.st')})
        out = open(out_file).read() if os.path.exists(out_file) else ''
        if p.returncode != 0:
            sys.exit(f'{" ".join(cmd)} exited {p.returncode}:\n{p.stderr}\n{out[-3000:]}')
        return out

    one = job('one', 1, 1)
    hsdp = job('hsdp', 2, 2)
    per_rank = lambda out: int(re.search(r'parameters, (\d+) per rank\)', out).group(1))
    check('train_gpt: 4 ranks' in hsdp, 'the job ran 4 ranks')
    check(close(losses('hsdp'), losses('one'), 1e-10), f'2 nodes x 2 tasks, HSDP by node: losses {losses("hsdp")} equal 1 '
          f'rank\'s {losses("one")} within 1e-10')
    check(per_rank(hsdp) * 2 >= per_rank(one) > per_rank(hsdp), f'a shard group a node: {per_rank(hsdp)} parameters a rank '
          f'of {per_rank(one)}')

print(f'train_gpt on 2 Slurm nodes: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
