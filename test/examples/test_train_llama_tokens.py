#!/usr/bin/env python3
"""examples/train_llama on token shards under mpirun: the shipped text tokenized by the fixture's BPE
(test/io/tokens, made by make_fixtures.py; no tokenizers package needed here) trains alike at 1, 2 and
3 ranks (f64, losses within 1e-10) and reports validation loss and perplexity; each rank's byte
counter is windows × (seq + 1) × 2; a 2 GiB sparse shard costs no more resident memory than a
20 MiB one; a token id past the vocabulary is refused by name.
usage: test_train_llama_tokens.py TRAIN_LLAMA TOKENS_DIR MPIRUN [MPIRUN_ARGS...]"""
import json, math, os, re, struct, subprocess, sys, tempfile

import e2e
from e2e import check, finish

train_llama, tokens, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
train, val = os.path.join(tokens, 'kjv_train_*.bin'), os.path.join(tokens, 'kjv_val_000000.bin')
seq, batch, steps = 16, 6, 6
small = ['--layers', '2', '--dim', '32', '--hidden', '48', '--heads', '4', '--kv-heads', '2', '--seq', str(seq),
         '--dtype', 'f64', '--vocab', '512', '--batch', str(batch)]


def run(ranks, *flags, expect=0):
    return e2e.run(mpirun + ['-np', str(ranks), train_llama] + list(flags), expect)




def validation(out):
    """[(step, loss, perplexity)] of the validation lines."""
    return [(int(m[1]), float(m[2]), float(m[3])) for m in
            re.finditer(r'validation after step (\d+)/\d+ \| loss (\S+) \| perplexity (\S+)', out)]


def reads(out):
    """Each rank's bytes copied and peak resident memory (MiB), from the last line of train_llama."""
    m = re.search(r'data bytes copied per rank \[([^\]]*)\], peak resident memory \(VmHWM\) per rank \[([^\]]*)\] MiB', out)
    return [float(x) for x in m[1].split(',')], [float(x) for x in m[2].split(',')]


def sparse_shard(path, size):
    """An llm.c shard of `size` bytes, all but its header a hole (token 0 everywhere)."""
    with open(path, 'wb') as f:
        f.write(struct.pack('<3i', 20240520, 1, (size - 1024) // 2) + bytes(1012))
        f.truncate(size)


with tempfile.TemporaryDirectory() as tmp:
    # The same run at 1, 2 and 3 ranks: every step's loss (rank 0's metrics, full precision) and the validation.
    losses, vals = {}, {}
    for n in (1, 2, 3):
        metrics = os.path.join(tmp, f'metrics{n}.jsonl')
        out = run(n, '--data', train, '--val-data', val, '--eval-every', '3', '--steps', str(steps), '--metrics', metrics,
                  *small)
        losses[n] = [json.loads(line)['loss'] for line in open(metrics)]
        vals[n] = validation(out)
        copied, _ = reads(out)
        want = steps * (batch // n) * (seq + 1) * 2
        check(copied == [want] * n, f'{n} ranks: each rank copied {copied} bytes, the formula '
                                    f'{steps} steps x {batch // n} windows x {seq + 1} tokens x 2 bytes = {want}')
    check(len(losses[1]) == steps and losses[1][-1] < losses[1][0], f'the loss falls: {losses[1][0]} -> {losses[1][-1]}')
    for n in (2, 3):
        worst = max(abs(a - b) for a, b in zip(losses[n], losses[1]))
        check(len(losses[n]) == steps and worst <= 1e-10, f'{n} ranks train like 1 on the token shards: losses within {worst:.3g}')
        check(len(vals[n]) == 2 and all(abs(a[1] - b[1]) <= 1e-10 for a, b in zip(vals[n], vals[1])),
              f'{n} ranks: the validation losses equal 1 rank\'s: {vals[n]}')
    check([v[0] for v in vals[1]] == [3, 6] and all(abs(p - math.exp(l)) <= 1e-5 * p for _, l, p in vals[1])
          and vals[1][1][1] < vals[1][0][1], f'validation loss and perplexity after steps 3 and 6, falling: {vals[1]}')

    # A split of --data's last windows instead of a file.
    out = run(2, '--data', train, '--val-split', '40', '--steps', '2', *small)
    check('| 40 windows' in out and len(validation(out)) == 1, '--val-split 40 evaluates the 40 held-out windows')

    # Peak resident memory: a 2 GiB sparse shard against a 20 MiB one, the same run, each rank.
    peaks = {}
    for name, size in (('small', 20 << 20), ('big', 2 << 30)):
        shard = os.path.join(tmp, name + '.bin')
        sparse_shard(shard, size)
        peaks[name] = reads(run(2, '--data', shard, '--steps', '20', *small))[1]
        os.remove(shard)
    grown = [b - s for b, s in zip(peaks['big'], peaks['small'])]
    check(all(g <= 32 for g in grown), f'VmHWM per rank: {peaks["small"]} MiB with 20 MiB of tokens, '
                                        f'{peaks["big"]} MiB with 2 GiB: within 32 MiB ({grown})')

    # A token id at or past the vocabulary: the shard, the place, the id and the vocabulary.
    out = run(2, '--data', train, '--steps', '1', *small[:-4], '--vocab', '256', '--batch', str(batch), expect=1)
    check(re.search(r"kjv_train_00000\d\.bin' holds token id (\d+) at token \d+ \(byte offset \d+\), expected less than "
                    r"the vocabulary 256", out) is not None, 'a token id >= --vocab 256 is refused, naming the shard and offset')

finish()
