#!/usr/bin/env python3
"""Writes the HDF5 files test_hdf5_mpi.cpp reads, with h5py itself (pip install h5py numpy; the test
needs only the files, committed beside this script): run from this folder. latest_filtered.h5 and
lzf.h5 were written by h5py 3.16 (HDF5 2.0.0); data.h5 comes out byte for byte the same."""
import math

import h5py
import numpy as np

x = (np.arange(30, dtype=np.float64).reshape(10, 3) / 7).astype(np.float32)
y = np.sin(np.arange(10, dtype=np.float64))
rng = np.random.default_rng(5)
train_x = rng.uniform(-1, 1, size=(60, 3))
train_y = np.sin(train_x[:, 0]) + train_x[:, 1] * train_x[:, 2]
# test/examples/test_train_surrogate.py's .npz samples, the same values (its formula, Python's sums).
n = 96
surrogate_x = [((i * 7 + j * 3) % 11) / 11 for i in range(n) for j in range(6)]
surrogate_u = [math.sin(sum(surrogate_x[6 * i:6 * i + 6])) for i in range(n)]
with h5py.File('data.h5', 'w', libver='earliest') as f:
    f['x'] = x
    f['y'] = y
    f['y2'] = np.stack([y, -y], axis=1)
    f['half'] = np.array([[1.0, -0.5, 65504.0]] * 10, dtype=np.float16)
    f['big_endian'] = (np.arange(20) - 2.5).astype('>f8').reshape(10, 2)
    f['ids'] = np.arange(10, dtype=np.int64)
    f['names'] = np.array([b'a'] * 10)
    f['cube'] = np.zeros((10, 2, 2))
    f['short'] = y[:9]
    f['train/x'] = train_x.astype(np.float32)  # a group's datasets: paths "train/x", "train/y"
    f['train/y'] = train_y
    f['surrogate/x'] = np.array(surrogate_x).reshape(n, 6)
    f['surrogate/u'] = np.array(surrogate_u)

# Files the reader refuses, naming the real cause (test_hdf5_mpi.cpp's "hdf5: a file HDF5 cannot decode or a
# filter it lacks"): h5py's newest format with a filter, whose layout message an older HDF5 (1.10) cannot
# decode; and an lzf-compressed dataset (lzf is h5py's own filter, not in the HDF5 library).
small = np.arange(12, dtype=np.float64).reshape(6, 2)
with h5py.File('latest_filtered.h5', 'w', libver='latest') as f:
    f.create_dataset('x', data=small, chunks=(3, 2), compression='gzip')
    f.create_dataset('y', data=small[:, 0], chunks=(3,), compression='gzip')
with h5py.File('lzf.h5', 'w', libver='earliest') as f:
    f.create_dataset('x', data=small, chunks=(3, 2), compression='lzf')
    f['y'] = small[:, 0]
