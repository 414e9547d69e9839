#!/usr/bin/env python3
"""kfsdp's LoRA files that peft and transformers load: test_train_lora_llama_mpi at 2 ranks saves peft's adapter
(test/model/lora) as it loaded it, and its merge (KFSDP_LORA_SAVE_TO); make_fixture.py --check loads the adapter
with PeftModel.from_pretrained and the merge with LlamaForCausalLM.from_pretrained and compares their logits
with kfsdp's, and the adapter's config and tensors with peft's. Exits 77 (skipped) where torch, transformers or
peft does not import.
usage: test_lora_from_pretrained.py LORA_TEST MAKE_FIXTURE MPIRUN [MPIRUN_ARGS...]"""
import importlib.util, os, subprocess, sys, tempfile

lora_test, make_fixture, mpirun = sys.argv[1], sys.argv[2], sys.argv[3:]
if any(importlib.util.find_spec(m) is None for m in ('torch', 'transformers', 'peft')):
    print('torch, transformers or peft is not installed: PeftModel.from_pretrained cannot be checked here')
    sys.exit(77)
with tempfile.TemporaryDirectory(prefix='kfsdp-lora-') as saved:
    env = dict(os.environ, KFSDP_LORA_SAVE_TO=saved)
    run = subprocess.run(mpirun + ['-np', '2', lora_test, '--test-case=peft*'], env=env, capture_output=True, text=True,
                         timeout=600)
    if run.returncode != 0:
        sys.exit(f'{lora_test} at 2 ranks exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}')
    sys.exit(subprocess.run([sys.executable, make_fixture, '--check', saved], timeout=600).returncode)
