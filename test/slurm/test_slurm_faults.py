#!/usr/bin/env python3
"""examples/slurm/train_gpt.sbatch on a local cluster (scripts/slurm-cluster), ended from outside: a task killed with
SIGKILL makes srun (--kill-on-bad-exit=1) end the other tasks, and the job fails within 30 s with a message naming the
task, not requeued; a plain `scancel` ends the job for good (the tasks save on its SIGTERM, and the script does not
requeue a job that is no longer running). Skipped (exit 77) where the cluster cannot start.
usage: test_slurm_faults.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT"""
import os, re, signal, subprocess, sys, tempfile, time

import slurm_jobs
from slurm_jobs import arguments, check, failures, job_field, read, small_gpt, wait_for

train_gpt, data, job_script = arguments()
flags = small_gpt(data, 1000000) + ['--log-every', '10']

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
    def submit(name):
        env = {**os.environ, 'TRAIN_GPT': train_gpt, 'CHECKPOINT': os.path.join(tmp, f'{name}.st'),
               'KFSDP_COLLECTIVE_TIMEOUT': '20'}
        return slurm_jobs.submit(job_script, flags, tmp, name, env)

    def ended(job):
        return job_field(job, 'JobState') not in ('RUNNING', 'COMPLETING', 'PENDING', None)

    out_file = os.path.join(tmp, 'killed.out')
    job = submit('killed')
    wait_for(f'job {job} training', lambda: 'step ' in read(out_file) and len(tasks()) == 2, 60)
    victim = max(tasks())
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(f'job {job} ended after a task was killed', lambda: ended(job), 60)
    took = time.monotonic() - killed
    out = read(out_file)
    check(took <= 30, f'a task killed with SIGKILL: job {job} {job_field(job, "JobState")} (exit '
          f'{job_field(job, "ExitCode")}) {took:.1f} s later')
    check(job_field(job, 'JobState') == 'FAILED' and job_field(job, 'Restarts') == '0', 'the job failed and was not requeued')
    message = re.search(r'srun: error: \S+: task \d: Killed', out)
    check(message is not None, f'with a message: "{message.group(0) if message else out[-2000:]}"')
    check(not tasks(), 'no task is left')

    # scancel: SIGTERM to the tasks and the batch shell; the tasks save, the job stays cancelled.
    out_file = os.path.join(tmp, 'cancelled.out')
    job = submit('cancelled')
    wait_for(f'job {job} training', lambda: 'step ' in read(out_file) and len(tasks()) == 2, 60)
    subprocess.run(['scancel', job], check=True, timeout=60)
    wait_for(f'job {job} ended after scancel', lambda: ended(job), 60)
    time.sleep(2)  # a requeue would show by now
    out = read(out_file)
    check(job_field(job, 'JobState') == 'CANCELLED' and job_field(job, 'Restarts') == '0' and 'requeueing' not in out,
          f'scancel: job {job} {job_field(job, "JobState")}, {job_field(job, "Restarts")} restarts')
    check('train_gpt: stopped by a signal at step' in out and os.path.exists(os.path.join(tmp, 'cancelled.st.stopped')),
          'scancel: the tasks saved and left the marker (a new submission resumes)')

print(f'train_gpt under Slurm, killed and cancelled: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
