"""Data-parallel training of a tiny Hugging Face Llama (random weights, built
from a config: tests/hf/hf_models.py) with torch's DistributedDataParallel
over gloo, two processes on the CPU, as fine-tuning scripts write it: each
rank its own batches, SGD, the gradients averaged by DDP's reducer during the
backward. For dynaflow apply's tests: a plan splits the decoder layers inside
DDP's module, so each layer's parameters get their gradient from two
micro-batches before the reducer's hooks fire.

    python ddp_llama.py [--steps N]

Prints, from rank 0, one JSON line: the loss of each step and the sum of the
parameters after the last, so that two runs (unmodified and under
`dynaflow apply`) can be compared within float tolerance (a split sums the
weight gradients over the micro-batches in another order).
"""

import argparse
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf"))
import hf_models  # noqa: E402

WORLD, BATCH, SEQ = 2, 4, 12


def sgd_steps(model, rank, steps):
    """Trains `model` for `steps` SGD steps on the rank's own random batches
    of token ids (the labels are the ids); the loss of each step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(steps):
        ids = torch.randint(2, hf_models.VOCAB, (BATCH, SEQ), generator=g)
        optimizer.zero_grad()
        loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run(rank, port, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = hf_models.build("llama").train()  # its config has no dropout
    losses = sgd_steps(DistributedDataParallel(model), rank, steps)
    total = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(json.dumps({"losses": losses, "parameters": total}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, args.steps), nprocs=WORLD)


if __name__ == "__main__":
    main()
