#!/usr/bin/env python3
"""Preemption of a 2-rank fit (fit_probe): SIGTERM to one rank mid-run writes a checkpoint at the
next step boundary and the job exits 0; run again, it resumes there, reaches the last step, and its
final checkpoint is byte-identical to an uninterrupted run's. The same after kill -9 of the whole
job, resuming from the last periodic checkpoint.
usage: test_fit_preemption.py FIT_PROBE MPIRUN [MPIRUN_ARGS...]"""
import os, re, signal, subprocess, sys, tempfile, time

probe, mpirun = os.path.abspath(sys.argv[1]), sys.argv[2:]
STEPS, EVERY, DELAY_MS = 300, 25, 5
failures = 0


def check(ok, what, output=''):
    global failures
    print(('ok   ' if ok else 'FAIL ') + what)
    if not ok:
        failures += 1
        print('\n'.join('     ' + line for line in output.splitlines()[-30:]))


def command(directory):
    return mpirun + ['-np', '2', probe, directory, str(STEPS), str(EVERY), str(DELAY_MS)]


def run(directory):
    done = subprocess.run(command(directory), capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def final(directory):
    with open(os.path.join(directory, f'step-{STEPS:08}.safetensors'), 'rb') as f:
        return f.read()


def start_and_wait_for(directory, step):
    """Starts the job in its own process group; returns it once the checkpoint of `step` exists."""
    job = subprocess.Popen(command(directory), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    path = os.path.join(directory, f'step-{step:08}.safetensors')
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return job


def rank_pids(job):
    """The ranks of `job` (children of its mpirun whose environment names their rank), by rank."""
    ranks = {}
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as f:
                parent = int(f.read().rsplit(')', 1)[1].split()[1])
            with open(f'/proc/{pid}/environ', 'rb') as f:
                environment = dict(item.split(b'=', 1) for item in f.read().split(b'\0') if b'=' in item)
            if parent == job.pid and b'OMPI_COMM_WORLD_RANK' in environment:
                ranks[int(environment[b'OMPI_COMM_WORLD_RANK'])] = int(pid)
        except (OSError, ValueError, IndexError):
            pass
    return ranks


with tempfile.TemporaryDirectory() as tmp:
    whole, signalled, killed = (os.path.join(tmp, name) for name in ('whole', 'signalled', 'killed'))
    status, output = run(whole)
    check(status == 0 and f'probe: step {STEPS} preempted false resumed_from 0' in output,
          f'uninterrupted run: exit 0 at step {STEPS}', output)
    reference = final(whole)

    # SIGTERM to rank 1 only: every rank stops at the same boundary, after a checkpoint.
    job = start_and_wait_for(signalled, 2 * EVERY)
    ranks = rank_pids(job)
    check(sorted(ranks) == [0, 1], f'found both ranks of the running job: {ranks}')
    if 1 in ranks: os.kill(ranks[1], signal.SIGTERM)
    output = job.communicate(timeout=60)[0]
    stopped = re.search(r'fit: stopped by a signal at step (\d+), checkpoint (\S+)', output)
    check(job.returncode == 0 and stopped is not None and 'preempted true' in output,
          f'SIGTERM: exit {job.returncode} (0 expected) with a checkpoint', output)
    if stopped:
        step = int(stopped.group(1))
        check(2 * EVERY <= step < STEPS and os.path.exists(stopped.group(2)), f'SIGTERM: checkpoint at step {step}')
        status, output = run(signalled)
        check(status == 0 and f'fit: resumed from' in output and f'at step {step}' in output and
              f'probe: step {STEPS} preempted false resumed_from {step}' in output,
              f'SIGTERM: the rerun resumes at step {step} and reaches step {STEPS}', output)
        check(os.path.exists(os.path.join(signalled, f'step-{STEPS:08}.safetensors')) and final(signalled) == reference,
              'SIGTERM: the final checkpoint is byte-identical to the uninterrupted run\'s')

    # kill -9 of the whole job: the rerun resumes from the last periodic checkpoint.
    job = start_and_wait_for(killed, 4 * EVERY)
    for pid in rank_pids(job).values():  # as a node failure would: no rank gets to save
        os.kill(pid, signal.SIGKILL)
    os.killpg(job.pid, signal.SIGKILL)
    job.communicate(timeout=60)
    saved = sorted(int(name[5:13]) for name in os.listdir(killed) if re.fullmatch(r'step-\d{8}\.safetensors', name))
    check(bool(saved) and saved[-1] >= 4 * EVERY and saved[-1] < STEPS and saved[-1] % EVERY == 0,
          f'kill -9: periodic checkpoints {saved} left')
    status, output = run(killed)
    check(status == 0 and bool(saved) and f'at step {saved[-1]}' in output and
          f'probe: step {STEPS} preempted false resumed_from {saved[-1]}' in output,
          f'kill -9: the rerun resumes at step {saved[-1] if saved else None} and reaches step {STEPS}', output)
    check(os.path.exists(os.path.join(killed, f'step-{STEPS:08}.safetensors')) and final(killed) == reference,
          'kill -9: the final checkpoint is byte-identical to the uninterrupted run\'s')

print(f'preemption: {failures} failed')
sys.exit(1 if failures else 0)
