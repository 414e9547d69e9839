#!/usr/bin/env python3
"""End-to-end checks of examples/generate_llama on the generation fixtures (test/infer/generation/greedy.json:
transformers' generate(do_sample=False) tokens; no torch needed here): greedy 32 tokens equal transformers'
for every model, in f32 and f64; generation_config.json's eos stops it; sampling is seeded; bad flags are
refused, naming them.
usage: test_generate_llama.py GENERATE_LLAMA SOURCE_ROOT"""
import json, os, shutil, subprocess, sys, tempfile

import e2e
from e2e import check, finish

generate, root = sys.argv[1], sys.argv[2]
fixture = json.load(open(os.path.join(root, 'test', 'infer', 'generation', 'greedy.json')))
prompt = ','.join(map(str, fixture['prompt']))

def run(model_dir, *flags, expect=0):
    out = e2e.run([generate, '--model', model_dir] + list(flags), expect, timeout=300)
    return [int(t) for t in out.split()] if expect == 0 else out

for name, model in fixture['models'].items():
    model_dir = os.path.join(root, model['dir'])
    for dtype in ['f32', 'f64']:
        got = run(model_dir, '--prompt', prompt, '--max-new-tokens', str(fixture['max_new_tokens']), '--dtype', dtype)
        check(got == model['greedy'], f'{name} {dtype}: greedy {len(got)} tokens equal transformers\' {len(model["greedy"])}')

tiny = os.path.join(root, fixture['models']['tiny-llama']['dir'])
with tempfile.TemporaryDirectory() as tmp:
    # eos_token_id as an int and as a list: generation stops at it, as transformers' (the eos is returned).
    model = fixture['models']['tiny-llama']
    for eos in [model['eos'], [model['eos'], 255]]:
        copy = os.path.join(tmp, 'eos')
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(tiny, copy)
        with open(os.path.join(copy, 'generation_config.json'), 'w') as f:
            json.dump({'eos_token_id': eos}, f)
        got = run(copy, '--prompt', prompt)
        check(got == model['greedy_eos'], f'eos_token_id {eos}: stops after {len(got)} tokens, transformers after {len(model["greedy_eos"])}')
        check(run(copy, '--prompt', prompt, '--eos', 'none') == model['greedy'], f'--eos none ignores eos_token_id {eos}')
    os.remove(os.path.join(copy, 'generation_config.json'))
    check(run(copy, '--prompt', prompt) == model['greedy'], 'no generation_config.json: no eos, 32 tokens')

sampled = lambda seed, *more: run(tiny, '--prompt', prompt, '--sample', 'on', '--top-k', '20', '--temperature', '1.5',
                                  '--seed', str(seed), *more)
check(sampled(7) == sampled(7), 'sampling: the same seed, the same tokens')
check(sampled(7) != sampled(8), 'sampling: another seed, other tokens')
check(run(tiny, '--prompt', prompt, '--sample', 'on', '--top-k', '1', '--seed', '3') == fixture['models']['tiny-llama']['greedy'],
      'sampling with top-k 1 is greedy')

for flags, expected in [(['--prompt', '1,256'], 'prompt token 1 is 256, expected 0 <= id < vocab_size = 256'),
                        (['--prompt', '1,2', '--max-new-tokens', '319'], 'max_new_tokens = 319 after a prompt of 2 tokens needs 321 positions'),
                        (['--prompt', '1', '--sample', 'on', '--top-k', '0'], 'top_k is 0, expected at least 1'),
                        (['--prompt', '1', '--sample', 'on', '--temperature', '0'], 'temperature is 0, expected a finite number > 0'),
                        (['--prompt', ''], 'the prompt is empty')]:
    err = run(tiny, *flags, expect=2)
    check(expected in err, f'{" ".join(flags)}: "{expected}" in {err.strip()!r}')

finish()
