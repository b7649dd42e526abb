"""A tensor-parallel MLP over torch.distributed (gloo, two processes on the
CPU), written as Megatron-style layers: a column-parallel up projection and a
row-parallel down projection whose partial sums are combined by all_reduce.
For dynaflow apply's tests: the micro-batches of a split layer each issue the
layer's all_reduce, and the ranks must pair them up in the same order.

    python tp_mlp.py [--steps N]

Prints, from rank 0, the output's checksum and a few values at full precision,
so two runs (unmodified and under `dynaflow apply`) can be compared.
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD, WIDTH, HIDDEN, BATCH, LAYERS = 2, 16, 64, 8, 3


class TPBlock(nn.Module):
    def __init__(self, rank, generator):
        super().__init__()
        up = torch.randn(HIDDEN, WIDTH, generator=generator) / WIDTH ** 0.5
        down = torch.randn(WIDTH, HIDDEN, generator=generator) / HIDDEN ** 0.5
        shard = HIDDEN // WORLD
        self.up = nn.Parameter(up[rank * shard:(rank + 1) * shard].clone())  # column-parallel
        self.down = nn.Parameter(down[:, rank * shard:(rank + 1) * shard].clone())  # row-parallel

    def forward(self, x):
        partial = torch.relu(x @ self.up.t()) @ self.down.t()
        dist.all_reduce(partial)  # the sum over ranks of the row-parallel halves
        return x + partial


class TPModel(nn.Module):
    def __init__(self, rank):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.layers = nn.ModuleList(TPBlock(rank, g) for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def run(rank, port, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = TPModel(rank)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for step in range(steps):
            out = model(torch.randn(BATCH, 4, WIDTH, generator=g))
            if rank == 0:
                print(f"step {step}: checksum {out.double().sum().item():.12e} "
                      f"first {out.flatten()[:3].tolist()}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    mp.spawn(run, args=(free_port(), args.steps), nprocs=WORLD)
