#!/usr/bin/env python3
"""kfsdp's safetensors files and standard ones, both ways, through train_gpt under mpirun:
a checkpoint kfsdp writes opens in the reference `safetensors` package (names sorted, header padded
to 8 bytes, string-valued __metadata__, every tensor's bytes where the header says), and the same
tensors written back by that package (no kfsdp checksum keys) load in kfsdp with the same eval loss.
Without the package (it could not be installed), a reader and writer in this file that follow the
format's specification stand in, and the test says so.
usage: test_standard_safetensors.py TRAIN_GPT DATA_FILE MPIRUN [MPIRUN_ARGS...]"""
import json, os, struct, subprocess, sys, tempfile

train_gpt, data, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
small = ['--data', data, '--layers', '2', '--dim', '32', '--heads', '2', '--seq', '16', '--batch', '8',
         '--sample', '0']
failures = []

try:
    import safetensors
    from safetensors import deserialize
    reader = f'the safetensors package {safetensors.__version__}'

    def serialize(tensors, metadata=None):
        if not hasattr(safetensors, 'TensorSpec'):  # before 0.8: dicts of dtype, shape and bytes
            return safetensors.serialize(tensors, metadata=metadata)
        import ctypes  # 0.8 and later: TensorSpec over raw buffers, dtypes by torch-style name
        names = {'F32': 'float32', 'F64': 'float64'}
        buffers = {k: ctypes.create_string_buffer(t['data'], len(t['data'])) for k, t in tensors.items()}
        specs = {k: safetensors.TensorSpec(dtype=names[t['dtype']], shape=t['shape'],
                                           data_ptr=ctypes.addressof(buffers[k]), data_len=len(t['data']))
                 for k, t in tensors.items()}
        return safetensors.serialize(specs, metadata=metadata)
except ImportError:
    reader = "this test's own reader (the safetensors package is not installed)"

    def deserialize(blob):  # the format's specification, read literally
        n = struct.unpack('<Q', blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        return [(name, {'dtype': v['dtype'], 'shape': v['shape'],
                        'data': blob[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]})
                for name, v in header.items() if name != '__metadata__']

    def serialize(tensors, metadata=None):
        header, data, offset = {}, b'', 0
        for name in sorted(tensors):
            t = tensors[name]
            header[name] = {'dtype': t['dtype'], 'shape': t['shape'],
                            'data_offsets': [offset, offset + len(t['data'])]}
            data += t['data']
            offset += len(t['data'])
        text = json.dumps(header, separators=(',', ':')).encode()
        text += b' ' * (-len(text) % 8)
        return struct.pack('<Q', len(text)) + text + data


def check(condition, what):
    print(('ok   ' if condition else 'FAIL ') + what)
    if not condition: failures.append(what)


def run(ranks, *flags):
    cmd = mpirun + ['-np', str(ranks), train_gpt] + small + list(flags)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}')
    return p.stdout + p.stderr


def eval_loss(out):
    return float(out.split('eval_loss ')[1].split()[0])


print(f'reading and writing with {reader}')
with tempfile.TemporaryDirectory() as tmp:
    kfsdp_file, standard_file = os.path.join(tmp, 'kfsdp.st'), os.path.join(tmp, 'standard.st')
    run(2, '--steps', '3', '--save', kfsdp_file)
    blob = open(kfsdp_file, 'rb').read()

    # kfsdp's file, read by the standard reader.
    n = struct.unpack('<Q', blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    names = [k for k in header if k != '__metadata__']
    check((8 + n) % 8 == 0, f'the data section starts 8-byte aligned ({8 + n} bytes of header)')
    check(names == sorted(names), 'the header lists the tensors sorted by name')
    check(all(isinstance(v, str) for v in header['__metadata__'].values()), '__metadata__ is string-valued only')
    tensors = dict(deserialize(blob))
    check(sorted(tensors) == sorted(names), f'{reader} reads all {len(names)} tensors')
    check(all(tensors[k]['dtype'] == header[k]['dtype'] and list(tensors[k]['shape']) == header[k]['shape']
              and bytes(tensors[k]['data']) == blob[8 + n + header[k]['data_offsets'][0]:8 + n + header[k]['data_offsets'][1]]
              for k in names), 'each tensor has the dtype, shape and bytes the header gives')

    # The weights written back by the standard writer (no kfsdp keys at all) load in kfsdp.
    weights = {k: {'dtype': t['dtype'], 'shape': list(t['shape']), 'data': bytes(t['data'])}
               for k, t in tensors.items() if not k.startswith('optimizer.')}
    with open(standard_file, 'wb') as out:
        out.write(serialize(weights, metadata=None))
    expected = eval_loss(run(2, '--load', kfsdp_file, '--eval', '4'))
    for ranks in (1, 3):
        out = run(ranks, '--load', standard_file, '--eval', '4')
        check(eval_loss(out) == expected,
              f'the standard file loads at {ranks} rank(s) with the eval loss of the original ({eval_loss(out)} vs {expected})')
        check('has no kfsdp checksums' in out, f'loading it at {ranks} rank(s) says that no checksum was present')

print(f'standard safetensors both ways: {len(failures)} checks failed')
sys.exit(1 if failures else 0)
