"""What the end-to-end scripts of test/examples share: running a program and counting checks.

    from e2e import check, finish, run
    out = run(mpirun + ['-np', '2', train_llama, '--steps', '2'])        # stdout + stderr; exits unless status 0
    out = run([train_llama, '--kv-heads', '3'], expect=1)                 # a failure expected
    check(losses(out)[-1] < losses(out)[0], 'the loss falls')             # prints ok / FAIL, counts it
    finish()                                                              # exit status 1 if any check failed
"""
import subprocess
import sys

failures = []


def run(cmd, expect=0, timeout=600):
    """The output (stdout, then stderr) of `cmd`; ends the script when it succeeds or fails other than `expect` says."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if (p.returncode == 0) != (expect == 0):
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}, expected {expect}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}')
    return p.stdout + p.stderr


def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition:
        failures.append(what)


def finish():
    if failures:
        sys.exit(f'{len(failures)} checks failed')
    sys.exit(0)
