#!/usr/bin/env python3
"""Compile-fail test: expect_compile_error.py EXPECTED_TEXT SOURCE COMPILER [ARGS...].
Passes when the compiler rejects SOURCE and its diagnostics contain EXPECTED_TEXT."""
import subprocess, sys

expected, source, compiler = sys.argv[1], sys.argv[2], sys.argv[3:]
run = subprocess.run(compiler + ['-fsyntax-only', source], capture_output=True, text=True)
if run.returncode == 0:
    sys.exit(f'{source} compiled, but it must be rejected with "{expected}"')
if expected not in run.stderr:
    sys.exit(f'{source} was rejected without "{expected}":\n{run.stderr[-4000:]}')
print(f'{source}: rejected as expected ("{expected}")')
