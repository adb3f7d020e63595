"""An out-of-memory error rehearsed on a simulated card, dumped for ``memfit explain``.

A small sequence model trains on batches whose length changes from step to step (as text or
trajectories of varying length do) on a simulated 64 MiB card. Each step's activations are
freed, but the caching allocator keeps their segments, and blocks of one size cannot serve
requests of another: at the longest batch the run goes out of memory although less than
the card is live. The Recorder writes ``oom_rehearsal.oom1.snapshot.pickle`` (the allocator's
history, as ``torch.cuda.memory._dump_snapshot`` writes it on a GPU), which
``memfit explain`` reads:

    python examples/oom_rehearsal.py          # CPU, a few seconds; writes the files here
    memfit explain oom_rehearsal.oom1.snapshot.pickle

On a GPU, leave ``simulate_gpu`` out: ``Recorder(..., memory_history=100_000)`` records
the CUDA allocator's own history and dumps it at the OOM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

import memfit


class Model(torch.nn.Module):
    """An embedding, a feed-forward block and a head, over (batch, length) tokens."""

    def __init__(self, vocab: int = 256, width: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x)


#: Tokens per batch at each step: the lengths of a run's batches, the last one the longest.
LENGTHS = [128, 256, 96, 192, 1024]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", default="64MiB", help="the simulated card's memory")
    ap.add_argument("--out", default=".", help="folder for the log and the OOM dump")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    torch.manual_seed(0)
    log = Path(args.out) / "oom_rehearsal.jsonl"
    with (
        memfit.simulate_gpu(args.budget),
        memfit.Recorder(log, memory_history=100_000, log=False) as rec,
    ):
        model = Model()  # on the card: its parameters count, as .to("cuda") would
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step, length in enumerate(LENGTHS):
            tokens = torch.randint(0, 256, (32, length))
            try:
                logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            except torch.OutOfMemoryError as exc:
                written = rec.on_oom(exc)
                print(f"step {step}: out of memory at a batch of 32 x {length} tokens")
                for path in written:
                    print(f"wrote {path}")
                return 0
            rec.step(step=step)
            print(f"step {step}: 32 x {length} tokens, loss {loss.item():.3f}")
    print("no out-of-memory error: lower --budget")
    return 1


if __name__ == "__main__":
    sys.exit(main())
