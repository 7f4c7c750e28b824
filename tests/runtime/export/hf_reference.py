#!/usr/bin/python3
"""An independent forward pass over an edit-export output.

Builds a Llama from config.json alone, following Hugging Face transformers'
LlamaForCausalLM conventions (modeling_llama: RMSNorm with the weight applied after the
normalization, RoPE with rotate_half on the two halves of each head and
inv_freq = 1 / theta^(2i/d) computed in float32, causal softmax attention scaled by
1/sqrt(head_dim), SwiGLU MLP down(silu(gate(x)) * up(x)), untied lm_head), loads
model.safetensors with a small reader of its own, and compares its logits with the ones
edit-export --dump-logits computed with the project's model code.

Nothing here comes from the project's code: no shared module, no parameter layout.
Needs only PyTorch (Debian's python3-torch).

  hf_reference.py --model DIR --logits FILE [--tol 1e-4]
Prints one JSON line; exits 0 when the logits agree within --tol, 1 otherwise.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    """safetensors: u64 LE header length, JSON header, raw little-endian tensors."""
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        flat = (torch.frombuffer(raw, dtype=DTYPES[e["dtype"]]) if raw
                else torch.empty(0, dtype=DTYPES[e["dtype"]]))
        tensors[name] = flat.reshape(e["shape"])
    return tensors, meta


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    def __init__(self, config, weights):
        self.c = config
        self.w = {k: v.to(torch.float32) for k, v in weights.items()}
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.theta = config.get("rope_theta", 10000.0)
        assert not config.get("tie_word_embeddings", False) or "lm_head.weight" not in weights

    def linear(self, x, name):
        return x @ self.w[name].t()

    def forward(self, tokens):
        B, T = tokens.shape
        H, KV, hd = self.heads, self.kv_heads, self.head_dim
        x = self.w["model.embed_tokens.weight"][tokens]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, T, hd]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for layer in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = self.linear(h, p + "self_attn.q_proj.weight").view(B, T, H, hd).transpose(1, 2)
            k = self.linear(h, p + "self_attn.k_proj.weight").view(B, T, KV, hd).transpose(1, 2)
            v = self.linear(h, p + "self_attn.v_proj.weight").view(B, T, KV, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd) + mask
            attn = torch.softmax(scores.float(), dim=-1) @ v
            attn = attn.transpose(1, 2).reshape(B, T, H * hd)
            x = x + self.linear(attn, p + "self_attn.o_proj.weight")
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate = torch.nn.functional.silu(self.linear(h, p + "mlp.gate_proj.weight"))
            x = x + self.linear(gate * self.linear(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")
        x = rms_norm(x, self.w["model.norm.weight"], self.eps)
        head = "lm_head.weight" if "lm_head.weight" in self.w else "model.embed_tokens.weight"
        return x @ self.w[head].t()


def expected_names(c):
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(c["num_hidden_layers"]):
        for n in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                  "mlp.down_proj"):
            names.add(f"model.layers.{layer}.{n}.weight")
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    config = json.load(open(os.path.join(a.model, "config.json")))
    weights, meta = load_safetensors(os.path.join(a.model, "model.safetensors"))
    problems = []
    if meta.get("format") != "pt":
        problems.append("__metadata__.format is not 'pt' (transformers refuses the file)")
    if set(weights) != expected_names(config):
        problems.append(f"tensor names differ from LlamaForCausalLM's: {sorted(set(weights) ^ expected_names(config))}")
    ref, _ = load_safetensors(a.logits)
    with torch.no_grad():
        ours = Llama(config, weights).forward(ref["tokens"])
    diff = (ours - ref["logits"]).abs().max().item()
    loss = torch.nn.functional.cross_entropy(ours.reshape(-1, ours.shape[-1]), ref["targets"].reshape(-1)).item()
    out = {"max_abs_diff": diff, "tol": a.tol, "loss_reference": loss, "loss_project": ref["loss"].item(),
           "dtypes": sorted({str(w.dtype) for w in weights.values()}),
           "shape": list(ours.shape), "problems": problems}
    print(json.dumps(out))
    if not math.isfinite(diff) or diff > a.tol or problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
