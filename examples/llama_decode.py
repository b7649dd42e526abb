"""A Llama-style decoder with random weights, built from plain torch modules:
prefill a prompt, then decode greedily token by token with a KV cache.

    python examples/llama_decode.py                      # small, CPU or GPU
    dynaflow trace -- .venv/bin/python examples/llama_decode.py --device cpu
    python examples/llama_decode.py --layers 8 --hidden 4096 --heads 32 --kv-heads 8 \\
        --batch 16 --prompt-len 1024 --decode-steps 64 --device cuda

The pieces are Llama's: RMSNorm, rotary position embeddings, grouped-query
attention through F.scaled_dot_product_attention, a SwiGLU MLP. Module names
follow Hugging Face's layout, so operators are attributed to paths such as
LlamaForCausalLM.model.layers.0.attn and LlamaForCausalLM.model.layers.0.mlp.
The defaults run in a few seconds on a CPU. Other scripts import build_model
and generate (examples/train_step.py, scripts/device/trace_check.py).
"""

import argparse
import dataclasses
import time

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # In float32, as Llama does: bf16 squares lose too much.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class RotaryEmbedding(nn.Module):
    """cos and sin of every position up to max_positions, computed once."""

    def __init__(self, head_dim, max_positions, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_positions).float(), inv_freq)
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, dim=-1), persistent=False)

    def forward(self, x, start):
        """Rotates x [batch, heads, seq, head_dim] at positions start, start+1, ..."""
        cos = self.cos[start:start + x.shape[2]].to(x.dtype)
        sin = self.sin[start:start + x.shape[2]].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


@dataclasses.dataclass
class KVCache:
    """Keys and values of every layer, preallocated for max_len positions.
    A plain dataclass, not a module: it holds state, not computation. Each
    layer's keys and values are tensors whose first dimension is the batch,
    so a split of the batch into micro-batches (dynaflow apply) hands each
    micro-batch a cache of row views and its writes land in place."""

    k: list
    v: list

    @classmethod
    def empty(cls, layers, batch, kv_heads, max_len, head_dim, dtype, device):
        shape = (batch, kv_heads, max_len, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)])

    def layer(self, index):
        """Layer `index`'s keys and values [batch, kv_heads, max_len, head_dim]."""
        return self.k[index], self.v[index]


def update_cache(k_cache, v_cache, start, k, v):
    """Stores k, v [batch, kv_heads, seq, head_dim] at positions start..;
    returns the keys and values up to the last one stored."""
    end = start + k.shape[2]
    k_cache[:, :, start:end] = k
    v_cache[:, :, start:end] = v
    return k_cache[:, :, :end], v_cache[:, :, :end]


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, rotary):
        super().__init__()
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = hidden // heads
        self.rotary = rotary
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def _split(self, x, heads):
        batch, seq, _ = x.shape
        return x.view(batch, seq, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, start, k_cache=None, v_cache=None):
        q = self.rotary(self._split(self.q_proj(x), self.heads), start)
        k = self.rotary(self._split(self.k_proj(x), self.kv_heads), start)
        v = self._split(self.v_proj(x), self.kv_heads)
        if k_cache is not None:
            k, v = update_cache(k_cache, v_cache, start, k, v)
        # Causal within a prefill; a decoded token sees every cached one.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1,
                                             enable_gqa=True)
        batch, _, seq, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden, heads, kv_heads, intermediate, rotary):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = Attention(hidden, heads, kv_heads, rotary)
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x, start, k_cache=None, v_cache=None):
        x = x + self.attn(self.attn_norm(x), start, k_cache, v_cache)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, kv_heads, intermediate, max_positions):
        super().__init__()
        rotary = RotaryEmbedding(hidden // heads, max_positions)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(hidden, heads, kv_heads, intermediate, rotary) for _ in range(layers))
        self.norm = RMSNorm(hidden)

    def forward(self, tokens, start, cache=None):
        x = self.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, start, *(cache.layer(i) if cache is not None else ()))
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, kv_heads, intermediate, max_positions):
        super().__init__()
        self.model = LlamaModel(vocab, hidden, layers, heads, kv_heads, intermediate,
                                max_positions)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens, start=0, cache=None):
        """Logits [batch, seq, vocab] of tokens [batch, seq] at positions start, ...
        (a Python int: no device-to-host copy per layer)."""
        return self.lm_head(self.model(tokens, start, cache))


def add_model_args(parser):
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=0,
                        help="MLP width (default: Llama's 8/3 of hidden, rounded up to 64)")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)


def check_model_args(parser, args):
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if (args.hidden // args.heads) % 2:
        parser.error("the head size (--hidden / --heads) must be even for rotary embeddings")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    args.intermediate = args.intermediate or -(-args.hidden * 8 // 3 // 64) * 64


def build_model(args, max_positions):
    """A LlamaForCausalLM with random weights, on args.device in args.dtype."""
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(args.vocab, args.hidden, args.layers, args.heads, args.kv_heads,
                             args.intermediate, max_positions)
    return model.to(device=args.device, dtype=args.dtype)


@torch.inference_mode()
def generate(model, args, prompt, decode_steps):
    """Prefills `prompt` [batch, prompt_len] into a fresh KV cache, then decodes
    greedily; returns the decoded tokens [batch, decode_steps]."""
    batch, prompt_len = prompt.shape
    cache = KVCache.empty(args.layers, batch, args.kv_heads, prompt_len + decode_steps,
                          args.hidden // args.heads, args.dtype, args.device)
    token = model(prompt, 0, cache)[:, -1].argmax(-1, keepdim=True)
    decoded = [token]
    for step in range(decode_steps - 1):
        token = model(token, prompt_len + step, cache)[:, -1].argmax(-1, keepdim=True)
        decoded.append(token)
    return torch.cat(decoded, dim=1)


def random_prompt(args, prompt_len):
    generator = torch.Generator().manual_seed(args.seed)
    return torch.randint(args.vocab, (args.batch, prompt_len), generator=generator).to(args.device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--requests", type=int, default=1,
                        help="generate for the prompt this many times, as a server answers "
                             "requests; the last one is timed (under dynaflow apply the first "
                             "call of each kind runs the original way while it is audited)")
    args = parser.parse_args()
    check_model_args(parser, args)
    if args.requests < 1:
        parser.error("--requests must be at least 1")

    model = build_model(args, args.prompt_len + args.decode_steps)
    prompt = random_prompt(args, args.prompt_len)
    for _ in range(args.requests):
        start = time.perf_counter()
        tokens = generate(model, args, prompt, args.decode_steps)
        if args.device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    print(f"llama_decode: {args.layers} layers, hidden {args.hidden}, batch {args.batch}: "
          f"prefilled {args.prompt_len} and decoded {tokens.shape[1]} tokens per sequence "
          f"in {elapsed * 1e3:.1f} ms on {args.device} ({str(args.dtype).split('.')[-1]})")
    # Greedy tokens of every sequence: equal runs print equal checksums.
    weights = torch.arange(1, tokens.numel() + 1, device=tokens.device).view_as(tokens)
    print(f"llama_decode: tokens checksum {int((tokens * weights).sum()) % 2**31}")


if __name__ == "__main__":
    main()
