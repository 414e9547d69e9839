#!/usr/bin/env python3
"""Makes the tiny Llama-family fixtures that kfsdp's tests read (they need no torch), or checks
directories that kfsdp wrote.

    python3 test/model/families/make_fixture.py                 # writes the files below, beside this script
    python3 test/model/families/make_fixture.py --check DIR     # DIR/<family>/ as kfsdp saved them: from_pretrained

Each family is a config as its models publish it, scaled down (random weights, nothing downloaded):
  llama3.2/           LlamaForCausalLM as Llama 3.2 1B: rope_scaling llama3 (factor 32, low 1, high 4,
                      original_max_position_embeddings 128: the three bands of wavelength each hold a pair),
                      rope_theta 5e5, tied embeddings, GQA
  qwen2.5/            Qwen2ForCausalLM as Qwen2.5 0.5B: q/k/v biases (no key says so), tied, rope_theta 1e6,
                      use_sliding_window false, sliding_window and max_window_layers as published
  mistral/            MistralForCausalLM as Mistral 7B v0.3: head_dim 16 != hidden_size / heads = 8,
                      sliding_window null, rope_theta 1e6
  llama-linear-bias/  LlamaForCausalLM with rope_scaling linear (factor 4) and attention_bias (q, k, v, o)
each as config.json + model.safetensors (float32), and
  reference.safetensors
    <family>.logits.f32 [1, 32, 256] F32, <family>.logits.f64 F64   logits on window 0
    <family>.inv_freq.f32 [hd/2] F32                                 transformers' own RoPE frequencies
    <family>.inv_freq.f64 [hd/2] F64                                 the same formula in float64
    <family>.trained_loss.f64 [1] F64                                mean loss over windows 0, 1, 2 after one
                                                                     plain SGD step (lr 0.1) on them, float64
    __metadata__: the data file, seq, the versions of transformers and torch

Window 0: the first seq + 1 = 33 bytes of data/kjv-genesis-exodus.txt, inputs its first 32.
float64: transformers computes RMSNorm and RoPE (llama3's and linear's inv_freq included) in float32
even in a float64 model; the float64 models here compute both in float64 (exact_float64), with sdpa
attention, so that a float64 implementation compares to 1e-10. Float32 is transformers' as is.
"""

import argparse
import json
import math
import os
import sys
import types

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DATA = "data/kjv-genesis-exodus.txt"
SEQ = 32
SEED = 20261207
TRAIN_WINDOWS = [0, 1, 2]
TRAIN_LR = 0.1
COMMON = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=512,
              hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)


def configs():
    return {
        "llama3.2": LlamaConfig(**COMMON, num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
                                tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 128,
                                              "rope_theta": 500000.0}),
        "qwen2.5": Qwen2Config(**COMMON, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                               tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False,
                               sliding_window=512, max_window_layers=2),
        "mistral": MistralConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                                 tie_word_embeddings=False, rope_theta=1000000.0, sliding_window=None),
        "llama-linear-bias": LlamaConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                                         tie_word_embeddings=False, attention_bias=True, mlp_bias=False,
                                         rope_scaling={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    }


def inv_freq(config, dtype):
    """RoPE's inverse frequencies as transformers' _compute_{default,linear_scaling,llama3}_parameters make
    them, in `dtype` (transformers: float32)."""
    rope = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    base = rope["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim))
    if rope["rope_type"] == "linear":
        inv /= rope["factor"]
    elif rope["rope_type"] == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_context_len = rope["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
        wavelen = 2 * math.pi / inv
        inv_llama = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
        smooth = (old_context_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv = torch.where(medium, smoothed, inv_llama)
    else:
        assert rope["rope_type"] == "default", rope
    return inv


def exact_float64(model):
    """The model's RMSNorms and rotary embedding computed in float64 (transformers' are in float32)."""
    inv = inv_freq(model.config, torch.float64)

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    assert model.config._attn_implementation == "sdpa"  # eager attention would take the softmax in float32
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_norm, module)
        elif name.endswith("RotaryEmbedding"):
            assert module.attention_scaling == 1.0
            module.forward = types.MethodType(rotary, module)
    return model


def windows(indices):
    """Inputs and targets [len(indices), SEQ] of the windows of SEQ + 1 bytes (kfsdp's text_windows)."""
    with open(os.path.join(ROOT, DATA), "rb") as f:
        text = f.read()
    x = torch.tensor([list(text[w * (SEQ + 1):(w + 1) * (SEQ + 1)]) for w in indices], dtype=torch.long)
    return x[:, :SEQ], x[:, 1:]


def window0():
    return windows([0])[0]


def loss_of(model, indices):
    inputs, targets = windows(indices)
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def trained_loss(model):
    """The mean loss over TRAIN_WINDOWS after one plain SGD step (lr TRAIN_LR) on them: wrong gradients
    (a bias's, the scaled RoPE's) show here."""
    model.train()
    model.zero_grad()
    loss_of(model, TRAIN_WINDOWS).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= TRAIN_LR * p.grad
        model.eval()
        return loss_of(model, TRAIN_WINDOWS)


def make_model(config):
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).to(torch.float64)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith(".bias"):
                value = 0.2 * noise  # large enough that a missing or misplaced bias shows
            elif name.endswith("embed_tokens.weight"):
                value = 0.07 * noise  # tied or not, logits of a unit or so: float32's rounding stays well under 2e-6
            elif name == "lm_head.weight":
                value = 0.35 * noise / math.sqrt(p.shape[1])
            else:  # a linear [out, in]
                value = noise / math.sqrt(p.shape[1])
            p.copy_(value.to(torch.float32).to(torch.float64))
    model.eval()
    return model


def logits_of(model):
    with torch.no_grad():
        return model(input_ids=window0()).logits


def make():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the same bytes on every run
    tensors, report = {}, {}
    for family, config in configs().items():
        model = make_model(config).to(torch.float32)
        model.save_pretrained(os.path.join(HERE, family))
        ours = inv_freq(model.config, torch.float32)
        theirs = model.model.rotary_emb.inv_freq.to(torch.float32)
        assert torch.equal(ours, theirs), (family, ours, theirs)  # the float64 formula is transformers' own
        tensors[family + ".inv_freq.f32"] = theirs.contiguous()
        tensors[family + ".inv_freq.f64"] = inv_freq(model.config, torch.float64).contiguous()
        tensors[family + ".logits.f32"] = logits_of(model).contiguous()
        f64 = exact_float64(make_model(config))
        tensors[family + ".logits.f64"] = logits_of(f64).contiguous()
        tensors[family + ".trained_loss.f64"] = trained_loss(f64).reshape(1)
        report[family] = {"max |logit|": tensors[family + ".logits.f64"].abs().max().item(),
                          "f32 - f64": (tensors[family + ".logits.f32"].double() - tensors[family + ".logits.f64"]).abs().max().item()}
    metadata = {"data": DATA, "seq": str(SEQ), "logit_windows": "0", "train_windows": ",".join(map(str, TRAIN_WINDOWS)),
                "train_lr": repr(TRAIN_LR), "transformers": transformers.__version__, "torch": torch.__version__}
    save_file(tensors, os.path.join(HERE, "reference.safetensors"), metadata=metadata)
    print(json.dumps({**report, **metadata}, indent=1))


def check(directory):
    """Each DIR/<family>/ that kfsdp saved, loaded by from_pretrained (its architecture from its config),
    gives kfsdp's logits (DIR/<family>.kfsdp-logits.safetensors, else the reference's): float64 (patched)
    to 1e-10, float32 as transformers computes it to 2e-6."""
    from safetensors.torch import load_file
    reference = load_file(os.path.join(HERE, "reference.safetensors"))
    failed = 0
    for family in configs():
        path = os.path.join(directory, family)
        theirs = os.path.join(directory, family + ".kfsdp-logits.safetensors")
        want = load_file(theirs)["logits"] if os.path.exists(theirs) else reference[family + ".logits.f64"]
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, output_loading_info=True)
        missing, unexpected = info["missing_keys"], info["unexpected_keys"]
        f64 = (logits_of(exact_float64(model.eval())) - want).abs().max().item()
        f32_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        f32 = (logits_of(f32_model).double() - want).abs().max().item()
        ok = not missing and not unexpected and f64 <= 1e-10 and f32 <= 2e-6
        failed += not ok
        print(f"{path}: {type(model).__name__}, missing {list(missing)}, unexpected {list(unexpected)}; logits within "
              f"{f64:.3g} (float64, limit 1e-10), {f32:.3g} (float32, limit 2e-6) of "
              f"{'kfsdp' if os.path.exists(theirs) else 'the reference'}'s: {'ok' if ok else 'FAILED'}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="DIR", help="load DIR/<family>/ with from_pretrained and compare its logits")
    args = parser.parse_args()
    sys.exit(check(args.check) if args.check else make())
