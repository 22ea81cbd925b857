"""The mini engine's model and workload (mini_engine.py runs them): not a check by itself.

A small transformer in PyTorch with deterministic weights over vLLM-shaped paged KV (per layer
one tensor [2, num_blocks, 16, kv_heads, head_dim]), computed so that a token's logits do not
depend on which chunk computed it or whether its prefix was loaded (a fixed-shape forward,
position mod chunk; a fixed attention window gathered from the cache, unused positions zeroed
and masked), and the workload: prompts sharing prefixes, repeats, fixed decode tokens.
"""

import dataclasses
import hashlib
import math
import random

import torch

BLOCK = 16
POISON = 3.0  # finite: a masked position times 0 must stay 0


@dataclasses.dataclass
class Geometry:
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    chunk: int  # the fixed forward shape: rows = positions mod chunk
    maxctx: int  # the fixed attention window gathered from the cache
    requests: int
    prefix_len: int
    suffix: tuple  # (min, max) own prompt tokens
    decode: int
    max_running: int
    prefill_per_step: int
    gpu_blocks: int  # per group, null block included
    window: int = 48
    layers: int = 4


GPU = Geometry(hidden=1024, q_heads=8, kv_heads=2, head_dim=128, mlp=2816, vocab=2048,
               chunk=64, maxctx=512, requests=14, prefix_len=128, suffix=(8, 96), decode=10,
               max_running=4, prefill_per_step=2, gpu_blocks=72)
GPU_QUICK = dataclasses.replace(GPU, requests=9, decode=6)
CPU = Geometry(hidden=64, q_heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256, chunk=32,
               maxctx=256, requests=12, prefix_len=64, suffix=(16, 96), decode=6,
               max_running=3, prefill_per_step=2, gpu_blocks=40)
HOST_FRACTION = 0.7  # the host cache holds this share of the workload's distinct blocks


def chain_hashes(tokens, n):
    out, h = [], b""
    for b in range(n):
        h = hashlib.blake2b(h + repr(tokens[b * BLOCK:(b + 1) * BLOCK]).encode(),
                            digest_size=16).digest()
        out.append(h)
    return out


def host_blocks_for(reqs, factor, groups):
    """HOST_FRACTION of the distinct host blocks the workload can store (so some are
    evicted), at least 8."""
    keys = set()
    obs = BLOCK * factor
    for _, toks, _ in reqs:
        h = chain_hashes(toks, len(toks) // BLOCK)
        keys.update(h[(i + 1) * factor - 1] for i in range(len(toks) // obs))
    return max(8, int(HOST_FRACTION * len(keys) * groups))


def workload(geo):
    """Prompts: one of three shared prefixes and an own suffix; every fifth request repeats an
    earlier prompt (a whole-prompt hit where it is block-aligned); fixed decode tokens."""
    rng = random.Random(20261204)
    v = geo.vocab
    prefixes = [[rng.randrange(1, v) for _ in range(geo.prefix_len)] for _ in range(3)]
    reqs, prompts = [], []
    for i in range(geo.requests):
        if i % 5 == 4:
            prompt = list(prompts[i - 4])
        elif i == 0:
            prompt = prefixes[0] + [rng.randrange(1, v) for _ in range(geo.prefix_len // 2)]
        else:
            n = rng.randrange(*geo.suffix)
            prompt = prefixes[i % 3] + [rng.randrange(1, v) for _ in range(n)]
        prompts.append(prompt)
        decode = [rng.randrange(1, v) for _ in range(geo.decode)]
        reqs.append((f"r{i}", prompt + decode, len(prompt)))
    return reqs


class Model:
    """Deterministic weights; per layer a paged KV tensor [2, blocks, 16, kv_heads, head_dim].
    Layer l belongs to group 0 (full attention) or, hybrid, group l % 2 (1: sliding window)."""

    def __init__(self, geo, dtype, device, hybrid, sleep_cycles):
        self.geo, self.dtype, self.device, self.hybrid = geo, dtype, device, hybrid
        self.groups = 2 if hybrid else 1
        self.sleep_cycles = sleep_cycles
        g = torch.Generator().manual_seed(1234)
        H, M, hd = geo.hidden, geo.mlp, geo.head_dim
        nq, nkv = geo.q_heads, geo.kv_heads

        def w(rows, cols, scale=None):
            scale = scale if scale is not None else 1.0 / math.sqrt(rows)
            return (torch.randn(rows, cols, generator=g) * scale).to(device=device, dtype=dtype)

        def norm():
            return (1.0 + 0.1 * torch.randn(H, generator=g)).to(device=device, dtype=dtype)

        self.embed = w(geo.vocab, H, 1.0)
        self.layers = [dict(n1=norm(), qkv=w(H, (nq + 2 * nkv) * hd), o=w(nq * hd, H),
                            n2=norm(), gate=w(H, M), up=w(H, M), down=w(M, H))
                       for _ in range(geo.layers)]
        self.nf, self.lm = norm(), w(H, geo.vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(geo.maxctx + geo.chunk, dtype=torch.float64), inv)
        self.cos = ang.cos().to(device=device, dtype=dtype)
        self.sin = ang.sin().to(device=device, dtype=dtype)
        self.kv = [torch.zeros(2, geo.gpu_blocks * self.groups, BLOCK, nkv, hd, dtype=dtype,
                               device=device) for _ in range(geo.layers)]
        self.kpos = torch.arange(geo.maxctx, device=device)
        self.rowpos = torch.arange(geo.chunk, device=device)
        self.masks = {}

    def group_of(self, layer):
        return layer % 2 if self.hybrid else 0

    def reset_cache(self):
        for t in self.kv:
            t.zero_()

    def poison(self, ids_dev, group):
        for layer, t in enumerate(self.kv):
            if self.group_of(layer) == group:
                t.index_fill_(1, ids_dev, POISON)

    def mask(self, ws, group):
        key = (ws, group)
        if key not in self.masks:
            q = (self.rowpos + ws)[:, None]
            m = self.kpos[None, :] <= q
            if group == 1:
                m &= self.kpos[None, :] > q - self.geo.window
            self.masks[key] = m
        return self.masks[key]

    @staticmethod
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def rope(self, x, ws):
        """x [C, heads, hd]; rotate halves by the position of each row (ws + row)."""
        c = self.cos[ws:ws + self.geo.chunk][:, None, :]
        s = self.sin[ws:ws + self.geo.chunk][:, None, :]
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)

    def forward(self, tokens_dev, ws, a, b, slots, los):
        """Positions [a, b) (inside the chunk [ws, ws + chunk)) of one request. slots: per
        group (write slots for [a, b), gather slots for [0, maxctx)) on the device; los: per
        group the first position attention may read. Returns logits [chunk, vocab]."""
        geo = self.geo
        C, nq, nkv, hd = geo.chunk, geo.q_heads, geo.kv_heads, geo.head_dim
        r0, r1 = a - ws, b - ws
        x = self.embed.index_select(0, tokens_dev[ws:ws + C])
        valid = [((self.kpos >= lo) & (self.kpos < b))[:, None, None] for lo in los]
        for layer, p in enumerate(self.layers):
            g = self.group_of(layer)
            if self.sleep_cycles:
                torch.cuda._sleep(self.sleep_cycles)  # the rest of a real layer's work
            h = self.rms(x, p["n1"]) @ p["qkv"]
            q = h[:, : nq * hd].view(C, nq, hd)
            k = h[:, nq * hd: (nq + nkv) * hd].view(C, nkv, hd)
            v = h[:, (nq + nkv) * hd:].reshape(C, nkv, hd)
            q, k = self.rope(q, ws), self.rope(k, ws)
            kf = self.kv[layer][0].view(-1, nkv, hd)
            vf = self.kv[layer][1].view(-1, nkv, hd)
            write, gather = slots[g]
            kf.index_copy_(0, write, k[r0:r1])
            vf.index_copy_(0, write, v[r0:r1])
            K = torch.where(valid[g], kf.index_select(0, gather), 0)
            V = torch.where(valid[g], vf.index_select(0, gather), 0)
            K = K.permute(1, 0, 2).repeat_interleave(nq // nkv, dim=0)  # [nq, maxctx, hd]
            V = V.permute(1, 0, 2).repeat_interleave(nq // nkv, dim=0)
            s = torch.matmul(q.permute(1, 0, 2), K.transpose(1, 2)) * (1.0 / math.sqrt(hd))
            s = s.masked_fill(~self.mask(ws, g), float("-inf"))
            att = torch.softmax(s.float(), dim=-1).to(self.dtype)
            o = torch.matmul(att, V).permute(1, 0, 2).reshape(C, nq * hd)
            x = x + o @ p["o"]
            hn = self.rms(x, p["n2"])
            x = x + (torch.nn.functional.silu(hn @ p["gate"]) * (hn @ p["up"])) @ p["down"]
        return self.rms(x, self.nf) @ self.lm
