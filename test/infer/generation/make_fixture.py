#!/usr/bin/env python3
"""Makes the generation fixtures that kfsdp's tests read (they need no torch): a tiny Llama and
transformers' greedy tokens for it and for the Llama-family fixtures of test/model/families.

    python3 test/infer/generation/make_fixture.py      # writes the files below, beside this script

  tiny-llama/   LlamaForCausalLM, hidden 16, 2 layers, heads 2, kv_heads 1, vocabulary 256,
                max_position_embeddings 320, untied, float32 (random weights, nothing downloaded);
                generation_config.json's eos_token_id is a list of two ids that its greedy output
                never reaches, so 32 tokens come out
  greedy.json   {"prompt": ids, "max_new_tokens": 32, "models": {name: {"dir": the folder from the
                repository root, "greedy": transformers' generate(do_sample=False) new tokens,
                "eos": an id the greedy output reaches at step "eos_step" (0-based, its first
                occurrence), "greedy_eos": the new tokens when generate is given eos_token_id=eos,
                "min_gap": the smallest top-1 minus top-2 logit along the greedy path}}}

The float32 greedy tokens are checked equal to the float64 model's (exact_float64 from the families'
script), so that a float or double implementation that rounds differently still agrees.
"""

import json
import math
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "test", "model", "families"))
from make_fixture import exact_float64  # noqa: E402  (the families' float64 patch)

SEED = 20261214
PROMPT = list(b"In the beginning God")
MAX_NEW = 32
FAMILIES = ["llama3.2", "qwen2.5", "mistral", "llama-linear-bias"]


def tiny_config():
    return LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=320,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_tiny():
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(tiny_config()).to(torch.float64)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("embed_tokens.weight"):
                value = noise  # rows of norm ~4: the prompt's tokens matter
            else:  # a linear [out, in]; the head's logits a few units wide, so the greedy path has clear winners
                value = 1.5 * noise / math.sqrt(p.shape[1])
            p.copy_(value.to(torch.float32))
    return model.to(torch.float32).eval()


def greedy(model, eos=None):
    ids = torch.tensor([PROMPT], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    scores = torch.stack(out.scores)[:, 0].double()
    top = scores.topk(2, dim=-1).values
    return out.sequences[0, len(PROMPT):].tolist(), (top[:, 0] - top[:, 1]).min().item()


def reference(model_dir, model):
    tokens, gap = greedy(model)
    f64 = exact_float64(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa").eval())
    assert greedy(f64)[0] == tokens, (model_dir, "float32 and float64 greedy differ")
    step = MAX_NEW // 3
    eos = tokens[step]
    step = tokens.index(eos)
    with_eos, _ = greedy(model, eos)
    assert with_eos == tokens[:step + 1], (with_eos, tokens)
    return {"dir": os.path.relpath(model_dir, ROOT), "greedy": tokens, "eos": eos, "eos_step": step,
            "greedy_eos": with_eos, "min_gap": gap}


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    models = {}
    tiny_dir = os.path.join(HERE, "tiny-llama")
    tiny = make_tiny()
    tokens, _ = greedy(tiny)
    tiny.generation_config.eos_token_id = [t for t in range(255, 0, -1) if t not in tokens][:2]
    tiny.save_pretrained(tiny_dir)
    tiny = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # the directory's own generation_config (its eos list) gives all 32 tokens
        assert tiny.generate(torch.tensor([PROMPT]), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=0)[0, len(PROMPT):].tolist() == tokens
    models["tiny-llama"] = reference(tiny_dir, tiny)
    for family in FAMILIES:
        family_dir = os.path.join(ROOT, "test", "model", "families", family)
        models[family] = reference(family_dir, AutoModelForCausalLM.from_pretrained(family_dir, dtype=torch.float32).eval())
    result = {"prompt": PROMPT, "max_new_tokens": MAX_NEW, "transformers": transformers.__version__,
              "torch": torch.__version__, "models": models}
    with open(os.path.join(HERE, "greedy.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps({name: (m["min_gap"], len(set(m["greedy"]))) for name, m in models.items()}))


if __name__ == "__main__":
    main()
