"""What the Slurm tests share (test/slurm/test_slurm_*.py): their arguments, a cluster of their own, the small
train_gpt run they submit, and scontrol's view of a job."""
import os, re, subprocess, sys, time


def arguments(nodes=1):
    """TRAIN_GPT, DATA_FILE, JOB_SCRIPT of `test.py SLURM_CLUSTER TRAIN_GPT DATA_FILE JOB_SCRIPT`, as real paths (the
    jobs run elsewhere). Outside a cluster, runs the test again inside one of its own (scripts/slurm-cluster), which
    stops its daemons however the test ends and exits 77 (skipped) where it cannot start."""
    slurm_cluster, train_gpt, data, job_script = map(os.path.realpath, sys.argv[1:5])
    if 'KFSDP_SLURM_DIR' not in os.environ:
        os.execv(slurm_cluster, [slurm_cluster, *(['--nodes', str(nodes)] if nodes > 1 else []), '--',
                                 sys.executable, *sys.argv])
    return train_gpt, data, job_script


def small_gpt(data, steps):
    """train_gpt's flags for a model that trains in seconds, in double (losses compare to 1e-10)."""
    return ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '12',
            '--dtype', 'f64', '--sample', '0', '--steps', str(steps)]


failures = []


def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what, flush=True)
    if not condition: failures.append(what)


def job_field(job, field):
    """A field of `scontrol show job` (JobState, Restarts, ExitCode, ...), None where the job or field is gone."""
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


def submit(job_script, flags, tmp, name, env, *sbatch_flags):
    """sbatch JOB_SCRIPT FLAGS from `tmp`, its output in `tmp`/NAME.out; the job's id."""
    p = subprocess.run(['sbatch', '--parsable', *sbatch_flags, '--chdir', tmp, '--output', os.path.join(tmp, f'{name}.out'),
                        job_script, *flags], capture_output=True, text=True, env=env, timeout=60)
    if p.returncode != 0:
        sys.exit(f'sbatch exited {p.returncode}: {p.stderr}')
    return p.stdout.strip().split(';')[0]
