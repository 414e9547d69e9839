#!/usr/bin/env python3
"""A save from kfsdp that transformers loads: test_train_llama_families_mpi at 2 ranks saves each family of
test/model/families (KFSDP_FAMILIES_SAVE_TO), then make_fixture.py --check loads each with from_pretrained
(LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM from the config kfsdp wrote) and compares its
logits with the reference. Exits 77 (skipped) where torch or transformers does not import.
usage: test_families_from_pretrained.py FAMILIES_TEST MAKE_FIXTURE MPIRUN [MPIRUN_ARGS...]"""
import importlib.util, os, subprocess, sys, tempfile

families_test, make_fixture, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
if importlib.util.find_spec('torch') is None or importlib.util.find_spec('transformers') is None:
    print('torch or transformers is not installed: from_pretrained cannot be checked here')
    sys.exit(77)
with tempfile.TemporaryDirectory(prefix='kfsdp-families-') as saved:
    env = dict(os.environ, KFSDP_FAMILIES_SAVE_TO=saved)
    run = subprocess.run(mpirun + ['-np', '2', families_test], env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        sys.exit(f'{families_test} at 2 ranks exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}')
    sys.exit(subprocess.run([sys.executable, make_fixture, '--check', saved], timeout=600).returncode)
