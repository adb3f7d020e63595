"""Version and capability rules as data: what a torch, CUDA, cuDNN or jaxlib release changes.

Each backend has one table, a JSON file beside this module (``rules_torch.json`` for torch
and the CUDA libraries it bundles, ``rules_jaxlib.json`` for jaxlib's XLA, ``rules_nccl.json``
for NCCL's device memory, ``rules_cuda_arch.json`` for the dtypes each compute capability runs
natively), read on first use
as the GPU catalog is. A row says what one rule is under some conditions, and where that was
read::

    {"rule": "sdpa.flash.max_head_dim", "value": 256, "torch": ">=2.2",
     "source": "pytorch#105602: FlashAttention-2 from torch 2.2 (sdp_utils.cpp)"}

* ``rule``: the name the code asks for; ``value``: any JSON value;
* conditions, all of which must hold: a version key (``torch``, ``cuda``, ``cudnn``,
  ``jaxlib``, ``nccl``) or ``capability`` with clauses separated by commas, each an operator and a
  version (``">=2.2, <2.11"``) or ``"in 9.0 9.3 10.0"``; a version compares by its leading
  parts (``2.11`` against ``(2, 11)``, ``0.9.2`` against ``(0, 9, 2)``);
* ``source``: where the rule was read (required).

:func:`rule` returns the value of the first row of that name whose conditions hold; every
rule ends with a row without conditions (its default), which a test checks, so a lookup
always answers. Code asks ``rule("torch", "sdpa.flash.max_head_dim", torch=(2, 1))`` in
place of a branch on the version: a new release is a new row with its source, not new code.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from memfit.errors import ConfigError

__all__ = ["FACTS", "TABLES", "Row", "rows", "rule"]

#: The tables, by backend.
TABLES = ("torch", "jaxlib", "nccl", "cuda_arch")
#: The facts a row may test.
FACTS = ("torch", "cuda", "cudnn", "jaxlib", "nccl", "capability")

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_LOCK = threading.Lock()


def _parse_version(text: str, where: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in text.strip().split("."))
    except ValueError:
        parts = ()
    if not parts:
        raise ConfigError(f"{where}: {text!r} is not a version", key_path=where)
    return parts


def _clause(text: str, where: str) -> Callable[[tuple[int, ...]], bool]:
    text = text.strip()
    if text.startswith("in "):
        allowed = [_parse_version(v, where) for v in text[3:].split()]
        return lambda fact: any(fact[: len(a)] == a for a in allowed)
    for symbol in (">=", "<=", "==", "!=", ">", "<"):
        if text.startswith(symbol):
            bound = _parse_version(text[len(symbol) :], where)
            compare = _OPS[symbol]
            return lambda fact: bool(compare(fact[: len(bound)], bound))
    raise ConfigError(
        f"{where}: {text!r} is not a condition",
        key_path=where,
        hint='write an operator and a version (">=2.2"), or "in 9.0 10.0"',
    )


@dataclass(frozen=True)
class Row:
    """One row of a rules table.

    Attributes:
        rule: The rule's name.
        value: What it is where the conditions hold.
        conditions: ``fact -> text`` of the row's conditions.
        source: Where it was read.
    """

    rule: str
    value: Any
    conditions: Mapping[str, str]
    source: str

    def holds(self, facts: Mapping[str, tuple[int, ...] | None]) -> bool:
        """Whether every condition holds for ``facts`` (an unknown fact holds none)."""
        for fact, text in self.conditions.items():
            known = facts.get(fact)
            if known is None:
                return False
            where = f"{self.rule}.{fact}"
            if not all(_clause(c, where)(tuple(known)) for c in text.split(",")):
                return False
        return True


@cache
def rows(table: str) -> tuple[Row, ...]:
    """The rows of one backend's table, as the file lists them.

    Raises:
        ConfigError: For an unknown table, or a row without a rule, a source or a valid
            condition (a broken file shipped with memfit).
    """
    if table not in TABLES:
        raise ConfigError(f"no rules table {table!r}", key_path="table", hint=f"one of {TABLES}")
    path = Path(__file__).with_name(f"rules_{table}.json")
    with _LOCK:
        raw = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for index, item in enumerate(raw["rules"]):
        where = f"rules_{table}.json[{index}]"
        unknown = set(item) - {"rule", "value", "source", *FACTS}
        if unknown or not item.get("rule") or not item.get("source") or "value" not in item:
            raise ConfigError(f"{where}: malformed rule row {item!r}", key_path=where)
        conditions = {k: str(item[k]) for k in FACTS if k in item}
        for fact, text in conditions.items():
            for part in text.split(","):
                _clause(part, f"{where}.{fact}")
        out.append(Row(str(item["rule"]), item["value"], conditions, str(item["source"])))
    return tuple(out)


def rule(table: str, name: str, **facts: tuple[int, ...] | None) -> Any:
    """The value of rule ``name`` of ``table`` for the given facts.

    Args:
        table: ``"torch"``, ``"jaxlib"``, ``"nccl"`` or ``"cuda_arch"``.
        name: The rule.
        **facts: ``torch=(2, 5)``, ``cuda=(12, 4)``, ``cudnn=(9, 1)``, ``jaxlib=(0, 9, 2)``,
            ``nccl=(2, 21)``,
            ``capability=(9, 0)``; ``None`` for one that is unknown.

    Returns:
        The value of the first row whose conditions hold.

    Raises:
        ConfigError: For an unknown table, rule or fact.

    >>> rule("torch", "sdpa.flash.max_head_dim", torch=(2, 1))
    128
    >>> rule("torch", "sdpa.flash.max_head_dim", torch=(2, 6))
    256
    """
    unknown = set(facts) - set(FACTS)
    if unknown:
        raise ConfigError(f"unknown facts {sorted(unknown)}", key_path="facts", hint=str(FACTS))
    found = False
    for row in rows(table):
        if row.rule != name:
            continue
        found = True
        if row.holds(facts):
            return row.value
    if not found:
        raise ConfigError(f"no rule {name!r} in the {table} table", key_path="rule")
    raise ConfigError(f"rule {name!r} has no default row", key_path="rule")
