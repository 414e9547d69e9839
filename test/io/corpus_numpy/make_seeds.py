#!/usr/bin/env python3
"""Writes the regression seeds of fuzz_numpy (test/io/fuzz_numpy.cpp) and test_numpy.cpp: .npy and .npz files that once
crashed kfsdp's reader or threw something other than std::invalid_argument (the standard library only:
run from this folder). numpy's own files are the other seeds (test/io/numpy/)."""
import struct


def npy(header, data=b'', version=1):
    text = header.encode('latin-1')
    length = struct.pack('<H', len(text)) if version == 1 else struct.pack('<I', len(text))
    return b'\x93NUMPY' + bytes([version, 0]) + length + text + data


def local_header(name):
    return struct.pack('<IHHHHHIIIHH', 0x04034b50, 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name


def central_entry(name, offset, size=0, extra=b''):
    return struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 20, 20, 0, 0, 0, 0, 0, size, size, len(name), len(extra),
                       0, 0, 0, 0, offset) + name + extra


def end_record(entries, directory_size, directory):
    return struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, entries, entries, directory_size, directory, 0)


def zip64_end(entries, directory, at):
    record = struct.pack('<IQHHIIQQQQ', 0x06064b50, 44, 45, 45, 0, 0, entries, entries, 0, directory)
    locator = struct.pack('<IIQI', 0x07064b50, 0, at, 1)
    return record + locator + end_record(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


seeds = {
    # A version 2 header length is 4 bytes: a 10-byte file was read 2 bytes past its end.
    'npy_v2_cut_short.npy': b'\x93NUMPY\x02\x00\x10\x00',
    # An empty 'descr' or 'shape' value threw std::out_of_range from string_view::substr.
    'npy_empty_descr.npy': npy("{'descr':, 'fortran_order': False, 'shape': (2,), }"),
    'npy_shape_not_a_tuple.npy': npy("{'descr': '<f8', 'fortran_order': False, 'shape':, }"),
    # The shape's product wrapped: 3074457345618258603 * 6 = 2 (mod 2^64) elements over 16 bytes were accepted
    # (and read out of bounds in Fortran order); 2^64 + 1 was read as 1.
    'npy_shape_product_wraps.npy': npy("{'descr': '<f8', 'fortran_order': True, 'shape': (3074457345618258603, 6), }",
                                       b'\0' * 16),
    'npy_extent_past_2_64.npy': npy("{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551617, 6), }",
                                    b'\0' * 48),
    # The zip64 end record's offset near 2^64: offset + 56 wrapped and passed the bounds check.
    'zip64_record_offset_wraps.npz': b'\0' * 64 + struct.pack('<IIQI', 0x07064b50, 0, 2**64 - 8, 1) +
                                     end_record(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
    # The central directory's offset (zip64) near 2^64: offset + 46 wrapped.
    'zip64_directory_offset_wraps.npz': zip64_end(1, 2**64 - 10, 0),
    # A zip64 extra field at the archive's end shorter than the 8-byte size it stands for.
    'zip64_extra_past_end.npz': end_record(1, 54, 22) +
                                central_entry(b'x.npy', 0, 0xFFFFFFFF, struct.pack('<HH', 1, 16)),
}
# A member's offset (zip64 extra) near 2^64: offset + 30 wrapped past the local header check.
directory = central_entry(b'x.npy', 0xFFFFFFFF, 0, struct.pack('<HHQ', 1, 8, 2**64 - 16))
seeds['zip64_member_offset_wraps.npz'] = b'\0' * 32 + directory + end_record(1, len(directory), 32)
# A member's size (zip64 extra) near 2^64 (not 2^64 - 1, span's dynamic_extent): data + size wrapped, and the
# .npy inside was read as if that long.
member = local_header(b'x.npy') + npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000,), }")
directory = central_entry(b'x.npy', 0, 0xFFFFFFFF, struct.pack('<HHQQ', 1, 16, 2**64 - 2, 2**64 - 2))
seeds['zip64_member_size_wraps.npz'] = member + directory + end_record(1, len(directory), len(member))

for name, data in seeds.items():
    with open(name, 'wb') as out:
        out.write(data)
