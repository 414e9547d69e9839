#!/usr/bin/env python3
"""train_gpt and train_surrogate built through `import kfsdp;` give the header builds' results, to the bit.
usage: test_module_examples.py TRAIN_GPT TRAIN_GPT_MODULE TRAIN_SURROGATE TRAIN_SURROGATE_MODULE DATA MPIRUN [ARGS...]"""
import json, os, subprocess, sys, tempfile

gpt, gpt_module, surrogate, surrogate_module, data = sys.argv[1:6]
mpirun = sys.argv[6:]
failures = []

def records(program, flags, metrics):
    cmd = mpirun + ['-np', '2', program] + flags + ['--metrics', metrics]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}')
    return [(r['step'], r['loss'], r['grad_norm']) for r in map(json.loads, open(metrics))]

with tempfile.TemporaryDirectory() as tmp:
    for name, header, module, flags in (
            ('train_gpt', gpt, gpt_module, ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16',
                                            '--batch', '12', '--dtype', 'f64', '--steps', '5', '--sample', '0']),
            ('train_surrogate', surrogate, surrogate_module, ['--steps', '20', '--dtype', 'f64'])):
        a = records(header, flags, os.path.join(tmp, 'header.jsonl'))
        b = records(module, flags, os.path.join(tmp, 'module.jsonl'))
        ok = len(a) > 0 and a == b
        print(('ok   ' if ok else 'FAIL ') + f'{name}: {len(a)} steps, losses and gradient norms through import kfsdp; '
              f'equal the header build\'s' + ('' if ok else f': {a} vs {b}'))
        if not ok: failures.append(name)
sys.exit(1 if failures else 0)
