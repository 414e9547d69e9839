#!/usr/bin/env python3
"""examples/slurm/train_gpt.sbatch on 2 nodes x 1 task of a local cluster (scripts/slurm-cluster --nodes 2), a node
lost: once a periodic checkpoint exists, every process in node1's network namespace (its slurmd, slurmstepd and task)
is killed with SIGKILL. The job must leave RUNNING within 30 s with a message (slurmctld sets node1 DOWN once its pings
fail, ends the job and, the script asking --requeue, requeues it); the requeued job waits for node1, so the
test cancels it and submits the same script again on node0, which must resume from the last periodic checkpoint.
Skipped (exit 77) where the cluster cannot start. usage: test_slurm_lost_node.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT"""
import json, os, re, signal, struct, subprocess, sys, tempfile, time

import slurm_jobs
from slurm_jobs import arguments, check, failures, job_field, read, small_gpt, wait_for

train_gpt, data, job_script = arguments(nodes=2)
flags = small_gpt(data, 1000000) + ['--log-every', '10']

def checkpoint_step(path):  # the "step" of a safetensors file's __metadata__
    with open(path, 'rb') as f:
        header = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
    return int(header['__metadata__']['step'])

def netns_pids(ns):
    p = subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True, text=True, timeout=60)
    return [int(pid) for pid in p.stdout.split()]

# In the cluster's folder, which slurm-cluster removes however the test ends.
with tempfile.TemporaryDirectory(dir=os.environ['KFSDP_SLURM_DIR']) as tmp:
    subnet, node1 = os.environ['KFSDP_SLURM_SUBNET'], os.environ['KFSDP_SLURM_NETNS'].split()[1]
    # The script's own KFSDP_COLLECTIVE_TIMEOUT (300 s): what ends the job here is Slurm noticing the node gone.
    env = {**os.environ, 'TRAIN_GPT': train_gpt, 'CHECKPOINT': os.path.join(tmp, 'run.st'), 'SAVE_EVERY': '20',
           'OMPI_MCA_btl': 'self,tcp', 'OMPI_MCA_btl_tcp_if_include': subnet, 'OMPI_MCA_oob_tcp_if_include': subnet}
    env.pop('KFSDP_COLLECTIVE_TIMEOUT', None)

    def submit(name, nodes, per_node):
        return slurm_jobs.submit(job_script, flags, tmp, name, env, f'--nodes={nodes}', f'--ntasks-per-node={per_node}')

    out_file = os.path.join(tmp, 'lost.out')
    job = submit('lost', 2, 1)
    wait_for(f'job {job}: a periodic checkpoint', lambda: os.path.exists(env['CHECKPOINT']), 60)
    victims = netns_pids(node1)
    for pid in victims:
        try: os.kill(pid, signal.SIGKILL)
        except ProcessLookupError: pass
    lost = time.monotonic()
    wait_for(f'job {job} left RUNNING after node1 was lost', lambda: job_field(job, 'JobState') != 'RUNNING', 90)
    took = time.monotonic() - lost
    check(took <= 30, f'node1 lost ({len(victims)} processes killed): job {job} {job_field(job, "JobState")} '
          f'{took:.1f} s later')
    # The requeue: pending (node1 down) once the step's end is through.
    wait_for(f'job {job} requeued', lambda: job_field(job, 'JobState') == 'PENDING', 60)
    check(job_field(job, 'Restarts') == '1', f'Slurm requeued the job: PENDING, Reason={job_field(job, "Reason")}')
    out = read(out_file)
    message = re.search(r'srun: error: Node failure on node1', out)
    cancelled = re.search(r'\*\*\* JOB \S+ ON node0 CANCELLED AT \S+ DUE TO NODE FAILURE', out)
    check(message is not None and cancelled is not None,
          f'with a message: "{message.group(0) if message else out[-2000:]}", "{cancelled.group(0) if cancelled else ""}"')
    # The last periodic save: the checkpoint's own step (rank 0's "saved ... at step N" line may still have been in its
    # stdout buffer when the step was killed).
    saved = [int(n) for n in re.findall(r'^saved \S+ at step (\d+)$', out, re.M)]
    step = checkpoint_step(env['CHECKPOINT'])
    check(step % 20 == 0 and step >= max(saved, default=0), f'the last periodic checkpoint: step {step} (the log\'s '
          f'last "saved": step {max(saved, default=None)})')
    check(not netns_pids(node1), 'nothing runs on node1')

    # The requeued job waits for node1: cancelled, and the same script submitted again on node0 resumes.
    subprocess.run(['scancel', job], check=True, timeout=60)
    wait_for(f'job {job} cancelled', lambda: job_field(job, 'JobState') == 'CANCELLED', 60)
    out_file = os.path.join(tmp, 'again.out')
    again = submit('again', 1, 2)
    wait_for(f'job {again} resumed', lambda: 'step ' in read(out_file), 60)
    resumed = re.search(r'^resumed \S+ at step (\d+)$', read(out_file), re.M)
    check(resumed is not None and int(resumed.group(1)) == step,
          f'resubmitted on node0: "{resumed.group(0) if resumed else read(out_file)[-2000:]}", the last periodic '
          f'checkpoint\'s step')
    subprocess.run(['scancel', again], check=True, timeout=60)
    wait_for(f'job {again} cancelled', lambda: job_field(again, 'JobState') not in ('RUNNING', 'COMPLETING'), 60)

print(f'train_gpt under Slurm, a node lost: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
