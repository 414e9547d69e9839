#!/usr/bin/env python3
"""Makes the tiny Llama fixture that kfsdp's tests read (they need no torch), or checks a directory
that kfsdp wrote.

    python3 test/model/llama/make_fixture.py                      # writes the files below, beside this script
    python3 test/model/llama/make_fixture.py --check DIR --expect LOSS [--windows 4] [--rtol 1e-6]

Written (transformers' save_pretrained, safetensors, nothing downloaded):
  tiny-f32/          config.json + model.safetensors, float32, one file
  tiny-f64-sharded/  config.json + model.safetensors.index.json + model-0000N-of-0000M.safetensors,
                     float64, the same weights (every f32 value is exact in f64)
  reference.safetensors
    logits.f32 [1, 64, 256] F32, logits.f64 [1, 64, 256] F64   transformers' logits on window 0
    loss.f32 [1] F32, loss.f64 [1] F64                         mean cross-entropy over windows 0..3
    trained.<parameter> F64                                    every parameter of the f64 model after
                                                               3 plain SGD steps (see below)
    __metadata__: the data file, seq, windows, lr and the versions of transformers and torch

The model: LlamaForCausalLM, vocab 256 (bytes), hidden 64, intermediate 176, 2 layers, 4 heads,
2 key/value heads (GQA), max_position_embeddings 64, rope_theta 5000 (not the default, so a reader
that ignores it fails), rms_norm_eps 1e-6, untied embeddings. Weights drawn from a seeded
generator (norm weights around 1, so they matter), rounded to float32.

Windows, as kfsdp's text_windows forms them: the bytes of data/kjv-genesis-exodus.txt cut into
non-overlapping windows of seq + 1 = 65 bytes from offset 0; window w is bytes [65 w, 65 w + 65),
inputs its first 64 bytes, targets its last 64. The loss is the mean cross-entropy over every
target of the batch.

float64 throughout: transformers computes RMSNorm and RoPE's angles in float32 even in a float64 model
(LlamaRMSNorm casts to float32, LlamaRotaryEmbedding takes .float()), which leaves ~1e-6 in the logits;
the float64 models here compute both in float64 (exact_float64), with sdpa attention (softmax in the
model's dtype), so that a float64 implementation compares to 1e-10. Float32 is transformers' as is.

Training: 3 steps of plain SGD (no momentum, no weight decay), lr 0.1, in float64; step s takes
windows 3s, 3s+1, 3s+2 (kfsdp's sequential sampling with batch 3), the loss their mean.
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
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
DATA = "data/kjv-genesis-exodus.txt"
SEQ = 64
LOGIT_WINDOWS = [0]
LOSS_WINDOWS = [0, 1, 2, 3]
TRAIN_STEPS = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
LR = 0.1
SEED = 20261206


def config():
    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                       rope_theta=5000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
                       attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)


def windows(indices, seq=SEQ):
    """Inputs and targets [len(indices), seq] of the given windows (of seq + 1 bytes)."""
    with open(os.path.join(ROOT, DATA), "rb") as f:
        text = f.read()
    rows = [list(text[w * (seq + 1):(w + 1) * (seq + 1)]) for w in indices]
    x = torch.tensor(rows, dtype=torch.long)
    return x[:, :seq], x[:, 1:]


def loss_of(model, indices, seq=SEQ):
    inputs, targets = windows(indices, seq)
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits


def exact_float64(model):
    """The model's RMSNorms and rotary embedding computed in float64 (transformers' are in float32)."""
    # the model's own theta (transformers 5 keeps it in rope_parameters, 4 in rope_theta)
    rope = getattr(model.config, "rope_parameters", None)
    theta = rope["rope_theta"] if rope else model.config.rope_theta

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        head_dim = 2 * self.inv_freq.shape[0]
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    assert model.config._attn_implementation == "sdpa"  # eager attention would take the softmax in float32
    for module in model.modules():
        if isinstance(module, LlamaRMSNorm):
            module.forward = types.MethodType(rms_norm, module)
        elif isinstance(module, LlamaRotaryEmbedding):
            module.forward = types.MethodType(rotary, module)
    return model


def make_model(dtype):
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config()).to(torch.float64)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("embed_tokens.weight"):
                value = noise
            else:  # a linear [out, in]
                value = noise / math.sqrt(p.shape[1])
            p.copy_(value.to(torch.float32).to(torch.float64))
    model = model.to(dtype)
    model.eval()
    return exact_float64(model) if dtype == torch.float64 else model


def make():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the same bytes on every run
    f32, f64 = make_model(torch.float32), make_model(torch.float64)
    f32.save_pretrained(os.path.join(HERE, "tiny-f32"))
    f64.save_pretrained(os.path.join(HERE, "tiny-f64-sharded"), max_shard_size="400KB")

    tensors = {}
    with torch.no_grad():
        for name, model, dtype in (("f32", f32, torch.float32), ("f64", f64, torch.float64)):
            tensors["logits." + name] = loss_of(model, LOGIT_WINDOWS)[1].to(dtype).contiguous()
            tensors["loss." + name] = loss_of(model, LOSS_WINDOWS)[0].reshape(1).to(dtype)

    train = make_model(torch.float64)
    train.train()
    losses = []
    for step in TRAIN_STEPS:
        train.zero_grad()
        loss, _ = loss_of(train, step)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in train.parameters():
                p -= LR * p.grad
    for name, p in train.named_parameters():
        tensors["trained." + name] = p.detach().contiguous()

    metadata = {
        "data": DATA, "seq": str(SEQ),
        "logit_windows": ",".join(map(str, LOGIT_WINDOWS)),
        "loss_windows": ",".join(map(str, LOSS_WINDOWS)),
        "train_steps": ";".join(",".join(map(str, s)) for s in TRAIN_STEPS),
        "train_lr": repr(LR), "train_losses": ",".join(repr(x) for x in losses),
        "transformers": transformers.__version__, "torch": torch.__version__,
    }
    save_file(tensors, os.path.join(HERE, "reference.safetensors"), metadata=metadata)
    print(json.dumps({"loss.f32": tensors["loss.f32"].item(), "loss.f64": tensors["loss.f64"].item(),
                      **metadata}, indent=1))


def check(directory, expect, loss_windows, rtol, seq):
    model = exact_float64(LlamaForCausalLM.from_pretrained(directory, dtype=torch.float64))
    model.eval()
    seq = seq or model.config.max_position_embeddings
    with torch.no_grad():
        loss = loss_of(model, list(range(loss_windows)), seq)[0].item()
    error = abs(loss - expect) / abs(expect)
    print(f"{directory}: loss {loss:.12g} over windows 0..{loss_windows - 1} of {seq} bytes (float64), expected {expect:.12g}, "
          f"relative error {error:.3g} (tolerance {rtol:g}); transformers {transformers.__version__}, "
          f"torch {torch.__version__}")
    return 0 if error <= rtol else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="HF_DIR", help="load HF_DIR with from_pretrained and compare its loss")
    parser.add_argument("--expect", type=float, help="with --check: the loss kfsdp printed (eval_loss)")
    parser.add_argument("--windows", type=int, default=len(LOSS_WINDOWS), help="with --check: windows 0..W-1")
    parser.add_argument("--rtol", type=float, default=1e-6, help="with --check: relative tolerance")
    parser.add_argument("--seq", type=int, help="with --check: window length (default: max_position_embeddings)")
    args = parser.parse_args()
    if args.check:
        if args.expect is None:
            parser.error("--check needs --expect LOSS")
        sys.exit(check(args.check, args.expect, args.windows, args.rtol, args.seq))
    make()
