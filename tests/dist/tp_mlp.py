"""A tensor-parallel MLP over torch.distributed (gloo, two processes on the
CPU), written as Megatron-style layers: a column-parallel up projection and a
row-parallel down projection whose partial sums are combined by all_reduce.
For dynaflow apply's tests: the micro-batches of a split layer each issue the
layer's all_reduce, and the ranks must pair them up in the same order.

    python tp_mlp.py [--steps N] [--batch-scaled] [--rank1-batch-number]
                     [--rank1-gain-number] [--gather-scatter] [--dtensor]

--batch-scaled divides each layer's output by the batch's rows over all
ranks, summed by an all_reduce of the local row count made in Python: split,
each micro-batch would divide by its own, a result no operator shows to
differ (dynaflow's first-call comparison refuses it on every rank).

--rank1-batch-number adds 0.001 x the rows to rank 1's layer outputs only,
after the all_reduce: split, only rank 1's first-call comparison differs, so
only rank 1 refuses by itself; rank 0 would split, and its two micro-batches'
all_reduces would meet rank 1's one (the ranks must agree: dynaflow's
audited first call makes them).

--rank1-gain-number does the same in the model's input gain, a module that
issues no collectives: only rank 1 refuses its calls. The layers after it,
whose collectives pair up across the ranks, must go on split on both ranks
(a refusal that ended the whole plan on rank 1 left its layers unsplit while
rank 0 split them).

--gather-scatter sums the row-parallel halves with a list reduce_scatter
(each rank sums its half of the features) and a list all_gather (the halves
put together again), the same sum as the all_reduce, as sequence- and
tensor-parallel layers write it.

--dtensor builds the same layers as nn.Linear modules and shards them with
torch's own tensor parallelism (torch.distributed.tensor.parallel:
ColwiseParallel up, RowwiseParallel down, on a CPU device mesh): DTensor
weights, and hooks that turn each projection's input and output into DTensors
and back, whose RowwiseParallel output is the same all_reduce.

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
    def __init__(self, rank, generator, batch_scaled, rank_quirk, gather_scatter=False):
        super().__init__()
        self.batch_scaled = batch_scaled
        self.gather_scatter = gather_scatter
        self.rows_added = 1e-3 if rank_quirk and rank == 1 else 0.0
        up = torch.randn(HIDDEN, WIDTH, generator=generator) / WIDTH ** 0.5
        down = torch.randn(WIDTH, HIDDEN, generator=generator) / HIDDEN ** 0.5
        shard = HIDDEN // WORLD
        self.up = nn.Parameter(up[rank * shard:(rank + 1) * shard].clone())  # column-parallel
        self.down = nn.Parameter(down[:, rank * shard:(rank + 1) * shard].clone())  # row-parallel

    def forward(self, x):
        partial = torch.relu(x @ self.up.t()) @ self.down.t()
        if self.gather_scatter:  # the same sum, each rank summing half of the features
            half = torch.empty(*partial.shape[:-1], WIDTH // WORLD)
            dist.reduce_scatter(half, list(partial.chunk(WORLD, -1)))
            halves = [torch.empty_like(half) for _ in range(WORLD)]
            dist.all_gather(halves, half)
            partial = torch.cat(halves, -1)
        else:
            dist.all_reduce(partial)  # the sum over ranks of the row-parallel halves
        if self.batch_scaled:
            rows = torch.tensor([float(x.shape[0])])
            dist.all_reduce(rows)
            partial = partial / rows
        if self.rows_added:
            partial = partial + self.rows_added * x.shape[0]
        return x + partial


class DTensorBlock(nn.Module):
    """TPBlock's layer written for torch's tensor parallelism: the full
    weights, sharded by parallelize_module (`shard`)."""

    def __init__(self, generator):
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, WIDTH, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(torch.randn(HIDDEN, WIDTH, generator=generator) / WIDTH ** 0.5)
            self.down.weight.copy_(torch.randn(WIDTH, HIDDEN, generator=generator) /
                                   HIDDEN ** 0.5)

    def shard(self, mesh):
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)

        parallelize_module(self, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Gain(nn.Module):
    """The input scaled per feature (by ones: the outputs stay those of the
    layers alone), on every rank alike, with no collective."""

    def __init__(self, rank, rank_quirk):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH))
        self.rows_added = 1e-3 if rank_quirk and rank == 1 else 0.0

    def forward(self, x):
        return x * self.weight + self.rows_added * x.shape[0]


class TPModel(nn.Module):
    def __init__(self, rank, batch_scaled, rank_quirk, gain_quirk=False, gather_scatter=False,
                 dtensor=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.gain = Gain(rank, gain_quirk)
        if dtensor:
            from torch.distributed.device_mesh import init_device_mesh

            self.layers = nn.ModuleList(DTensorBlock(g) for _ in range(LAYERS))
            mesh = init_device_mesh("cpu", (WORLD,))
            for layer in self.layers:
                layer.shard(mesh)
            return
        self.layers = nn.ModuleList(TPBlock(rank, g, batch_scaled, rank_quirk, gather_scatter)
                                    for _ in range(LAYERS))

    def forward(self, x):
        x = self.gain(x)
        for layer in self.layers:
            x = layer(x)
        return x


def run(rank, port, steps, batch_scaled, rank_quirk, gain_quirk, gather_scatter, dtensor):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    model = TPModel(rank, batch_scaled, rank_quirk, gain_quirk, gather_scatter, dtensor)
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
    ap.add_argument("--batch-scaled", action="store_true")
    ap.add_argument("--rank1-batch-number", action="store_true")
    ap.add_argument("--rank1-gain-number", action="store_true")
    ap.add_argument("--gather-scatter", action="store_true")
    ap.add_argument("--dtensor", action="store_true")
    args = ap.parse_args()
    mp.spawn(run, args=(free_port(), args.steps, args.batch_scaled, args.rank1_batch_number,
                        args.rank1_gain_number, args.gather_scatter, args.dtensor), nprocs=WORLD)
