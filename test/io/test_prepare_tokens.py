#!/usr/bin/env python3
"""scripts/prepare-tokens, where the tokenizers package imports (exit 77, skipped, where it does not):
the shipped text tokenized with the fixture's tokenizer.json gives the committed shards of
test/io/tokens byte for byte; a vocabulary past 65,536 gives llm.c's uint32 variant; EOS follows each
document; --val-tokens and --shard-tokens cut where they say.
usage: test_prepare_tokens.py SOURCE_ROOT"""
import array, json, os, struct, subprocess, sys, tempfile

try:
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError:
    print('tokenizers does not import: skipped (pip install tokenizers)')
    sys.exit(77)

root = sys.argv[1]
script, fixture = os.path.join(root, 'scripts', 'prepare-tokens'), os.path.join(root, 'test', 'io', 'tokens')
failures = []


def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)


def shard(path):
    """(magic, version, tokens) of an llm.c shard."""
    blob = open(path, 'rb').read()
    magic, version, count = struct.unpack('<3i', blob[:12])
    tokens = array.array({20240520: 'H', 20240801: 'I'}[magic], blob[1024:])
    assert len(tokens) == count and blob[12:1024] == bytes(1012), path
    return magic, version, list(tokens)


def prepare(*args):
    subprocess.run([sys.executable, script, *args], check=True, capture_output=True, text=True)


with tempfile.TemporaryDirectory() as tmp:
    # The fixture again, from the committed tokenizer: the same shards, byte for byte.
    text = open(os.path.join(root, 'data', 'kjv-genesis-exodus.txt'), encoding='utf-8').read()
    exodus = text.index('Now these are the names of the children of Israel')
    with open(os.path.join(tmp, 'books.jsonl'), 'w', encoding='utf-8') as f:
        for book in (text[:exodus], text[exodus:]):
            f.write(json.dumps({'text': book}) + '\n')
    prepare('--tokenizer', os.path.join(fixture, 'tokenizer.json'), '--out', os.path.join(tmp, 'kjv'), '--val-tokens', '8000',
            '--shard-tokens', '40000', os.path.join(tmp, 'books.jsonl'))
    names = sorted(n for n in os.listdir(fixture) if n.endswith('.bin'))
    check(names == sorted(n for n in os.listdir(tmp) if n.endswith('.bin')) and
          all(open(os.path.join(tmp, n), 'rb').read() == open(os.path.join(fixture, n), 'rb').read() for n in names),
          f'the shipped text through the fixture tokenizer gives the committed shards ({", ".join(names)})')
    tokenizer = Tokenizer.from_file(os.path.join(fixture, 'tokenizer.json'))
    stream = sum((shard(os.path.join(fixture, n))[2] for n in ['kjv_val_000000.bin'] + [n for n in names if 'train' in n]), [])
    first = tokenizer.encode(text[:exodus], add_special_tokens=False).ids
    check(stream[:len(first) + 1] == first + [0] and stream[-1] == 0 and stream.count(0) == 2,
          'EOS (<|endoftext|>, id 0) follows each of the two books, and nowhere else')

    # A vocabulary past 65,536: llm.c's uint32 variant (magic 20240801, version 7).
    vocab = {f'w{i}': i for i in range(70000)}
    vocab.update({'[UNK]': 70000, '</s>': 70001})
    big = Tokenizer(models.WordLevel(vocab, unk_token='[UNK]'))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(os.path.join(tmp, 'big.json'))
    open(os.path.join(tmp, 'a.txt'), 'w').write('w1 w69999 w65536')
    open(os.path.join(tmp, 'b.txt'), 'w').write('w7 nothing')
    prepare('--tokenizer', os.path.join(tmp, 'big.json'), '--out', os.path.join(tmp, 'big'), '--shard-tokens', '4',
            os.path.join(tmp, 'a.txt'), os.path.join(tmp, 'b.txt'))
    shards = [shard(os.path.join(tmp, f'big_train_00000{i}.bin')) for i in (0, 1)]
    check([s[:2] for s in shards] == [(20240801, 7)] * 2 and shards[0][2] + shards[1][2] == [1, 69999, 65536, 70001, 7, 70000, 70001]
          and len(shards[0][2]) == 4 and not os.path.exists(os.path.join(tmp, 'big_val_000000.bin')),
          'vocabulary 70,002: uint32 shards of --shard-tokens 4, </s> after each .txt document')

    p = subprocess.run([sys.executable, script, '--tokenizer', os.path.join(tmp, 'big.json'), '--out', os.path.join(tmp, 'x'),
                        '--eos', '<none>', os.path.join(tmp, 'a.txt')], capture_output=True, text=True)
    check(p.returncode != 0 and "has no token <none>" in p.stderr, f'an --eos the tokenizer lacks is refused: {p.stderr.strip()}')

sys.exit(1 if failures else 0)
