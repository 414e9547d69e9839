#!/usr/bin/env python3
"""Makes the LoRA fixture that kfsdp's tests read (they need no torch), or checks what kfsdp wrote.

    python3 test/model/lora/make_fixture.py                          # writes the files below, beside this script
    python3 test/model/lora/make_fixture.py --check DIR              # DIR/adapter, DIR/merged as kfsdp saved them

Written (peft's save_pretrained, nothing downloaded):
  peft-adapter/   adapter_config.json + adapter_model.safetensors: peft's LoRA on the tiny Qwen2 of
                  test/model/families/qwen2.5 (q, k and v with biases; r 4, lora_alpha 8, target_modules
                  q_proj, v_proj, o_proj, down_proj: adapters beside biases and without), A and B drawn
                  from a seeded generator (B is not zero, so the adapter matters)
  reference.safetensors
    logits.f32 [1, 32, 256] F32   PeftModel's logits on window 0 of data/kjv-genesis-exodus.txt
                                  (bytes [0, 32), as test/model/families uses it)
    logits.f64 [1, 32, 256] F64   the same in float64 (the float32 weights, exact in float64), RMSNorm
                                  and RoPE in float64 (test/model/families/make_fixture.py's
                                  exact_float64), so that a float64 implementation compares to 1e-10
    __metadata__: the versions of peft, transformers and torch

--check loads DIR/adapter with PeftModel.from_pretrained onto qwen2.5 and DIR/merged with
AutoModelForCausalLM.from_pretrained, and compares each one's logits on window 0 with the logits of
DIR/reference.safetensors (kfsdp's, "logits.f32"); it also compares DIR/adapter's config and
tensors (names and shapes) with peft-adapter's. Exits 1 on a difference, 77 where torch, transformers
or peft does not import.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
BASE = os.path.join(ROOT, "test", "model", "families", "qwen2.5")
DATA = os.path.join(ROOT, "data", "kjv-genesis-exodus.txt")
SEQ = 32
SEED = 20261207
RANK, ALPHA, TARGETS = 4, 8, ["q_proj", "v_proj", "o_proj", "down_proj"]

try:
    import torch
    import transformers
    import peft
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
except ImportError as missing:
    print(f"{missing}: the LoRA fixture cannot be made or checked here")
    sys.exit(77)
sys.path.insert(0, os.path.join(ROOT, "test", "model", "families"))
from make_fixture import exact_float64  # noqa: E402  (the families' float64 patches)


def window0():
    with open(DATA, "rb") as f:
        data = f.read(SEQ)
    return torch.tensor([list(data)], dtype=torch.long)


def logits_of(model):
    model.eval()
    with torch.no_grad():
        return model(window0()).logits


def make():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the same bytes on every run
    os.chdir(ROOT)  # the adapter names its base as a path relative to the repository's root
    base = AutoModelForCausalLM.from_pretrained(os.path.relpath(BASE, ROOT), dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_((torch.rand(param.shape, generator=generator) - 0.5) * 0.1)
    model.save_pretrained(os.path.join(HERE, "peft-adapter"))
    os.remove(os.path.join(HERE, "peft-adapter", "README.md"))  # peft's model card template: nothing the tests read
    logits = logits_of(model)
    base64 = exact_float64(AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float64, attn_implementation="sdpa"))
    logits64 = logits_of(peft.PeftModel.from_pretrained(base64, os.path.join(HERE, "peft-adapter")))
    assert logits64.dtype == torch.float64
    save_file({"logits.f32": logits.contiguous(), "logits.f64": logits64.contiguous()}, os.path.join(HERE, "reference.safetensors"),
              metadata={"peft": peft.__version__, "transformers": transformers.__version__, "torch": torch.__version__})
    print("wrote peft-adapter/ and reference.safetensors; logits", tuple(logits.shape))


def check(directory):
    want = load_file(os.path.join(directory, "reference.safetensors"))["logits.f32"]
    failures = []
    # The adapter kfsdp saved, against peft's own: config and tensors.
    with open(os.path.join(directory, "adapter", "adapter_config.json")) as f:
        mine = json.load(f)
    with open(os.path.join(HERE, "peft-adapter", "adapter_config.json")) as f:
        theirs = json.load(f)
    for key in ["peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias", "use_rslora", "use_dora",
                "fan_in_fan_out"]:
        if mine.get(key) != theirs.get(key):
            failures.append(f"adapter_config.json {key}: {mine.get(key)!r}, peft's {theirs.get(key)!r}")
    if sorted(mine["target_modules"]) != sorted(theirs["target_modules"]):
        failures.append(f"target_modules {mine['target_modules']}, peft's {theirs['target_modules']}")
    mine_t = load_file(os.path.join(directory, "adapter", "adapter_model.safetensors"))
    theirs_t = load_file(os.path.join(HERE, "peft-adapter", "adapter_model.safetensors"))
    shapes = lambda d: {k: tuple(v.shape) for k, v in d.items()}
    if shapes(mine_t) != shapes(theirs_t):
        failures.append(f"adapter tensors differ: {sorted(set(shapes(mine_t).items()) ^ set(shapes(theirs_t).items()))}")
    # PeftModel on transformers' base, and the merged directory alone.
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, os.path.join(directory, "adapter"))
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(directory, "merged"), dtype=torch.float32)
    for label, model in [("PeftModel.from_pretrained", adapted), ("merged from_pretrained", merged)]:
        error = (logits_of(model).float() - want).abs().max().item()
        print(f"{label}: logits within {error:.3g} of kfsdp's")
        if error > 2e-6:
            failures.append(f"{label}: logits differ by {error:.3g}, expected at most 2e-6")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="DIR", help="check DIR/adapter and DIR/merged, as kfsdp saved them")
    arguments = parser.parse_args()
    sys.exit(check(arguments.check) if arguments.check else make())
