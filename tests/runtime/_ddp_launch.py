"""Spawning gloo ranks for the DDP tests, with a deadline: a hang fails the test."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.multiprocessing as mp

TIMEOUT_S = 240


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(worker: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``worker(rank, *args)`` on ``nprocs`` spawned processes; fail on a hang."""
    context = mp.start_processes(worker, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:  # a hang is what the DDP tests exist to catch
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {nprocs} ranks did not finish in {TIMEOUT_S} s (a hang?)")
