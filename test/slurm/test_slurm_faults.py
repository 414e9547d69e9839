#!/usr/bin/env python3
"""A task of examples/slurm/train_gpt.sbatch killed with SIGKILL, on a local cluster (scripts/slurm-cluster): srun
(--kill-on-bad-exit=1) ends the other tasks and the job fails within 30 s, with a message naming the task; the script
does not requeue it (no stop marker). Skipped (exit 77) where the cluster cannot start.
usage: test_slurm_faults.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT"""
import os, re, signal, subprocess, sys, tempfile, time

slurm_cluster, train_gpt, data, job_script = map(os.path.realpath, sys.argv[1:5])  # the jobs run elsewhere
if 'KFSDP_SLURM_DIR' not in os.environ:
    # Run again inside a cluster of its own, which stops its daemons however this ends (77: skipped).
    os.execv(slurm_cluster, [slurm_cluster, '--', sys.executable, *sys.argv])

flags = ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '12',
         '--dtype', 'f64', '--sample', '0', '--steps', '1000000', '--log-every', '10']
failures = []

def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what, flush=True)
    if not condition: failures.append(what)

def job_field(job, field):
    p = subprocess.run(['scontrol', 'show', 'job', job], capture_output=True, text=True, timeout=60)
    found = re.search(rf'\b{field}=(\S+)', p.stdout)
    return found.group(1) if found else None

def wait_for(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f'{what}: not after {timeout} s')
        time.sleep(0.2)

def read(path):
    return open(path).read() if os.path.exists(path) else ''

def tasks():
    # The job's ranks on this node: processes running TRAIN_GPT.
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if os.readlink(f'/proc/{pid}/exe') == train_gpt: found.append(int(pid))
        except OSError:
            pass
    return found

# In the cluster's folder, which slurm-cluster removes however the test ends.
with tempfile.TemporaryDirectory(dir=os.environ['KFSDP_SLURM_DIR']) as tmp:
    out_file = os.path.join(tmp, 'job.out')
    env = {**os.environ, 'TRAIN_GPT': train_gpt, 'CHECKPOINT': os.path.join(tmp, 'run.st'), 'KFSDP_COLLECTIVE_TIMEOUT': '20'}
    p = subprocess.run(['sbatch', '--parsable', '--chdir', tmp, '--output', out_file, job_script, *flags],
                       capture_output=True, text=True, env=env, timeout=60)
    if p.returncode != 0:
        sys.exit(f'sbatch exited {p.returncode}: {p.stderr}')
    job = p.stdout.strip().split(';')[0]
    wait_for(f'job {job} training', lambda: 'step ' in read(out_file) and len(tasks()) == 2, 60)
    victim = max(tasks())
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(f'job {job} ended after a task was killed',
             lambda: job_field(job, 'JobState') not in ('RUNNING', 'COMPLETING', 'PENDING', None), 60)
    took = time.monotonic() - killed
    out = read(out_file)
    check(took <= 30, f'a task killed with SIGKILL: job {job} {job_field(job, "JobState")} (exit '
          f'{job_field(job, "ExitCode")}) {took:.1f} s later')
    check(job_field(job, 'JobState') == 'FAILED' and job_field(job, 'Restarts') == '0', 'the job failed and was not requeued')
    message = re.search(r'srun: error: \S+: task \d: Killed', out)
    check(message is not None, f'with a message: "{message.group(0) if message else out[-2000:]}"')
    check(not tasks(), 'no task is left')

print(f'train_gpt under Slurm, a task killed: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
