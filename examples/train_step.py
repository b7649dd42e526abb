"""A few training steps of the Llama-style decoder of llama_decode.py on random
tokens: forward, next-token cross-entropy, backward, AdamW step.

    python examples/train_step.py                        # small, CPU or GPU
    dynaflow trace -- .venv/bin/python examples/train_step.py --device cpu

Forward operators are attributed to module paths such as
LlamaForCausalLM.model.layers.0.mlp; backward operators run in autograd's
engine, outside any module's forward, and are marked as the backward pass.
"""

import argparse
import time

import torch
import torch.nn.functional as F

from llama_decode import add_model_args, build_model, check_model_args


def train_step(model, optimizer, tokens):
    """One step on tokens [batch, seq+1]: predicts tokens[:, 1:] from tokens[:, :-1]."""
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    check_model_args(parser, args)

    model = build_model(args, args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    losses = []
    for _ in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch, args.seq_len + 1), generator=generator)
        losses.append(train_step(model, optimizer, tokens.to(args.device)))
    losses = [f"{float(loss):.3f}" for loss in losses]  # one device sync, at the end
    elapsed = time.perf_counter() - start
    print(f"train_step: {args.steps} steps of {args.batch}x{args.seq_len} tokens in "
          f"{elapsed * 1e3:.1f} ms on {args.device}; loss {' -> '.join(losses)}")


if __name__ == "__main__":
    main()
