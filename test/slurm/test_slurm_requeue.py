#!/usr/bin/env python3
"""The preemption cycle under Slurm, on a local cluster (scripts/slurm-cluster): examples/slurm/train_gpt.sbatch
trains; `scancel --signal=USR1` makes every task save and stop at one step; the script sees the stop marker and
requeues the job; the requeued job resumes from the checkpoint and finishes; its final checkpoint is byte-identical to
an uninterrupted job's. Skipped (exit 77) where the cluster cannot start (not root, no Slurm).
usage: test_slurm_requeue.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT"""
import os, re, subprocess, sys, tempfile, time

import slurm_jobs
from slurm_jobs import arguments, check, failures, job_field, read, small_gpt, wait_for

train_gpt, data, job_script = arguments()
steps = 1000
flags = small_gpt(data, steps) + ['--log-every', '10']
start = time.monotonic()

def slurm(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}')
    return p.stdout

def step_lines(text):
    return [line for line in text.splitlines() if line.startswith('step ')]

def submit(tmp, name):
    env = {**os.environ, 'TRAIN_GPT': train_gpt, 'CHECKPOINT': os.path.join(tmp, f'{name}.st'), 'SAVE_EVERY': '0'}
    return slurm_jobs.submit(job_script, flags, tmp, name, env)

def finished(job):
    return job_field(job, 'JobState') in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY')

# In the cluster's folder, which slurm-cluster removes however the test ends.
with tempfile.TemporaryDirectory(dir=os.environ['KFSDP_SLURM_DIR']) as tmp:
    f = lambda name: os.path.join(tmp, name)
    # The uninterrupted job.
    reference = submit(tmp, 'reference')
    wait_for(f'job {reference} (uninterrupted) finished', lambda: finished(reference), 120)
    check(job_field(reference, 'JobState') == 'COMPLETED' and job_field(reference, 'ExitCode') == '0:0',
          f'the uninterrupted job: {job_field(reference, "JobState")}, exit {job_field(reference, "ExitCode")} '
          f'({time.monotonic() - start:.1f} s)')
    reference_steps = step_lines(read(f('reference.out')))
    if failures:
        sys.exit(read(f('reference.out'))[-3000:])

    # The same job, signalled once it has trained 50 steps (as Slurm signals it before a preemption or its time limit).
    t0 = time.monotonic()
    job = submit(tmp, 'run')
    wait_for(f'job {job} at step 50', lambda: any(int(l.split('/')[0].split()[1]) >= 50 for l in step_lines(read(f('run.out')))), 60)
    slurm('scancel', '--signal=USR1', job)  # the tasks of its steps; the batch shell goes on
    signalled = time.monotonic()
    wait_for(f'job {job} requeued', lambda: job_field(job, 'Restarts') not in (None, '0'), 60)
    requeued = time.monotonic()
    wait_for(f'job {job} running again', lambda: job_field(job, 'JobState') == 'RUNNING' or finished(job), 60)
    restarted = time.monotonic()
    wait_for(f'job {job} finished after the requeue', lambda: finished(job), 120)
    out = read(f('run.out'))
    print(f'job {job}: signalled at {signalled - t0:.1f} s, requeued {requeued - signalled:.1f} s later, running again '
          f'{restarted - requeued:.1f} s after that, finished at {time.monotonic() - t0:.1f} s', flush=True)

    stopped = re.search(r'train_gpt: stopped by a signal at step (\d+), saved', out)
    at = int(stopped.group(1)) if stopped else -1
    check(50 <= at < steps, f'USR1: every task stopped at step {at} and saved')
    check(f'train_gpt.sbatch: stopped at step {at}; requeueing job {job}' in out, 'the script saw the marker and requeued the job')
    check(f'resumed {f("run.st")} at step {at}' in out, f'the requeued job resumed from the checkpoint at step {at}')
    check(job_field(job, 'JobState') == 'COMPLETED' and job_field(job, 'Restarts') == '1' and job_field(job, 'ExitCode') == '0:0',
          f'the job: {job_field(job, "JobState")} after {job_field(job, "Restarts")} restart, exit {job_field(job, "ExitCode")}')
    check(not os.path.exists(f('run.st.stopped')), 'the finished run removed the marker')
    resumed_steps = [l for l in step_lines(out) if int(l.split('/')[0].split()[1]) > at]
    loss = lambda l: l.split('|')[1]
    check([loss(l) for l in resumed_steps] == [loss(l) for l in reference_steps if int(l.split('/')[0].split()[1]) > at]
          and resumed_steps[-1].startswith(f'step {steps}/{steps}'), 'the resumed steps print the uninterrupted losses')
    identical = open(f('run.st'), 'rb').read() == open(f('reference.st'), 'rb').read()
    check(identical, f'the final checkpoint is byte-identical to the uninterrupted job\'s ({os.path.getsize(f("run.st"))} bytes)')
    if failures:
        print(out[-3000:])

print(f'train_gpt requeued under Slurm: {len(failures)} checks failed ({time.monotonic() - start:.1f} s)')
sys.exit(1 if failures else 0)
