#!/usr/bin/env python3
"""A small heat surrogate (width 2, depth 1) as kfsdp's installed model library (libheat_surrogate)
reads it: its tensors in F64 and the metadata train_surrogate --save writes (the sizes and the
normalisation statistics). Prints the predictions for the two rows of inputs that main.c and
main.f90 pass, to 17 digits, computed here the way the predictor does (normalised inputs, input
layer, gelu, x + gelu(fc(x)), output layer, mapped back).
usage: make_model.py MODEL.safetensors"""
import json
import math
import struct
import sys

width, features = 2, 6
tensors = {  # name: (shape, row-major values); a linear layer's weight is [out, in]
    'input.weight': ([width, features], [0.1 * (i % 7) - 0.3 for i in range(width * features)]),
    'input.bias': ([width], [0.05, -0.1]),
    'hidden.0.fc.weight': ([width, width], [0.5, -0.25, 0.75, 0.2]),
    'hidden.0.fc.bias': ([width], [0.01, 0.02]),
    'output.weight': ([1, width], [1.5, -0.5]),
    'output.bias': ([1], [0.25]),
}
mean, stddev = [0.5] * features, [0.25 + 0.05 * c for c in range(features)]
target_mean, target_stddev = 0.1, 0.02
metadata = {
    'surrogate.width': str(width), 'surrogate.depth': '1',
    'normalization.features.mean': ','.join(repr(v) for v in mean),
    'normalization.features.stddev': ','.join(repr(v) for v in stddev),
    'normalization.targets.mean': repr(target_mean),
    'normalization.targets.stddev': repr(target_stddev),
}

header, data = {'__metadata__': metadata}, b''
for name, (shape, values) in tensors.items():
    header[name] = {'dtype': 'F64', 'shape': shape, 'data_offsets': [len(data), len(data) + 8 * len(values)]}
    data += struct.pack(f'<{len(values)}d', *values)
text = json.dumps(header).encode()
text += b' ' * (-len(text) % 8)  # the data 8-byte aligned, as safetensors writers pad
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text + data)


def linear(name, x):
    (rows, cols), w = tensors[name + '.weight']
    b = tensors[name + '.bias'][1]
    return [sum(w[r * cols + c] * x[c] for c in range(cols)) + b[r] for r in range(rows)]


def gelu(v):
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


for row in range(2):  # the inputs main.c and main.f90 pass: x[row][c] = 0.1 (c + 1) + 0.3 row
    x = [(0.1 * (c + 1) + 0.3 * row - mean[c]) / stddev[c] for c in range(features)]
    h = [gelu(v) for v in linear('input', x)]
    h = [a + gelu(v) for a, v in zip(h, linear('hidden.0.fc', h))]
    print(f'{linear("output", h)[0] * target_stddev + target_mean:.17g}')
