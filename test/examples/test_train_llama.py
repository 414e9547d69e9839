#!/usr/bin/env python3
"""End-to-end checks of examples/train_llama under mpirun, on the shipped text and the tiny fixture of
test/model/llama (transformers' LlamaForCausalLM; no torch needed here).
usage: test_train_llama.py TRAIN_LLAMA DATA_FILE FIXTURE_DIR MPIRUN [MPIRUN_ARGS...]"""
import json, os, struct, subprocess, sys, tempfile

import e2e
from e2e import check, finish

train_llama, data, fixture, mpirun = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
small = ['--data', data, '--layers', '2', '--dim', '32', '--hidden', '48', '--heads', '4', '--kv-heads', '2',
         '--seq', '16', '--dtype', 'f64']

def run(ranks, *flags, expect=0):
    return e2e.run(mpirun + ['-np', str(ranks), train_llama] + list(flags), expect)

def losses(out):
    return [float(line.split('|')[1].split()[1]) for line in out.splitlines() if line.startswith('step ')]

def eval_loss(out):
    return float(out.split('eval_loss ')[1].split()[0])


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol * abs(y) for x, y in zip(a, b))

def safetensors(path):
    """{name: list of floats} of the F64 tensors of a safetensors file."""
    blob = open(path, 'rb').read()
    n = struct.unpack('<Q', blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == '__metadata__': continue
        if v['dtype'] != 'F64': continue
        begin, end = v['data_offsets']
        out[name] = struct.unpack(f'<{(end - begin) // 8}d', blob[8 + n + begin:8 + n + end])
    return out

reference = safetensors(os.path.join(fixture, 'reference.safetensors'))

with tempfile.TemporaryDirectory() as tmp:
    # Training from scratch: the loss falls, and every world size trains alike (zero3, block).
    ref = losses(run(1, *small, '--batch', '6', '--steps', '6'))
    check(ref[-1] < ref[0], f'the loss falls: {ref[0]} -> {ref[-1]}')
    for n in (2, 3):
        check(close(losses(run(n, *small, '--batch', '6', '--steps', '6', '--sharding', 'zero3')), ref, 1e-10),
              f'world size {n} (zero3, block) trains like world size 1')
    check(close(losses(run(2, *small, '--batch', '6', '--steps', '6', '--checkpointing', 'on', '--sharding', 'zero3')), ref, 1e-10),
          'activation checkpointing (each decoder layer recomputed in backward) trains alike')
    tied = losses(run(1, *small, '--batch', '6', '--steps', '6', '--tie-weights', 'on'))
    check(close(losses(run(3, *small, '--batch', '6', '--steps', '6', '--tie-weights', 'on', '--sharding', 'zero3')), tied, 1e-10)
          and tied != ref, 'tied embeddings train alike at 1 and 3 ranks (and differently from untied)')

    # A Hugging Face directory evaluates as transformers does (float64 reference), at any world size.
    want = reference['loss.f64'][0]
    for n, directory in ((1, 'tiny-f32'), (3, 'tiny-f64-sharded')):
        got = eval_loss(run(n, '--data', data, '--load', os.path.join(fixture, directory), '--eval', '4', '--dtype', 'f64'))
        check(abs(got - want) <= 1e-10 * want, f'--load {directory} --eval 4 at {n} ranks: eval_loss {got}, transformers {want}')

    # 3 plain SGD steps from the fixture at 3 ranks, saved: torch's parameters after the same steps.
    tuned = os.path.join(tmp, 'tuned')
    run(3, '--data', data, '--load', os.path.join(fixture, 'tiny-f32'), '--dtype', 'f64', '--steps', '3', '--batch', '3',
        '--sampling', 'sequential', '--optimizer', 'sgd', '--lr', '0.1', '--momentum', '0', '--weight-decay', '0',
        '--clip', '0', '--sharding', 'zero3', '--bucketing', 'block', '--save', tuned)
    saved = safetensors(os.path.join(tuned, 'model.safetensors'))
    trained = {k[len('trained.'):]: v for k, v in reference.items() if k.startswith('trained.')}
    worst = max(abs(a - b) for name in trained for a, b in zip(saved[name], trained[name]))
    check(saved.keys() == trained.keys() and worst <= 1e-9,
          f'--save after 3 SGD steps at 3 ranks: every parameter within {worst:.3g} of torch\'s')
    config = json.load(open(os.path.join(tuned, 'config.json')))
    check(config['num_key_value_heads'] == 2 and config['hidden_size'] == 64, 'the saved config.json keeps the sizes')
    again = [eval_loss(run(n, '--data', data, '--load', tuned, '--eval', '4', '--dtype', 'f64')) for n in (1, 2)]
    check(close(again, [again[0]] * 2, 1e-12), f'the saved directory evaluates alike at 1 and 2 ranks: {again}')

    # LoRA from the fixture at 2 ranks: peft's adapter directory and the merge, which evaluate alike; the
    # adapter continues with --load-adapter; the base is never written.
    base = os.path.join(fixture, 'tiny-f32')
    adapter, merged = os.path.join(tmp, 'adapter'), os.path.join(tmp, 'merged')
    lora = ['--data', data, '--load', base, '--dtype', 'f64', '--batch', '4', '--lr', '0.01']
    out = run(2, *lora, '--steps', '4', '--lora-rank', '4', '--lora-alpha', '8', '--lora-targets', 'q_proj,v_proj,down_proj',
              '--save', adapter, '--save-merged', merged)
    check(losses(out)[-1] < losses(out)[0], f'LoRA: the loss falls: {losses(out)}')
    adapter_config = json.load(open(os.path.join(adapter, 'adapter_config.json')))
    check(adapter_config['r'] == 4 and adapter_config['lora_alpha'] == 8 and
          sorted(adapter_config['target_modules']) == ['down_proj', 'q_proj', 'v_proj'] and
          adapter_config['peft_type'] == 'LORA', f'--save writes peft\'s adapter_config.json: {adapter_config}')
    tensors = json.loads(open(os.path.join(adapter, 'adapter_model.safetensors'), 'rb').read()[8:][:struct.unpack(
        '<Q', open(os.path.join(adapter, 'adapter_model.safetensors'), 'rb').read(8))[0]])
    check(sorted(k for k in tensors if k != '__metadata__')[:2] == ['base_model.model.model.layers.0.mlp.down_proj.lora_A.weight',
                                                                     'base_model.model.model.layers.0.mlp.down_proj.lora_B.weight']
          and len(tensors) - 1 == 12, 'the adapter holds peft\'s names, 2 per adapted projection')
    with_adapter = eval_loss(run(2, '--data', data, '--load', base, '--load-adapter', adapter, '--eval', '4', '--dtype', 'f64'))
    from_merged = eval_loss(run(1, '--data', data, '--load', merged, '--eval', '4', '--dtype', 'f64'))
    check(abs(with_adapter - from_merged) <= 1e-10 * from_merged and with_adapter < want,
          f'--load-adapter and the merged directory evaluate alike: {with_adapter}, {from_merged} (base {want})')
    out = run(2, *lora, '--steps', '2', '--load-adapter', adapter)
    check(len(losses(out)) == 2 and abs(losses(out)[0] - with_adapter) < 0.5, f'--load-adapter continues training: {losses(out)}')
    out = run(1, *lora, '--steps', '1', '--load-adapter', adapter, '--lora-rank', '8', expect=1)
    check('--lora-rank and --load-adapter both given' in out, 'a --lora-rank beside --load-adapter is refused')
    out = run(1, *lora, '--steps', '1', '--lora-rank', '4', '--lora-targets', 'qproj', expect=1)
    check("target 'qproj' is not a module of the model" in out, 'an unknown --lora-targets is refused, naming it')

    # Refusals name the flag and the value.
    out = run(1, *small, '--kv-heads', '3', '--steps', '1', expect=1)
    check('kv_heads is 3' in out, 'a --kv-heads that does not divide --heads is refused, naming it')
    out = run(1, '--data', data, '--eval', '4', expect=1)
    check('--eval needs --load' in out, '--eval without --load is refused')
    # Sizes past the memory stop before the model is built, with both figures and what set them
    # (num_hidden_layers 1e9 in a config.json ran until the kernel's OOM killer).
    huge = os.path.join(tmp, 'huge')
    os.makedirs(huge)
    json.dump(dict(config, num_hidden_layers=1000000000), open(os.path.join(huge, 'config.json'), 'w'))
    out = run(2, '--data', data, '--load', huge, '--eval', '4', expect=2)
    check('the model does not fit: it needs' in out and 'available to each of the 2 ranks' in out and
          f"set by {huge}'s config.json (num_hidden_layers 1000000000," in out, 'a config.json of 1e9 layers is refused')
    out = run(2, '--data', data, '--layers', '1000000000', '--steps', '1', expect=2)
    check('the model does not fit: it needs' in out and 'set by --layers 1000000000 ' in out, '--layers 1e9 is refused')

finish()
