#!/usr/bin/env python3
"""Writes the HDF5 file test_hdf5_mpi.cpp reads, with h5py itself (pip install h5py numpy; the test
needs only the file, committed beside this script): run from this folder."""
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
