#!/usr/bin/env python3
"""End-to-end checks of examples/train_gpt under mpirun (the README's main job, small sizes).
usage: test_train_gpt.py TRAIN_GPT DATA_FILE MPIRUN [MPIRUN_ARGS...]"""
import json, os, re, signal, struct, subprocess, sys, tempfile

train_gpt, data, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
small = ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '12',
         '--dtype', 'f64', '--sample', '0']
failures = []

def run(ranks, *flags, expect=0, env=None, cpus=None):
    cmd = mpirun + ['-np', str(ranks), train_gpt] + small + list(flags)
    if cpus is not None:  # the CPUs the ranks may run on (mpirun --bind-to none keeps the mask)
        cmd = ['taskset', '-c', cpus] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=None if env is None else {**os.environ, **env})
    if p.returncode != expect:
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}, expected {expect}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}')
    return p.stdout + p.stderr

def losses(out):
    return [float(line.split('|')[1].split()[1]) for line in out.splitlines() if line.startswith('step ')]

def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)

def safetensors(path):
    blob = open(path, 'rb').read()
    n = struct.unpack('<Q', blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return header, {k: blob[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]
                    for k, v in header.items() if k != '__metadata__'}

def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol * abs(y) for x, y in zip(a, b))

with tempfile.TemporaryDirectory() as tmp:
    f = lambda name: os.path.join(tmp, name)
    # 2k steps straight against k + save + resume + k: bit-identical at the same world size.
    straight = run(2, '--steps', '6', '--save', f('straight.st'))
    half = run(2, '--steps', '3', '--save', f('half.st'))
    resumed = run(2, '--steps', '6', '--resume', f('half.st'), '--save', f('resumed.st'))
    check(losses(half) + losses(resumed) == losses(straight), 'resume at the same world size: identical losses')
    check(safetensors(f('straight.st'))[1] == safetensors(f('resumed.st'))[1],
          'resume at the same world size: identical weights and optimizer state (bytes)')
    # ... and at another world size within the training tolerance (double 1e-10).
    other = run(1, '--steps', '6', '--resume', f('half.st'))
    check(close(losses(other), losses(straight)[3:], 1e-10), 'resume at world size 1 of a 2-rank run: losses within 1e-10')
    check(losses(straight)[-1] < losses(straight)[0], 'the loss falls')

    # The same losses at world sizes 1, 2, 3, 4 for zero3 + block bucketing, and the saved model
    # evaluates the same at every world size.
    ref = losses(run(1, '--steps', '3'))
    for n in (2, 3, 4):
        check(close(losses(run(n, '--steps', '3', '--sharding', 'zero3', '--bucketing', 'layer')), ref, 1e-10),
              f'world size {n} (zero3, layer) trains like world size 1')
    # HSDP, 4 ranks as 2 shard groups x 2 replicas: the same losses as flat FSDP (and so as 1 rank).
    for sharding in ('zero2', 'zero3'):
        for bucketing in ('none', 'layer', 'block'):
            flags = ('--steps', '3', '--sharding', sharding, '--bucketing', bucketing)
            check(close(losses(run(4, *flags, '--hybrid-shard', '2')), ref, 1e-10) and
                  close(losses(run(4, *flags)), ref, 1e-10), f'HSDP 2 x 2 ({sharding}, {bucketing}) trains like flat FSDP at 4 ranks and 1 rank')
    check(close(losses(run(4, '--steps', '3', '--hybrid-shard', 'node')), ref, 1e-10),
          'HSDP with a shard group per node (one node of 4: flat) trains like 1 rank')
    # A checkpoint written under HSDP (the first shard group writes) resumes flat at 1, 3 and 4 ranks
    # and under HSDP again, as the straight HSDP run goes on.
    hsdp = ('--sharding', 'zero3', '--bucketing', 'block', '--hybrid-shard', '2')
    hsdp_straight = losses(run(4, '--steps', '6', *hsdp))
    run(4, '--steps', '3', *hsdp, '--save', f('hsdp.st'))
    for n, extra in ((1, ()), (3, ()), (4, ()), (4, hsdp)):
        check(close(losses(run(n, '--steps', '6', '--resume', f('hsdp.st'), *extra)), hsdp_straight[3:], 1e-10),
              f'a checkpoint written under HSDP 2 x 2 resumes at {n} ranks {"under HSDP" if extra else "flat"}')
    run(3, '--steps', '2', '--save', f('ws3.st'))
    evals = [run(n, '--load', f('ws3.st'), '--eval', '20').split('eval_loss ')[1].split()[0] for n in (1, 2, 4)]
    check(len(set(float(e) for e in evals)) == 1 or close([float(e) for e in evals], [float(evals[0])] * 3, 1e-11),
          f'eval_loss of a checkpoint written at 3 ranks, read at 1, 2, 4: {evals}')

    # --steps 0 --save writes the initial weights under nanoGPT names with the sizes in __metadata__.
    run(2, '--steps', '0', '--save', f('init.st'))
    header, tensors = safetensors(f('init.st'))
    meta = header['__metadata__']
    check(header['transformer.wte.weight']['shape'] == [256, 32] and header['lm_head.weight']['dtype'] == 'F64',
          'initial weights: nanoGPT names, shapes, F64')
    check(meta.get('layers') == '2' and meta.get('dim') == '32' and meta.get('seq') == '16', 'model sizes in __metadata__')
    check('transformer.h.1.mlp.c_proj.bias' in header, 'every block is saved')

    # The checkpoint records the model's configuration; resuming or loading it into another is refused, naming the field
    # (--heads changes no shape: the weights alone would load).
    run(2, '--steps', '1', '--heads', '4', '--save', f('heads4.st'))
    meta = safetensors(f('heads4.st'))[0]['__metadata__']
    config = {k: meta.get(k) for k in ('layers', 'dim', 'heads', 'seq', 'vocab', 'tie_weights')}
    check(config == {'layers': '2', 'dim': '32', 'heads': '4', 'seq': '16', 'vocab': '256', 'tie_weights': 'off'},
          f'the configuration in __metadata__: {config}')
    for flags, flag in ((('--steps', '2', '--resume', f('heads4.st')), '--resume'), (('--load', f('heads4.st'), '--eval', '4'), '--load')):
        out = run(2, *flags, expect=2)
        message = f"error: train_gpt: checkpoint {f('heads4.st')} ({flag}) was saved with heads = 4, this model has heads = 2"
        check(message in out, f'{flag} into another --heads: "{message}"')
    run(2, '--steps', '1', '--tie-weights', 'on', '--save', f('tied.st'))
    out = run(2, '--steps', '2', '--resume', f('tied.st'), expect=2)
    check('was saved with tie_weights = on, this model has tie_weights = off' in out, '--resume into another --tie-weights is refused')
    # Windows are drawn by step from --seed and --batch: resuming with another seed once trained on other windows.
    out = run(2, '--steps', '6', '--resume', f('half.st'), '--seed', '7', expect=2)
    check(f"--resume {f('half.st')}: checkpoint metadata: 'seed' is '1337', expected '7' (this run's): resume with the --seed"
          in out, '--resume with another --seed is refused')

    # A diverged run stops at its first non-finite step with an error naming it, exits non-zero and saves nothing.
    out = run(2, '--steps', '20', '--clip', '0', '--lr', '1e6', '--save', f('diverged.st'), expect=2)
    stopped = [line for line in out.splitlines() if line.startswith('error: train_gpt: step ')]
    check(len(stopped) == 1 and 'kfsdp::trainer::step: the loss is ' in stopped[0] and 'expected finite values' in stopped[0]
          and 'nan |' not in out and not os.path.exists(f('diverged.st')),
          f'--clip 0 --lr 1e6 diverges: stopped with "{stopped[0] if stopped else out[-500:]}", no checkpoint')

    # int8 collectives carry a NaN as one: in f32, the diverging run is refused at the same step, naming the same
    # gradient, with int8 all-gathers and reductions as with scalar ones (the int8 reduction once summed the NaN
    # gradient to numbers and stepped on, and the next step's NaN loss came with "the gradient norm 0").
    def stop(*flags):
        out = run(2, '--steps', '20', '--clip', '0', '--lr', '1e6', '--dtype', 'f32', *flags, expect=2)
        lines = [line for line in out.splitlines() if line.startswith('error: train_gpt: step ')]
        if len(lines) != 1: return None
        found = re.match(r'error: train_gpt: (step \d+)/20: .* the gradient norm (\S+), expected finite values(, first in [^:]*)?:',
                         lines[0])
        return found.groups() if found else lines[0]
    scalar_stop, int8_stop = stop(), stop('--reduce-dtype', 'int8', '--param-dtype', 'int8')
    check(isinstance(int8_stop, tuple) and int8_stop[1] != '0' and int8_stop[0] == scalar_stop[0]
          and int8_stop[2] == scalar_stop[2],
          f'--lr 1e6 with int8 collectives stops as with scalar ones: {int8_stop} vs {scalar_stop}')

    # --trace: valid JSON with the compute regions and the collectives (bucket, bytes).
    run(2, '--steps', '2', '--sharding', 'zero3', '--trace', f('trace'))
    for r in (0, 1):
        events = json.load(open(f(f'trace.rank{r}.json')))['traceEvents']
        names = {e['name'].split(' ')[0] for e in events}
        check({'all_gather', 'reduce_scatter', 'forward', 'backward', 'optimizer'} <= names, f'trace rank {r}: expected events')
        gathers = [e for e in events if e['name'] == 'all_gather']
        check(all(e['ph'] == 'X' and e['pid'] == r and e['tid'] == 1 and e['args']['bytes'] > 0 for e in gathers),
              f'trace rank {r}: all-gathers carry bucket and bytes on the communication lane')

    # --metrics: one JSON object a line for every step (also those --log-every does not print), the
    # printed losses, the printed memory, and each rank's communication.
    out = run(2, '--steps', '5', '--log-every', '2', '--metrics', f('metrics.jsonl'))
    text = open(f('metrics.jsonl')).read()
    records = [json.loads(line) for line in text.splitlines()]
    check(text.endswith('\n') and [r['step'] for r in records] == [1, 2, 3, 4, 5], '--metrics: one JSON line per step')
    keys = {'step', 'loss', 'grad_norm', 'lr', 'tokens_per_s', 'step_time_s', 'memory_per_rank_bytes', 'params_bytes',
            'grads_bytes', 'optimizer_bytes', 'unsharded_peak_bytes', 'activation_peak_bytes', 'comm_bytes'}
    check(all(r.keys() == keys for r in records), f'--metrics keys: {sorted(records[0].keys())}')
    printed = {int(line.split()[1].split('/')[0]): line for line in out.splitlines() if line.startswith('step ')}
    check(sorted(printed) == [1, 3, 5] and all(f'loss {records[n - 1]["loss"]:.6f} |' in line for n, line in printed.items()),
          '--metrics: the losses equal the printed ones')
    mib = lambda b: f'{b / 2**20:.2f} MiB'
    check(all(f'memory/rank {mib(r["memory_per_rank_bytes"])} (params {mib(r["params_bytes"])}, grads {mib(r["grads_bytes"])}, '
              f'optimizer {mib(r["optimizer_bytes"])}, unsharded peak {mib(r["unsharded_peak_bytes"])}) | '
              f'activations {mib(r["activation_peak_bytes"])}' in printed[r['step']] for r in records if r['step'] in printed),
          '--metrics: the memory equals the printed one')
    check(all(r['memory_per_rank_bytes'] == r['params_bytes'] + r['grads_bytes'] + r['optimizer_bytes'] + r['unsharded_peak_bytes']
              and r['comm_bytes'] > 0 and r['lr'] == 0.002 and r['grad_norm'] > 0 and r['step_time_s'] > 0
              and abs(r['tokens_per_s'] * r['step_time_s'] - 12 * 16) < 1e-6 * 12 * 16 for r in records),
          '--metrics: memory sums, comm bytes, lr, grad norm, tokens/s x step time = tokens')

    # The memory estimate printed before training bounds what the engine and the layers measured
    # (metrics: shards + optimizer + unsharded peak, and the activations' peak), from above and closely.
    units = {'B': 1, 'KiB': 1024, 'MiB': 1024 ** 2, 'GiB': 1024 ** 3}
    for flags in ([], ['--sharding', 'zero3', '--bucketing', 'none', '--checkpointing', 'on']):
        out = run(2, '--steps', '2', '--metrics', f('fit.jsonl'), *flags)
        value, unit = out.split('estimated memory per rank ')[1].split()[:2]
        r = [json.loads(line) for line in open(f('fit.jsonl'))][-1]
        ratio = float(value) * units[unit] / (r['memory_per_rank_bytes'] + r['activation_peak_bytes'])
        check(0.95 <= ratio <= 1.5, f'memory estimate {" ".join(flags) or "(defaults)"}: {ratio:.3f} x the measured peak')

    # Bad input is a clear error, the same on every rank, and no hang.
    out = run(2, '--batch', '3', expect=2)
    check('--batch is 3, expected a positive multiple of the 2 ranks' in out, 'an uneven batch is refused')
    out = run(2, '--load', f('missing.st'), '--eval', '4', expect=2)
    check('missing.st' in out, 'a missing checkpoint is named')
    for flags, message in ((['--layer', '3'], 'unknown flag --layer (did you mean --layers?)'),
                           (['--bogus'], 'unknown flag --bogus'),  # last, without a value: still unknown
                           (['--layers', '0'], '--layers is 0, expected at least 1'),
                           (['--clip', '-1'], '--clip is -1, expected at least 0'),
                           (['--data', tmp], f"the data file '{tmp}' is not a regular file"),
                           (['--metrics', f('no-dir/m.jsonl')],
                            f"--metrics '{f('no-dir/m.jsonl')}' cannot be opened for writing: No such file or directory"),
                           (['--metrics', tmp], f"--metrics '{tmp}' cannot be opened for writing: Is a directory"),
                           # A metrics file that cannot be written (a full disk) was lost with exit 0.
                           (['--steps', '2', '--metrics', '/dev/full'], "--metrics '/dev/full': writing failed: No space left on device"),
                           # Each byte is a forward pass: 1e11 ran on for days.
                           (['--sample', '100000000000'], "--sample is '100000000000', expected a whole number from 0 to 65536")):
        out = run(2, *flags, expect=2)
        check(message in out, f'{" ".join(flags)}: "{message}"')
    # A bad KFSDP_* variable is a bad input too: every rank stops with exit 2 and names it (was an abort, rc 134).
    # KFSDP_SHARED_MEMORY=2 was an abort with a backtrace (rc 134); a timeout under 1 ms is refused.
    for variable, value, message in (('KFSDP_COLLECTIVE_TIMEOUT', 'abc',
                                      "error: KFSDP_COLLECTIVE_TIMEOUT is 'abc', expected 0 (no timeout) or seconds from 0.001 to 1e+09"),
                                     ('KFSDP_COLLECTIVE_TIMEOUT', '1e-300',
                                      "error: KFSDP_COLLECTIVE_TIMEOUT is '1e-300', expected 0 (no timeout) or seconds from 0.001 to 1e+09"),
                                     ('KFSDP_CHECK_COLLECTIVES', 'yes',
                                      "error: KFSDP_CHECK_COLLECTIVES is 'yes', expected 1, on, 0 or off"),
                                     ('KFSDP_SHARED_MEMORY', '2',
                                      "error: KFSDP_SHARED_MEMORY is '2', expected 1, on, 0 or off"),
                                     ('KFSDP_HYBRID_SHARD', '2x',
                                      "error: KFSDP_HYBRID_SHARD is '2x', expected a whole number from 0 to 2147483647 (ranks per shard group), node, or 0 (flat)")):
        out = run(2, '--steps', '1', expect=2, env={variable: value})
        check(message in out and out.count('error:') == 1, f'{variable}={value}: "{message}", once')
    # A model that cannot fit stops before allocating, with its figures and the flags that set them.
    for flags in (['--dim', '1000000', '--heads', '1'], ['--layers', '1000000000000000000'], ['--batch', '100000000']):
        out = run(2, *flags, expect=2)
        check('the model does not fit: it needs' in out and f'--{flags[0][2:]} {flags[1]}' in out and
              'available to each of the 2 ranks' in out, f'{" ".join(flags)}: refused as not fitting')

    # Preemption (SIGUSR1, which mpirun forwards to every rank, as Slurm's --signal=USR1@N): every rank
    # stops at the same step boundary, the checkpoint is saved and marked, the job exits 0; --resume
    # then finishes the run and the marker goes. train_gpt once ignored the signal and lost its steps.
    cmd = mpirun + ['-np', '2', train_gpt] + small + ['--steps', '100000', '--save', f('stopped.st')]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in job.stdout:
        lines.append(line)
        if line.startswith('step ') and int(line.split('/')[0].split()[1]) >= 3:
            job.send_signal(signal.SIGUSR1)
            break
    out = ''.join(lines) + job.communicate(timeout=120)[0]
    stopped = [line for line in out.splitlines() if 'stopped by a signal at step' in line]
    at = int(stopped[0].split('at step ')[1].split(',')[0]) if stopped else -1
    check(job.returncode == 0 and at >= 3 and os.path.exists(f('stopped.st')) and
          open(f('stopped.st.stopped')).read() == f'stopped at step {at}\n',
          f'SIGUSR1: stopped at step {at}, saved and marked, exit {job.returncode}')
    out = run(2, '--steps', str(at + 2), '--resume', f('stopped.st'), '--save', f('stopped.st'))
    check(f'resumed {f("stopped.st")} at step {at}' in out and len(losses(out)) == 2 and
          not os.path.exists(f('stopped.st.stopped')), 'resumed after the stop, finished, the marker removed')

    # Token shards (test/io/tokens): --data a glob later given as well (the last --data wins), --vocab, validation.
    tokens = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'io', 'tokens')
    shards = ['--data', os.path.join(tokens, 'kjv_train_*.bin'), '--val-data', os.path.join(tokens, 'kjv_val_000000.bin'),
              '--vocab', '512', '--steps', '4', '--eval-every', '2']
    one, three = run(1, *shards, '--metrics', f('tokens1.jsonl')), run(3, *shards, '--metrics', f('tokens3.jsonl'))
    step_losses = [[json.loads(line)['loss'] for line in open(f(name))] for name in ('tokens1.jsonl', 'tokens3.jsonl')]
    validation = [re.findall(r'validation after step \d+/4 \| loss (\S+) \| perplexity (\S+)', o) for o in (one, three)]
    check(len(step_losses[0]) == 4 and close(step_losses[1], step_losses[0], 1e-10) and len(validation[0]) == 2
          and validation[0] == validation[1] and 'vocabulary 512' in one,
          f'token shards: 1 and 3 ranks train alike ({step_losses[0][-1]}), validation (loss, perplexity) {validation[0]}')
    out = run(1, *shards[:4], '--vocab', '500', '--steps', '1', expect=2)
    check("expected less than the vocabulary 500" in out, 'a token id past --vocab 500 is refused')

    # --help prints the program's flags alone (Kokkos' own help is --kokkos-help), and Kokkos' flags
    # still reach Kokkos rather than the program's parser.
    out = run(1, '--help')
    check(out.lstrip().startswith('usage') or out.lstrip().startswith('train_gpt'), '--help starts with the program\'s usage')
    check('Kokkos command line arguments' not in out and '--steps' in out, '--help: no Kokkos banner, the program\'s flags')
    # --kokkos-disable-warnings: a flag that Kokkos 3.4 and 4.x both take (4.x no longer knows --kokkos-threads).
    check(len(losses(run(1, '--steps', '1', '--kokkos-disable-warnings'))) == 1,
          'a --kokkos-* flag goes to Kokkos, not to the program')

    # --overlap auto (the default) takes the communication thread only where every rank has a core to
    # spare, and polls from the compute thread elsewhere; thread, poll and off are taken as said.
    if os.cpu_count() >= 2:
        check('overlap thread,' in run(1, '--steps', '1', cpus='0,1'), '--overlap auto: 1 rank on 2 CPUs takes the thread')
        check('overlap polls,' in run(2, '--steps', '1', cpus='0,1'), '--overlap auto: 2 ranks on 2 CPUs poll')
        check('overlap polls,' in run(1, '--steps', '1', cpus='0'), '--overlap auto: 1 rank on 1 CPU polls')
        check('overlap thread,' in run(2, '--steps', '1', '--overlap', 'thread', cpus='0,1'), '--overlap thread takes it anyway')
        check('overlap off,' in run(2, '--steps', '1', '--overlap', 'off', cpus='0,1'), '--overlap off neither')
        polled = losses(run(2, '--steps', '3', '--overlap', 'poll', '--sharding', 'zero3'))
        check(polled == losses(run(2, '--steps', '3', '--overlap', 'off', '--sharding', 'zero3')),
              '--overlap poll: the same losses as off, to the bit')

print(f'train_gpt end to end: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
