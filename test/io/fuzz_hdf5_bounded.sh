#!/bin/sh
# io_fuzz_hdf5_bounded: 10 s of fuzz_hdf5 in all (FUZZ_SECONDS). Debian's libhdf5 is not instrumented and
# crashes on some broken files by itself; a crash whose first frame in libhdf5 or kfsdp is a libhdf5
# function that fuzz_hdf5_known.txt lists is reported, skipped, and fuzzing goes on from the inputs found
# so far (at most 50 runs of libFuzzer).
# Any other crash fails the test and keeps the work directory (its path is printed) for the reproducer.
#   [FUZZ_SECONDS=10] fuzz_hdf5_bounded.sh <fuzz_hdf5> <fuzz_hdf5_known.txt> <corpus dir or flag>...
fuzzer=$1 known=$2
shift 2
work=$(mktemp -d)
mkdir "$work/found"
end=$(($(date +%s) + ${FUZZ_SECONDS:-10}))
runs=0
while now=$(date +%s) && [ "$now" -lt "$end" ] && [ "$runs" -lt 50 ]; do
  runs=$((runs + 1))
  rm -f "$work"/crash-* "$work"/oom-* "$work"/leak-* "$work"/timeout-*
  if "$fuzzer" "$work/found" "$@" -max_total_time=$((end - now)) -artifact_prefix="$work/" -print_final_stats=1 \
       > "$work/log" 2>&1; then
    tail -n 12 "$work/log"
    rm -rf "$work"
    exit 0
  fi
  # The crash's first frame in libhdf5, kfsdp's headers or the target (not the sanitizer's interceptors).
  frame=$(grep -E '^ +#[0-9]+ 0x[0-9a-f]+ in ' "$work/log" | grep -m 1 -E 'libhdf5|/include/kfsdp/|fuzz_hdf5\.cpp')
  function=$(printf '%s\n' "$frame" | sed -E 's/.* in ([^ ]+) .*/\1/')
  if printf '%s\n' "$frame" | grep -q libhdf5 && grep -v '^#' "$known" | cut -d ' ' -f 1 | grep -qx -- "$function"; then
    echo "skipped a known libhdf5 crash in $function ($(grep -m 1 -E 'ERROR|runtime error' "$work/log"))"
    continue
  fi
  cat "$work/log"
  echo "fuzzing failed; inputs and crash in $work"
  exit 1
done
tail -n 12 "$work/log"
echo "fuzzed in $runs runs of libFuzzer, each but the last ended by a known libhdf5 crash"
rm -rf "$work"
