#!/usr/bin/env python3
"""The trained heat surrogate through the C API (libheat_surrogate) and Fortran (heat_solver): a
short training run saves a model; test_c_api (C99) checks the API's errors and predictions (a copy
with too few feature stddevs, written here, refused by kfsdp_load);
heat_solver's predictions equal predict_surrogate's (the C++ kfsdp::predictor) for the same inputs
to 1e-12 relative; a missing file is a clear error; ldd lists no MPI for the library, heat_solver
or test_c_api. A program given as 'none' (no C or Fortran compiler) is skipped.
usage: test_surrogate_c_api.py TRAIN_SURROGATE PREDICT_SURROGATE LIBHEAT_SURROGATE TEST_C_API HEAT_SOLVER MPIRUN [MPIRUN_ARGS...]"""
import json, os, re, struct, subprocess, sys, tempfile

train_surrogate, predict_surrogate, library, test_c_api, heat_solver, mpirun = *sys.argv[1:6], sys.argv[6:]
failures = []
# Idle ranks yield the core (Open MPI busy-polls by default).
env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle='1')

def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)

def run(cmd, timeout=120):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        sys.exit(f'{" ".join(cmd)} did not finish in {timeout} s (a hang?)')

with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, 'surrogate.safetensors')
    # A short run: what matters is that every language predicts with the same weights.
    p = run(mpirun + ['-np', '2', train_surrogate, '--steps', '200', '--train-problems', '32', '--save', model], timeout=300)
    if p.returncode != 0: sys.exit(f'train_surrogate exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}')

    # Copies without checksums, edited, that test_c_api expects kfsdp_load to refuse, naming the key or the sizes:
    # statistics holding 2 feature stddevs for the model's 6 (a predictor once read past its buffer), and a depth
    # of 1e12 (once ran until the kernel's OOM killer).
    with open(model, 'rb') as f:
        size = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    for name, key, value in (('bad-stats', 'normalization.features.stddev', '1,2'), ('huge-depth', 'surrogate.depth', '1000000000000')):
        edited = {k: v for k, v in header['__metadata__'].items() if not k.startswith('checksum.') and k != 'kfsdp.header_checksum'}
        edited[key] = value
        text = json.dumps(dict(header, __metadata__=edited)).encode()
        text += b' ' * (-len(text) % 8)
        with open(os.path.join(tmp, name + '.safetensors'), 'wb') as f:
            f.write(struct.pack('<Q', len(text)) + text + data)

    if test_c_api == 'none':
        print('skip test_c_api (no C compiler)')
    else:
        p = run([test_c_api, model, tmp])
        print(p.stdout, end='')
        check(p.returncode == 0, f'test_c_api: every check passes (exit {p.returncode}{": " + p.stderr[-2000:] if p.stderr else ""})')

    if heat_solver == 'none':
        print('skip heat_solver (no Fortran compiler)')
    else:
        steps, grid = 4, 8
        p = run([heat_solver, model, str(steps), str(grid)])
        check(p.returncode == 0, f'heat_solver exits 0 ({p.returncode}: {p.stderr[-2000:]})')
        rows, fortran, hottest_ok = [], [], True
        for block in re.split(r'^(?=step )', p.stdout, flags=re.M)[1:]:
            lines = block.splitlines()
            source = [float(v) for v in lines[0].split()[3:]]
            nodes = [[float(v) for v in line.split()[1:]] for line in lines[1:] if line.startswith('u ')]
            rows += [[x, y] + source for x, y, _ in nodes]
            fortran += [u for _, _, u in nodes]
            hottest = [float(v) for v in lines[-1].split()[1:]] if lines[-1].startswith('hottest ') else None
            hottest_ok &= hottest is not None and hottest[2] == max(u for _, _, u in nodes)
        check(len(rows) == steps * grid * grid, f'heat_solver: {len(rows)} nodes predicted, expected {steps} steps x {grid}^2')
        check(hottest_ok, 'heat_solver: each step\'s hottest node is its largest prediction')
        check(len({tuple(r[2:4]) for r in rows}) == steps, 'heat_solver: the source moves each step')
        inputs = os.path.join(tmp, 'inputs.txt')
        with open(inputs, 'w') as out:  # repr: the doubles heat_solver printed to 17 digits, exactly
            out.writelines(' '.join(repr(v) for v in r) + '\n' for r in rows)
        p = run([predict_surrogate, '--load', model, '--inputs', inputs])
        check(p.returncode == 0, f'predict_surrogate --inputs exits 0 ({p.returncode}: {p.stderr[-2000:]})')
        cpp = [float(v) for v in p.stdout.split()]
        if len(cpp) == len(fortran) and fortran:
            worst = max(abs(f - c) / max(abs(c), 1e-300) for f, c in zip(fortran, cpp))
            print(f'     Fortran vs C++: largest relative difference {worst:.3g} over {len(cpp)} predictions, '
                  f'largest absolute {max(abs(f - c) for f, c in zip(fortran, cpp)):.3g}')
            check(worst <= 1e-12, 'heat_solver (Fortran, C API) predicts as predict_surrogate (C++) to 1e-12')
        else:
            check(False, f'predict_surrogate gave {len(cpp)} predictions for heat_solver\'s {len(fortran)}')
        p = run([heat_solver, os.path.join(tmp, 'missing.safetensors')])
        check(p.returncode == 2 and 'error: status 2: kfsdp_load: ' in p.stderr and 'missing.safetensors' in p.stderr,
              f'heat_solver: a missing file is a clear error ({p.stderr.strip()!r})')

    for program in (library, test_c_api, heat_solver):
        if program == 'none': continue
        linked = subprocess.run(['ldd', program], capture_output=True, text=True).stdout
        check(linked != '' and 'libmpi' not in linked, f'{os.path.basename(program)} links no MPI library (ldd)')

print(f'surrogate C API and Fortran: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
