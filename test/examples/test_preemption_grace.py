#!/usr/bin/env python3
"""docs/failures.md's mpirun grace, measured. On SIGTERM, Open MPI 4.1's mpirun sends the ranks
SIGCONT, SIGTERM odls_base_sigkill_timeout (T) seconds later and SIGKILL T seconds after that (T is 1
by default). train_gpt whose checkpoint takes 5 s (its rename sleeps 5 s: test/support/slow_rename.cpp)
completes it, marked, with `--mca odls_base_sigkill_timeout 8`, and is cut without it.
usage: test_preemption_grace.py TRAIN_GPT DATA_FILE SLOW_RENAME_SO MPIRUN [MPIRUN_ARGS...]"""
import os, signal, subprocess, sys, tempfile, time

train_gpt, data, slow_rename, mpirun = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# One line at the start and one at the end: while mpirun waits out T it reads no output, and a rank
# that prints every step blocks on the full pipe (docs/failures.md).
small = ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '4', '--sample', '0',
         '--steps', '100000000', '--log-every', '100000000']
failures = []

def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)

# SIGTERM to mpirun once training runs; returns the seconds from the signal to mpirun's exit.
def stopped_job(grace, checkpoint):
    cmd = mpirun + grace + ['-x', 'LD_PRELOAD=' + slow_rename, '-x', 'KFSDP_TEST_SLOW_RENAME=5',
                            '-x', 'KFSDP_TEST_SLOW_RENAME_TO=' + checkpoint, '-np', '2', train_gpt] + small + ['--save', checkpoint]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in job.stdout:
        if line.startswith('step '):  # the first step's line
            time.sleep(0.5)
            break
    job.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    out = job.communicate(timeout=120)[0]
    return out, time.monotonic() - signalled

with tempfile.TemporaryDirectory() as tmp:
    kept = os.path.join(tmp, 'kept.st')
    out, seconds = stopped_job(['--mca', 'odls_base_sigkill_timeout', '8'], kept)
    print(f'grace 8 s: mpirun exited {seconds:.1f} s after SIGTERM')
    check('stopped by a signal at step' in out and os.path.exists(kept) and os.path.exists(kept + '.stopped'),
          f'with --mca odls_base_sigkill_timeout 8, a 5 s checkpoint completes after SIGTERM, marked ({seconds:.1f} s)')
    cut = os.path.join(tmp, 'cut.st')
    out, seconds = stopped_job([], cut)
    check(not os.path.exists(cut) and not os.path.exists(cut + '.stopped'),
          f'without it, Open MPI kills the ranks before the checkpoint is in place ({seconds:.1f} s)')

print(f'mpirun grace: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
