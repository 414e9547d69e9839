#!/usr/bin/env python3
"""Writes the numpy files test_numpy.cpp reads, with numpy itself (pip install numpy; the test
needs only the files, committed beside this script): run from this folder."""
import numpy as np

x = (np.arange(30, dtype=np.float64).reshape(10, 3) / 7).astype(np.float32)
y = np.sin(np.arange(10, dtype=np.float64))
np.savez('data.npz', x=x, y=y, ids=np.arange(10, dtype=np.int64), y2=np.stack([y, -y], axis=1))
np.savez('short.npz', x=x, y=y[:9])
np.savez_compressed('compressed.npz', x=x, y=y)
np.save('fortran.npy', np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)))
np.save('big_endian.npy', (np.arange(6) - 2.5).astype('>f4').reshape(2, 3))
np.save('half.npy', np.array([1.0, -0.5, 65504.0], dtype=np.float16))
np.save('cube.npy', np.zeros((2, 2, 2), dtype='<u2'))
np.save('strings.npy', np.array(['a', 'b']))
