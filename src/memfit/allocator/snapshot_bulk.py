"""The bulk path of the snapshot pickle reader: runs of trace events read by one regular
expression and kept in columns, without a dict per event.

A trace of millions of events is the same few opcodes again and again: an event dict
(``EMPTY_DICT``, ``MEMOIZE``, ``MARK``), its keys as memo references to the strings the first
event spelled out, integers, a memo reference for the action, a frames list, ``SETITEMS``.
Once :mod:`memfit.allocator.snapshot_pickle` has read one event whose keys are all memo
references, this module compiles a pattern for events of that shape (the same keys in the
same order) and reads as many as follow with ``re.split`` over a chunk of the file: one C
call for thousands of events, each field's tokens a slice of its result. They then become
columns at C speed too (``bytes.join`` and extended slices where every token of a column has
the same width, a dict of the distinct tokens otherwise; frames lists by dicts of their
tokens), and the columns go to the trace sink whole: about 1 us an event where the
interpreter takes 5 (``docs/benchmarks.md``).

It reads exactly what the opcode interpreter would, or nothing:

* **Only plain tokens.** The pattern accepts integers that are neither negative nor past
  ``2**63`` (``BININT1``, ``BININT2``, ``BININT`` and ``LONG1`` with their sign bit clear),
  memo references, ``NONE`` and booleans, and a frames list of memo references. A new
  string, a new frame dict, a negative or larger integer, a ``FRAME`` marker, any other
  opcode ends the run there, and the interpreter reads that event (and every error message
  stays the interpreter's).
* **Memo kept exact.** Every ``MEMOIZE`` takes its index as in the interpreter: an event's
  (never kept), its new frames list's. A new frames list is kept lazily (its tokens; it is
  built on the first reference to it, as the same list the interpreter would have kept).
  The bulk path is off in a pickle that names memo indices itself (``PUT``, ``BINPUT``,
  ``LONG_BINPUT``): each memo index then means one object for the whole read, and a token
  may be decoded once.
* **Objects counted.** Each event counts what the interpreter counts (the dict, each key and
  value, and a memo reference as everything it holds); a reference to a container weighs it
  (which also seals it against later changes). Nothing is built from a token but integers,
  bytes and the lists the interpreter would build; no recursion, nothing called.
* **Checked as the sink checks.** Actions are memo references to one of
  :data:`~memfit.allocator.snapshot_records.ACTIONS`; frames resolve through the device's
  :class:`~memfit.allocator.snapshot_records.Interner`. Anything else turns the bulk path off
  for the rest of the read and leaves the run to the interpreter, which says what is wrong.
"""

from __future__ import annotations

import re
import sys
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, chain, compress, repeat
from operator import add
from typing import Any, Protocol, cast

from memfit.allocator.snapshot_records import ACTIONS, TraceSink

__all__ = ["Bulk", "LazyLists", "key_token"]

#: Bytes read by one ``split`` at most (about 4,000 events: the chunk is copied, and the
#: rest of it again where a run stops, as most do at a ``FRAME`` every 64 KiB).
CHUNK_BYTES = 128 << 10

#: Event shapes compiled at most in one read (each costs a ``re.compile``).
MAX_SHAPES = 16

_ACTION_CODE = {a: i for i, a in enumerate(ACTIONS)}
_NONE = -(1 << 63)
_REF = rb"(?:h.|j....)"
# An integer from 0 to 2**63 - 1 (the sign bit clear), its whole token: the first byte (K, M,
# J), or LONG1's opcode and length, fix its width; the rest is the value, little-endian.
_LONG1 = b"|".join([rb"\x00"] + [bytes([k]) + b".{%d}[\x00-\x7f]" % (k - 1) for k in range(1, 9)])
_NUM = rb"(K.|M..|J...[\x00-\x7f]|\x8a(?:" + _LONG1 + rb"))"
_ANY_LONG1 = b"|".join([rb"\x00"] + [bytes([k]) + b".{%d}" % k for k in range(1, 9)])
# A value the sink does not read: a memo reference (weighed), an integer, None, a boolean.
_OTHER = rb"(" + _REF + rb"|N|\x88|\x89|K.|M..|J....|\x8a(?:" + _ANY_LONG1 + rb"))"
# A frames list: a memo reference to one already read, or a new one (EMPTY_LIST, MEMOIZE and
# its items as memo references: one with APPEND, more between MARK and APPENDS).
_FRAMES = rb"(?:(" + _REF + rb")|(\]\x94(?:\((?:" + _REF + rb")+e|" + _REF + rb"a)?))"

_NUMERIC = ("addr", "size", "stream", "time_us", "device_free")
_BIG_ENDIAN = sys.byteorder == "big"


def key_token(data: bytes, pos: int) -> bytes | None:
    """The memo reference at ``pos`` (``BINGET`` or ``LONG_BINGET``) as bytes, else ``None``."""
    op = data[pos]
    if op == 0x68:
        return data[pos : pos + 2]
    if op == 0x6A:
        return data[pos : pos + 5]
    return None


_TO_BYTES: Any = int.to_bytes


def _tokens(col: Sequence[bytes | None]) -> set[bytes]:
    """The distinct tokens of a column, ``None`` (a group that did not take part) left out."""
    out = set(col)
    out.discard(None)
    return cast(set[bytes], out)


def _ref_token(index: int) -> bytes:
    """The memo reference ``pickle`` writes for ``index`` (``BINGET`` below 256)."""
    return b"h" + bytes((index,)) if index < 256 else b"j" + index.to_bytes(4, "little")


def _ref_index(token: bytes) -> int:
    return token[1] if token[0] == 0x68 else int.from_bytes(token[1:5], "little")


class _Reader(Protocol):
    """What the bulk path needs of the interpreter (``snapshot_pickle._Reader``)."""

    weights: dict[int, int]

    def _weight(self, obj: Any) -> int: ...

    def _too_many(self) -> Exception: ...

    def _progress(self, pos: int, n: int) -> int: ...

    next_progress: int


class LazyLists:
    """The new frames lists the bulk path read, kept as their tokens by memo index, built
    (and then kept as built) on the first reference to one; with each its stack index in
    the interner of the device it was read for, and the objects its items stand for."""

    def __init__(self) -> None:
        self.index = array("q")
        self.stack = array("q")
        self.weight = array("q")
        self.tokens: list[bytes] = []
        self.starts: list[int] = []  # positions where the interner changes
        self.owners: list[Any] = []  # the interner from there on
        self._shared: dict[bytes, bytes] = {}

    def add(
        self,
        indices: Sequence[int],
        tokens: Sequence[bytes],
        stacks: array[int],
        weights: array[int],
        owner: Any,
    ) -> None:
        if not self.owners or self.owners[-1] is not owner:
            self.starts.append(len(self.index))
            self.owners.append(owner)
        self.index.extend(indices)
        self.stack.extend(stacks)
        self.weight.extend(weights)
        shared = self._shared
        self.tokens.extend(map(shared.setdefault, tokens, tokens))

    def find(self, key: int) -> int:
        """The position of memo index ``key``, or ``-1``."""
        i = bisect_left(self.index, key)
        return i if i < len(self.index) and self.index[i] == key else -1

    def owner(self, position: int) -> Any:
        """The interner the list at ``position`` was read for."""
        return self.owners[bisect_left(self.starts, position + 1) - 1]

    def get(self, memo: dict[int, Any], key: int) -> list[Any] | None:
        """The list at memo index ``key`` built from its tokens, or ``None``."""
        i = self.find(key)
        if i < 0:
            return None
        return [memo[j] for j in _refs(self.tokens[i])]


def _refs(token: bytes) -> list[int]:
    """The memo indices a new frames list's tokens (``]\\x94`` ...) refer to, in order."""
    out = []
    pos = 2
    n = len(token)
    while pos < n:
        op = token[pos]
        if op == 0x68:
            out.append(token[pos + 1])
            pos += 2
        elif op == 0x6A:
            out.append(int.from_bytes(token[pos + 1 : pos + 5], "little"))
            pos += 5
        else:  # MARK, APPENDS, APPEND
            pos += 1
    return out


class _Bail(Exception):
    """A token the bulk path will not decide on: the interpreter reads the run."""


class _Shape:
    """One event layout: its keys (memo references) in order, and the pattern for it.

    The pattern's groups: ``e(`` where the event follows an ``APPENDS`` and ``MARK`` (the
    next batch of the same list), then each field's whole value token (a frames list has
    two, one of them ``None``: a reference, a new list), then the stop: at anything else,
    its byte and the rest of the chunk, so ``split`` ends there, every byte before it in
    events (the two alternatives between them match wherever one starts).
    ``FRAME`` markers are not in it: the interpreter reads the event one falls in (one in
    64 KiB).
    """

    def __init__(self, keys: Sequence[tuple[bytes, str]]) -> None:
        self.fields: list[tuple[str, int]] = []  # (key, its first group's column)
        parts = [rb"((?:e\()?)\}\x94\("]
        column = 1
        for token, name in keys:
            parts.append(re.escape(token))
            if name == "action":
                parts.append(rb"(" + _REF + rb")")
            elif name in _NUMERIC:
                parts.append(_NUM)
            elif name == "frames":
                parts.append(_FRAMES)
            else:
                parts.append(_OTHER)
            self.fields.append((name, column))
            column += 2 if name == "frames" else 1
        parts.append(rb"u")
        self.nkeys = len(keys)
        #: bytes of an event outside its groups: EMPTY_DICT, MEMOIZE, MARK, keys, SETITEMS
        self.fixed = 4 + sum(len(token) for token, _ in keys)
        self.pattern = re.compile(b"".join(parts) + rb"|(.)(.*)", re.DOTALL)
        self.stride = self.pattern.groups + 1  # split gives the text before, then the groups


class Bulk:
    """The bulk path of one read (see the module)."""

    def __init__(self, reader: _Reader, memo: dict[int, Any], lazy: LazyLists) -> None:
        self.reader = reader
        self.memo = memo
        self.lazy = lazy
        self.on = True
        self.events = 0  # events read here (tests and the benchmark look)
        self.shapes: dict[tuple[tuple[bytes | None, str], ...], _Shape | None] = {}
        self.current: _Shape | None = None
        self._actions: dict[bytes, int] = {}
        # per interner: stack and weight by the token of a reference, of a new list
        self._frame_caches: dict[int, tuple[dict[bytes, int], ...]] = {}
        self._weights: dict[bytes, int] = {}  # token of another field -> objects
        self._ints: dict[bytes, int] = {}

    def learn(self, keys: Sequence[tuple[bytes | None, str]]) -> None:
        """Make the shape of an event just read (its key tokens, ``None`` where a key was
        spelled out, and names, in order) the current one, where the bulk path reads it."""
        key = tuple(keys)
        if key in self.shapes:
            self.current = self.shapes[key]
            return
        names = [name for _, name in keys]
        tokens = [token for token, _ in keys if token is not None]
        shape = None
        if (
            len(self.shapes) < MAX_SHAPES
            and len(tokens) == len(keys)
            and len(set(names)) == len(names)
            and "action" in names
        ):
            shape = _Shape(list(zip(tokens, names, strict=True)))
        self.shapes[key] = shape
        self.current = shape

    def run(
        self, data: bytes, pos: int, memo_next: int, sink: TraceSink, budget: int
    ) -> tuple[int, int, int]:
        """Read the events of the current shape from ``pos`` on into ``sink``.

        Returns:
            Where the interpreter goes on, the memo's next index, and the objects read.

        Raises:
            ConfigError: When the events stand for more than ``budget`` objects.
        """
        shape = self.current
        if shape is None or not self.on:
            return pos, memo_next, 0
        reader = self.reader
        n = len(data)
        stride = shape.stride
        objects = 0
        while True:
            end = min(n, pos + CHUNK_BYTES)
            parts = shape.pattern.split(data[pos:end])
            matches = (len(parts) - 1) // stride
            stopped = matches > 0 and parts[-2] is not None
            count = matches - 1 if stopped else matches
            if not count:
                break
            cols = [parts[j : j + count * stride : stride] for j in range(1, stride - 2)]
            try:
                got, memo_next = self._take(cols, count, shape, memo_next, sink)
            except _Bail:
                self.on = False
                break
            objects += got
            if objects > budget:
                raise reader._too_many()
            self.events += count
            pos = end - 1 - len(parts[-2]) if stopped else end
            if pos >= reader.next_progress:
                reader.next_progress = reader._progress(pos, n)
            if not stopped and end == n:
                break
        return pos, memo_next, objects

    # -- columns --------------------------------------------------------------------------
    def _take(
        self, cols: list[list[Any]], k: int, shape: _Shape, memo_next: int, sink: TraceSink
    ) -> tuple[int, int]:
        """Check the columns of ``k`` events and give them to ``sink``.

        Returns:
            The objects they stand for, and the memo's next index after them.
        """
        objects = k * (1 + 2 * shape.nkeys)
        present: dict[str, Any] = {}
        stacks: array[int] | None = None
        incs: list[int] | None = None
        for name, column in shape.fields:
            col = cols[column]
            if name == "action":
                present[name] = self._action_codes(col)
            elif name in _NUMERIC:
                present[name] = _ints(col, self._ints, "Q" if name in ("addr", "size") else "q")
            elif name == "frames":
                stacks, incs, got = self._frames(col, cols[column + 1], k, memo_next, sink)
                objects += got
            else:
                objects += self._others(col)
        memo_next += k if incs is None else sum(incs)
        none = array("q", [_NONE])
        zero = array("q", [0])
        sink.extend_columns(
            present["action"],
            present.get("addr", zero * k),
            present.get("size", zero * k),
            present.get("stream", zero * k),
            present.get("time_us", none * k),
            stacks if stacks is not None else array("q", [-1]) * k,
            present.get("device_free", none * k),
        )
        return objects, memo_next

    def _action_codes(self, col: Sequence[bytes]) -> bytes:
        known = self._actions
        for token in set(col).difference(known):
            value = self.memo.get(_ref_index(token))
            if type(value) is not str or value not in _ACTION_CODE:
                raise _Bail
            known[token] = _ACTION_CODE[value]
        return bytes(map(known.__getitem__, col))

    def _resolve(self, token: bytes) -> Any:
        return self._at(_ref_index(token))

    def _at(self, index: int) -> Any:
        """The memo's object at ``index`` (a lazy list built and kept); else the interpreter
        reads the run (a reference to an event, or to nothing)."""
        value = self.memo.get(index)
        if value is None:
            value = self.lazy.get(self.memo, index)
            if value is None:
                raise _Bail
            self.memo[index] = value
        return value

    def _container_weight(self, value: Any) -> int:
        reader = self.reader
        return reader.weights.get(id(value)) or reader._weight(value)

    def _others(self, col: Sequence[bytes]) -> int:
        """Objects a field the sink does not read stands for beyond its key and value: a memo
        reference to a container counts what it holds, as in the interpreter."""
        known = self._weights
        extra = 0
        for token, count in Counter(col).items():
            if token[0] not in (0x68, 0x6A):  # not a memo reference: one object
                continue
            got = known.get(token)
            if got is None:
                value = self._resolve(token)
                got = (
                    self._container_weight(value)
                    if type(value) in (dict, list, tuple, set, frozenset)
                    else 0
                )
                known[token] = got
            extra += got * count
        return extra

    def _frames(
        self,
        refs: Sequence[bytes | None],
        news: Sequence[bytes | None],
        k: int,
        memo_next: int,
        sink: TraceSink,
    ) -> tuple[array[int], list[int], int]:
        """Each event's stack index, memo indices taken, and objects of its frames list.

        Tokens are looked up in dicts of the device's interner (a token always means the
        same list: no memo index is named twice in a read the bulk path is on for), all with
        C loops (``map``, set operations); only tokens never seen are resolved one by one.
        """
        interner = sink.frames
        caches = self._frame_caches.get(id(interner))
        if caches is None:
            caches = self._frame_caches[id(interner)] = ({}, {}, {}, {})
        ref_stack, ref_weight, new_stack, new_weight = caches
        lazy = self.lazy
        memo = self.memo
        table: dict[bytes, int] = {}
        weights: dict[bytes, int] = {}
        # the new lists first: a later event of the same chunk may refer to one
        flags = list(map(bool, news))
        local_stack: dict[bytes, int] = {}
        local_weight: dict[bytes, int] = {}
        if any(flags):
            distinct = _tokens(news)
            for token in distinct.difference(new_stack):
                frames = [self._at(i) for i in _refs(token)]
                new_stack[token] = interner.stack_of(frames)
                new_weight[token] = sum(
                    self._container_weight(f) if type(f) is dict else 1 for f in frames
                )
            table.update(zip(distinct, map(new_stack.__getitem__, distinct), strict=True))
            weights.update(zip(distinct, map(new_weight.__getitem__, distinct), strict=True))
            incs = list(map(add, repeat(1), flags))
            starts = accumulate(incs, initial=memo_next + 1)
            added = cast(list[bytes], list(compress(news, flags)))
            indices = list(compress(starts, flags))
            stacks_added = array("q", map(new_stack.__getitem__, added))
            weights_added = array("q", map(new_weight.__getitem__, added))
            lazy.add(indices, added, stacks_added, weights_added, interner)
            # what a reference to one of these lists looks like, for the events after it
            tokens = list(
                map(add, repeat(b"j"), map(_TO_BYTES, indices, repeat(4), repeat("little")))
                if indices[0] >= 256
                else map(_ref_token, indices)
            )
            local_stack = dict(zip(tokens, stacks_added, strict=True))
            local_weight = dict(zip(tokens, map(add, repeat(1), weights_added), strict=True))
        else:
            incs = [1] * k
        distinct = _tokens(refs)
        unknown = distinct.difference(ref_stack)
        if unknown:
            hits = unknown.intersection(local_stack)
            table.update(zip(hits, map(local_stack.__getitem__, hits), strict=True))
            weights.update(zip(hits, map(local_weight.__getitem__, hits), strict=True))
            for token in unknown.difference(hits):
                index = _ref_index(token)
                at = -1 if index in memo else lazy.find(index)
                if at >= 0 and lazy.owner(at) is interner:  # a list read here, not built
                    table[token] = lazy.stack[at]
                    weights[token] = 1 + lazy.weight[at]
                    continue
                value = self._resolve(token)
                if type(value) not in (list, tuple):
                    raise _Bail
                ref_stack[token] = interner.stack(value)
                ref_weight[token] = self._container_weight(value)
            distinct.difference_update(table)
        table.update(zip(distinct, map(ref_stack.__getitem__, distinct), strict=True))
        weights.update(zip(distinct, map(ref_weight.__getitem__, distinct), strict=True))
        keys = list(filter(None, chain.from_iterable(zip(refs, news, strict=True))))  # one each
        if len(keys) != k:
            raise _Bail
        stacks = array("q", map(table.__getitem__, keys))
        return stacks, incs, sum(map(weights.__getitem__, keys))


def _value(token: bytes) -> int:
    """The integer of one ``_NUM`` token."""
    return int.from_bytes(token[2:] if token[0] == 0x8A else token[1:], "little")


def _ints(col: Sequence[bytes], cache: dict[bytes, int], code: str) -> array[int]:
    """The integers of a column of ``_NUM`` tokens, 8 bytes each (``code``: ``"q"`` or
    ``"Q"``, the same bytes for values under ``2**63``)."""
    k = len(col)
    first = col[0]
    width = len(first)
    head = 2 if first[0] == 0x8A else 1
    joined = b"".join(col)
    if (
        len(joined) == width * k
        and joined[::width] == first[:1] * k
        and (head == 1 or joined[1::width] == first[1:2] * k)
    ):
        # a token's first bytes fix its width, and every token has this one's: the values
        # sit at fixed offsets, little-endian, and padded to 8 bytes they are the array's
        out = bytearray(8 * k)
        for j in range(head, width):
            out[j - head :: 8] = joined[j::width]
        values = array(code)
        values.frombytes(bytes(out))
        if _BIG_ENDIAN:
            values.byteswap()
        return values
    distinct = set(col)
    if len(distinct) * 4 <= k:
        missing = distinct.difference(cache)
        if len(cache) + len(missing) > 1 << 16:
            cache.clear()
            missing = distinct
        for token in missing:
            cache[token] = _value(token)
        return array(code, map(cache.__getitem__, col))
    return array(code, map(_value, col))
