"""Reading a snapshot pickle with memfit's own bounded opcode interpreter.

``pickle.load`` cannot be made safe for untrusted files by refusing globals alone: the C
unpickler hashes every dict key it builds (a tuple nested 100,000 deep as a key overflows the
C stack: the process dies with SIGSEGV), and a few hundred bytes of memo references can stand
for billions of objects once a reader walks them. This interpreter reads protocols 2 to 5 one
opcode at a time (the same opcodes ``pickletools`` documents) and keeps to plain data:

* **Nothing runs.** Every opcode that names or calls a Python object (``GLOBAL``,
  ``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``NEWOBJ_EX``,
  persistent ids, copyreg extensions, out-of-band buffers) is refused when it is met; nothing
  is imported, whatever the process registered with ``copyreg``.
* **No recursion, no deep hash.** Containers are built with explicit stacks, never
  recursively; a dict key or set item must be a string, a number, bytes, ``None`` or a flat
  tuple of those, so hashing never recurses.
* **Bounded objects, memo reuse counted.** Each object built counts one; a reference to a
  memoised container (``BINGET``) counts every object it holds, nested ones too (its size is
  counted once, bottom-up, and kept), so a pickle that refers to one segment 20,000 times,
  each holding one block 20,000 times, is refused after a few, in time linear in its bytes.
  A container referred to this way cannot be changed afterwards (no snapshot does that; it
  would make the count wrong).
* **Traces streamed.** The lists under ``device_traces`` are not built: each batch of event
  dicts goes to a sink (:class:`memfit.allocator.snapshot_records.TraceSink`) that checks
  them and keeps them in columns, and the dicts are forgotten (never memoised: a reference
  to an event is refused). Memory stays linear in the file with a small constant. Once an
  event whose keys are memo references is read, the events of its layout that follow are
  read by :mod:`memfit.allocator.snapshot_bulk` (one regular expression for thousands of
  events, their fields kept as columns, nothing of them built as a dict), which reads
  exactly what this loop would or hands the event back to it.
* **Progress.** ``progress(done_bytes, total_bytes)`` is called every
  :data:`PROGRESS_BYTES` read.

The result is what ``pickle.loads`` would give, but with the trace lists replaced by their
sinks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Protocol

from memfit.allocator.snapshot_bulk import Bulk, LazyLists, key_token
from memfit.allocator.snapshot_records import PICKLE_HINT, printable
from memfit.errors import ConfigError

__all__ = ["PROGRESS_BYTES", "EventSink", "objects_limit", "read_pickle"]

#: Bytes read between two calls of ``progress``.
PROGRESS_BYTES = 8 << 20

#: Longest integer a snapshot pickle may spell in bytes (``LONG1``/``LONG4``): ``2**256``.
_MAX_LONG_BYTES = 32

_CONTAINERS = (dict, list, tuple, set, frozenset)
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_KEY_SCALARS = (str, int, float, bytes, bool, type(None))


def objects_limit(nbytes: int) -> int:
    """Most objects (memo references counted with everything they hold) a pickle of
    ``nbytes`` may stand for: 16 a byte, and a million more. A real snapshot stands for
    fewer than two a byte (its frame dicts and stacks are shared, each reference a few
    bytes); a memo bomb for thousands."""
    return 16 * nbytes + 1_000_000


class EventSink(Protocol):
    """Where the events of one device's trace go (``extend`` checks and keeps them)."""

    def extend(self, events: list[Any]) -> None:
        """Take a batch of event dicts."""
        ...

    def __len__(self) -> int:
        """Events taken so far."""
        ...


class _Memo(dict[int, Any]):
    """The memo: index -> object, and the next index ``MEMOIZE`` gives. A trace event takes
    an index but is not kept (a dict entry per event would cost more than the event); a
    frames list the bulk path read is kept as its tokens and built when it is referred to."""

    next = 0

    def __init__(self) -> None:
        super().__init__()
        self.lazy = LazyLists()

    def __missing__(self, key: int) -> Any:
        value = self.lazy.get(self, key) if self.lazy.index else None
        if value is None:
            raise KeyError(key)
        self[key] = value
        return value


_REFUSED: dict[int, str] = {
    0x50: "a persistent id (PERSID)",
    0x51: "a persistent id (BINPERSID)",
    0x52: "a call (REDUCE)",
    0x62: "an object's state (BUILD)",
    0x69: "a class instance (INST)",
    0x6F: "a class instance (OBJ)",
    0x81: "a class instance (NEWOBJ)",
    0x92: "a class instance (NEWOBJ_EX)",
    0x93: "a Python object (STACK_GLOBAL)",
    0x82: "the Python object registered as a copyreg extension (EXT1)",
    0x83: "the Python object registered as a copyreg extension (EXT2)",
    0x84: "the Python object registered as a copyreg extension (EXT4)",
    0x97: "an out-of-band buffer (NEXT_BUFFER)",
    0x98: "an out-of-band buffer (READONLY_BUFFER)",
}


def _refused(what: str, source: str) -> ConfigError:
    return ConfigError(
        f"the pickle names {what}; a memory snapshot holds only plain data (dicts, lists, "
        "strings, numbers), so it is refused and nothing of it is run",
        key_path=source,
        hint="only open pickles you trust; " + PICKLE_HINT,
    )


def _broken(why: str, source: str) -> ConfigError:
    return ConfigError(
        f"not a readable pickle ({why})", key_path=source, hint=PICKLE_HINT
    )  # fmt: skip


def _cut(source: str) -> ConfigError:
    return ConfigError(
        "the pickle is cut off (it ends before its STOP)",
        key_path=source,
        hint="copy the file again; a dump interrupted while it was written is incomplete",
    )


class _Reader:
    """One read of one pickle (see the module)."""

    def __init__(
        self,
        data: bytes,
        source: str,
        make_trace: Callable[[int], EventSink],
        max_objects: int,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.data = data
        self.source = source
        self.make_trace = make_trace
        self.max_objects = max_objects
        self.progress = progress
        self.built = 0
        self.weights: dict[int, int] = {}  # id -> objects it stands for (sealed containers)
        self.root: Any = None
        self.traces_list: list[Any] | None = None  # the list under "device_traces"
        self.sinks: set[int] = set()
        self.next_progress = PROGRESS_BYTES
        self.bulk: Bulk | None = None

    # -- bounds ---------------------------------------------------------------------------
    def _too_many(self) -> ConfigError:
        return ConfigError(
            f"the pickle stands for more than {self.max_objects:,} objects once its "
            "references are followed (it refers to the same data again and again); a "
            "memory snapshot of this size does not",
            key_path=self.source,
            hint="pass a file written by torch.cuda.memory._dump_snapshot(); if it is one, "
            "pass a larger max_bytes= (the bound grows with it)",
        )

    def _weight(self, obj: Any) -> int:
        """Objects ``obj`` stands for, nested ones included, counted bottom-up once per
        container (without recursion) and kept; every container counted is sealed."""
        weights = self.weights
        got = weights.get(id(obj))
        if got is not None:
            return got
        todo: list[tuple[Any, bool]] = [(obj, False)]
        open_: set[int] = set()
        while todo:
            item, children_done = todo.pop()
            key = id(item)
            if not children_done:
                if key in weights or key in open_:
                    continue
                open_.add(key)
                todo.append((item, True))
                for child in _children(item):
                    if type(child) in _CONTAINERS and id(child) not in weights:
                        todo.append((child, False))
                continue
            total = 1
            for child in _children(item):
                if type(child) in _CONTAINERS:
                    total += weights.get(id(child), 1)
                elif id(child) in self.sinks:
                    total += 1 + len(child)
                else:
                    total += 1
            weights[key] = total
        return weights[id(obj)]

    def _check_key(self, key: Any) -> None:
        """A dict key or set item hashes without recursion: a scalar or a flat tuple."""
        if type(key) in _KEY_SCALARS:
            return
        if type(key) is tuple and all(type(k) in _KEY_SCALARS for k in key):
            return
        raise _broken(
            f"a dict key or set item is a {type(key).__name__} holding containers; a "
            "snapshot's keys are strings",
            self.source,
        )

    def _mutable(self, target: Any, what: str) -> None:
        if id(target) in self.weights:
            raise _broken(
                f"it changes a {what} after referring to it (a cycle, or data rewritten); "
                "a snapshot does neither",
                self.source,
            )

    # -- roles ----------------------------------------------------------------------------
    def _new_list(self, stack: list[Any], meta: list[list[Any]]) -> Any:
        """A new empty list; a trace sink where the list is one device's trace, and the list
        under ``device_traces`` noted where it is that one.

        Where a new item goes: in a batch (``MARK`` ... ``APPENDS``/``SETITEMS``) to the
        object under the ``MARK``; alone (``APPEND``/``SETITEM``) to the object under it (and
        its key) on the stack.
        """
        root = self.root
        dt = self.traces_list
        if dt is None and root is not None and stack and stack[-1] == "device_traces":
            alone = len(stack) >= 2 and stack[-2] is root
            batch = bool(meta and meta[-1]) and meta[-1][-1] is root and len(stack) % 2 == 1
            if alone or batch:
                out: list[Any] = []
                self.traces_list = out
                return out
        if dt is not None:
            if stack and stack[-1] is dt:
                position = len(dt)
            elif (
                meta
                and meta[-1]
                and meta[-1][-1] is dt
                and (not stack or id(stack[-1]) in self.sinks)
            ):
                position = len(dt) + len(stack)
            else:
                return []
            sink = self.make_trace(position)
            self.sinks.add(id(sink))
            return sink
        return []

    def _is_event(self, stack: list[Any], meta: list[list[Any]]) -> bool:
        """Whether the dict just built (on top of ``stack``) goes into a trace sink."""
        sinks = self.sinks
        if not sinks:
            return False
        if len(stack) >= 2 and id(stack[-2]) in sinks:
            return True
        return (
            bool(meta and meta[-1])
            and id(meta[-1][-1]) in sinks
            and (len(stack) == 1 or type(stack[-2]) is dict)
        )

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> Any:
        data = self.data
        n = len(data)
        source = self.source
        stack: list[Any] = []
        meta: list[list[Any]] = []
        memo = _Memo()
        sinks = self.sinks
        weights = self.weights
        unpack_i = struct.Struct("<i").unpack_from
        unpack_h = struct.Struct("<H").unpack_from
        unpack_I = struct.Struct("<I").unpack_from
        unpack_Q = struct.Struct("<Q").unpack_from
        unpack_d = struct.Struct(">d").unpack_from
        from_bytes = int.from_bytes
        containers = _CONTAINERS
        built = 0
        limit = self.max_objects
        bulk = self.bulk = Bulk(self, memo, memo.lazy)
        pos = 0
        try:
            while True:
                op = data[pos]
                pos += 1
                if op == 0x68:  # BINGET
                    obj = memo[data[pos]]
                    pos += 1
                    if type(obj) in containers:
                        built += weights.get(id(obj)) or self._weight(obj)
                        if built > limit:
                            raise self._too_many()
                    else:
                        built += 1
                    stack.append(obj)
                elif op == 0x94:  # MEMOIZE
                    top = stack[-1]
                    if type(top) is not dict or not self._is_event(stack, meta):
                        memo[memo.next] = top
                    memo.next += 1
                elif op == 0x7D:  # EMPTY_DICT
                    built += 1
                    if self.root is None and not stack and not meta:
                        root: dict[Any, Any] = {}
                        self.root = root
                        stack.append(root)
                    else:
                        stack.append({})
                elif op == 0x28:  # MARK
                    into_sink = bool(stack) and id(stack[-1]) in sinks
                    meta.append(stack)
                    stack = []
                    if into_sink:  # a batch of trace events: the fast path reads most of them
                        pos, objects = self._events(data, pos, memo, stack, meta, limit - built)
                        built += objects
                        if built > limit:
                            raise self._too_many()
                elif op == 0x75:  # SETITEMS
                    items = stack
                    stack = meta.pop()
                    target = stack[-1]
                    if type(target) is not dict:
                        raise _broken("SETITEMS on something that is not a dict", source)
                    if id(target) in weights:
                        self._mutable(target, "dict")
                    for i in range(0, len(items) - 1, 2):
                        key = items[i]
                        if type(key) is not str:
                            self._check_key(key)
                        target[key] = items[i + 1]
                    if pos >= self.next_progress:
                        self.next_progress = self._progress(pos, n)
                    if sinks and meta and meta[-1] and id(meta[-1][-1]) in sinks:
                        # an event the fast path gave back is whole: it takes over again
                        pos, objects = self._events(data, pos, memo, stack, meta, limit - built)
                        built += objects
                        if built > limit:
                            raise self._too_many()
                elif op == 0x4B:  # BININT1
                    stack.append(data[pos])
                    pos += 1
                    built += 1
                elif op == 0x4A:  # BININT
                    stack.append(unpack_i(data, pos)[0])
                    pos += 4
                    built += 1
                elif op == 0x8A:  # LONG1
                    size = data[pos]
                    if size > _MAX_LONG_BYTES:
                        raise _broken(f"an integer of {size} bytes", source)
                    stack.append(from_bytes(data[pos + 1 : pos + 1 + size], "little", signed=True))
                    pos += 1 + size
                    built += 1
                elif op == 0x4D:  # BININT2
                    stack.append(unpack_h(data, pos)[0])
                    pos += 2
                    built += 1
                elif op == 0x8C:  # SHORT_BINUNICODE
                    size = data[pos]
                    stack.append(str(data[pos + 1 : pos + 1 + size], "utf-8", "surrogatepass"))
                    pos += 1 + size
                    built += 1
                elif op == 0x6A:  # LONG_BINGET
                    obj = memo[unpack_I(data, pos)[0]]
                    pos += 4
                    if type(obj) in containers:
                        built += weights.get(id(obj)) or self._weight(obj)
                        if built > limit:
                            raise self._too_many()
                    else:
                        built += 1
                    stack.append(obj)
                elif op == 0x65:  # APPENDS
                    items = stack
                    stack = meta.pop()
                    target = stack[-1]
                    if id(target) in sinks:
                        target.extend(items)
                    elif type(target) is list:
                        if id(target) in weights:
                            self._mutable(target, "list")
                        target.extend(items)
                    else:
                        raise _broken("APPENDS to something that is not a list", source)
                    if pos >= self.next_progress:
                        self.next_progress = self._progress(pos, n)
                    if built > limit:
                        raise self._too_many()
                elif op == 0x5D:  # EMPTY_LIST
                    built += 1
                    stack.append(self._new_list(stack, meta))
                elif op == 0x95:  # FRAME
                    pos += 8
                    if pos >= self.next_progress:
                        self.next_progress = self._progress(pos, n)
                elif op == 0x61:  # APPEND
                    item = stack.pop()
                    target = stack[-1]
                    if id(target) in sinks:
                        target.extend([item])
                    elif type(target) is list:
                        if id(target) in weights:
                            self._mutable(target, "list")
                        target.append(item)
                    else:
                        raise _broken("APPEND to something that is not a list", source)
                elif op == 0x73:  # SETITEM
                    value = stack.pop()
                    key = stack.pop()
                    target = stack[-1]
                    if type(target) is not dict:
                        raise _broken("SETITEM on something that is not a dict", source)
                    if id(target) in weights:
                        self._mutable(target, "dict")
                    if type(key) is not str:
                        self._check_key(key)
                    target[key] = value
                elif op == 0x71:  # BINPUT
                    bulk.on = False  # memo indices named: the bulk path decodes none
                    top = stack[-1]
                    if type(top) is not dict or not self._is_event(stack, meta):
                        memo[data[pos]] = top
                    pos += 1
                elif op == 0x72:  # LONG_BINPUT
                    bulk.on = False
                    top = stack[-1]
                    if type(top) is not dict or not self._is_event(stack, meta):
                        memo[unpack_I(data, pos)[0]] = top
                    pos += 4
                elif op == 0x47:  # BINFLOAT
                    stack.append(unpack_d(data, pos)[0])
                    pos += 8
                    built += 1
                elif op == 0x4E:  # NONE
                    stack.append(None)
                elif op == 0x88:  # NEWTRUE
                    stack.append(True)
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                elif op in (0x85, 0x86, 0x87):  # TUPLE1, TUPLE2, TUPLE3
                    size = op - 0x84
                    if len(stack) < size:
                        raise _broken("a tuple of items that are not there", source)
                    tup = tuple(stack[-size:])
                    del stack[-size:]
                    stack.append(tup)
                    built += 1
                elif op == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif op == 0x74:  # TUPLE
                    tup = tuple(stack)
                    stack = meta.pop()
                    stack.append(tup)
                    built += 1
                elif op == 0x58:  # BINUNICODE
                    size = unpack_I(data, pos)[0]
                    stack.append(str(data[pos + 4 : pos + 4 + size], "utf-8", "surrogatepass"))
                    pos += 4 + size
                    built += 1
                elif op == 0x8D:  # BINUNICODE8
                    size = unpack_Q(data, pos)[0]
                    stack.append(str(data[pos + 8 : pos + 8 + size], "utf-8", "surrogatepass"))
                    pos += 8 + size
                    built += 1
                elif op == 0x8B:  # LONG4
                    size = unpack_i(data, pos)[0]
                    if not 0 <= size <= _MAX_LONG_BYTES:
                        raise _broken(f"an integer of {size} bytes", source)
                    stack.append(from_bytes(data[pos + 4 : pos + 4 + size], "little", signed=True))
                    pos += 4 + size
                    built += 1
                elif op in (0x43, 0x42, 0x8E, 0x96):  # SHORT_BINBYTES, BINBYTES(8), BYTEARRAY8
                    if op == 0x43:
                        size, head = data[pos], 1
                    elif op == 0x42:
                        size, head = unpack_I(data, pos)[0], 4
                    else:
                        size, head = unpack_Q(data, pos)[0], 8
                    chunk = data[pos + head : pos + head + size]
                    stack.append(bytearray(chunk) if op == 0x96 else bytes(chunk))
                    pos += head + size
                    built += 1
                elif op in (0x55, 0x54):  # SHORT_BINSTRING, BINSTRING (Python 2 str)
                    size, head = (data[pos], 1) if op == 0x55 else (unpack_i(data, pos)[0], 4)
                    if size < 0:
                        raise _broken("a string of negative length", source)
                    stack.append(str(data[pos + head : pos + head + size], "ascii"))
                    pos += head + size
                    built += 1
                elif op == 0x8F:  # EMPTY_SET
                    stack.append(set())
                    built += 1
                elif op == 0x90:  # ADDITEMS
                    items = stack
                    stack = meta.pop()
                    target = stack[-1]
                    if type(target) is not set:
                        raise _broken("ADDITEMS to something that is not a set", source)
                    self._mutable(target, "set")
                    for item in items:
                        self._check_key(item)
                    target.update(items)
                elif op == 0x91:  # FROZENSET
                    for item in stack:
                        self._check_key(item)
                    frozen = frozenset(stack)
                    stack = meta.pop()
                    stack.append(frozen)
                    built += 1
                elif op == 0x64:  # DICT
                    items = stack
                    stack = meta.pop()
                    made: dict[Any, Any] = {}
                    for i in range(0, len(items) - 1, 2):
                        self._check_key(items[i])
                        made[items[i]] = items[i + 1]
                    stack.append(made)
                    built += 1
                elif op == 0x6C:  # LIST
                    items = stack
                    stack = meta.pop()
                    stack.append(items)
                    built += 1
                elif op == 0x30:  # POP
                    if stack:
                        stack.pop()
                    else:
                        stack = meta.pop()
                elif op == 0x31:  # POP_MARK
                    stack = meta.pop()
                elif op == 0x32:  # DUP
                    top = stack[-1]
                    if type(top) in containers:
                        built += self._weight(top)
                    stack.append(top)
                elif op == 0x80:  # PROTO
                    if not 2 <= data[pos] <= 5:
                        raise _broken(f"pickle protocol {data[pos]}", source)
                    pos += 1
                elif op in (0x49, 0x4C, 0x46, 0x56, 0x53, 0x70, 0x67):
                    pos, objects = self._text_op(op, data, pos, stack, memo)
                    built += objects
                elif op == 0x2E:  # STOP
                    if meta or len(stack) != 1:
                        raise _broken("it stops with its stack unfinished", source)
                    if self.progress is not None:
                        self.progress(n, n)
                    self.built = built
                    return stack[0]
                elif op == 0x63:  # GLOBAL: name the object in the message, import nothing
                    end = data.index(b"\n", pos)
                    end2 = data.index(b"\n", end + 1)
                    module = printable(data[pos:end].decode("utf-8", "replace"))
                    name = printable(data[end + 1 : end2].decode("utf-8", "replace"))
                    raise _refused(f"the Python object {module}.{name}", source)
                elif op in _REFUSED:
                    if (
                        op == 0x93
                        and len(stack) >= 2
                        and all(isinstance(x, str) for x in stack[-2:])
                    ):
                        what = f"the Python object {printable(stack[-2])}.{printable(stack[-1])}"
                        raise _refused(what, source)
                    raise _refused(_REFUSED[op], source)
                else:
                    raise _broken(f"unknown opcode 0x{op:02x} at byte {pos - 1}", source)
        except ConfigError:
            raise
        except IndexError:
            if pos >= n or (not stack and not meta):
                raise _cut(source) from None
            raise _broken("a reference to something that is not there", source) from None
        except KeyError:
            raise _broken(
                "a memo reference to nothing kept (never stored, or a trace event: an event "
                "is kept once, never referred to again)",
                source,
            ) from None
        except (ValueError, struct.error) as exc:
            if pos >= n:
                raise _cut(source) from None
            raise _broken(printable(str(exc)), source) from None
        except (UnicodeDecodeError, TypeError) as exc:
            raise _broken(printable(str(exc)), source) from None

    def _events(  # one event's opcodes, inline: the bulk of a large snapshot
        self,
        data: bytes,
        pos: int,
        memo: _Memo,
        items: list[Any],
        meta: list[list[Any]],
        budget: int,
    ) -> tuple[int, int]:
        """Read trace events in the layout ``pickle`` writes them (``EMPTY_DICT``, a memo
        put, ``MARK``, key and value pairs, ``SETITEMS``) into ``items``, as many as come.

        The same opcodes as the main loop, for the few that make up an event (integers,
        strings, memo references, ``None``, a frames list of memo references), without the
        stack: about twice as fast (``docs/benchmarks.md``). At anything else the event is
        given back (its bytes and its memo entries) for the main loop to read. Once an event
        whose keys are memo references is read, the events of its shape that follow go to
        the sink (``meta[-1][-1]``) by the bulk path (:mod:`.snapshot_bulk`), in columns.

        Returns:
            Where the main loop goes on, and the objects read (memo references counted with
            what they hold).

        Raises:
            ConfigError: When the events stand for more than ``budget`` objects.
        """
        unpack_i = _I32
        unpack_h = _U16
        unpack_I = _U32
        from_bytes = int.from_bytes
        weights = self.weights
        containers = _CONTAINERS
        built = 0
        n = len(data)
        bulk = self.bulk
        sink = meta[-1][-1]
        keys: list[tuple[bytes | None, str]] | None = None
        while pos < n and data[pos] == 0x7D:
            if bulk is not None and bulk.on and bulk.current is not None:
                if items:  # the events before go first
                    sink.extend(items)
                    items.clear()
                pos, memo.next, objects = bulk.run(data, pos, memo.next, sink, budget - built)
                built += objects
                if pos >= n or data[pos] != 0x7D:
                    break
            keys = [] if bulk is not None and bulk.on else None
            start = pos
            first_memo = memo.next
            objects = 1
            pos += 1
            op = data[pos]
            if op == 0x94:  # the event's index is taken, the event not kept
                memo.next += 1
                pos += 1
            elif op == 0x71 or op == 0x72:  # memo indices named: no bulk path
                pos += 2 if op == 0x71 else 5
                if bulk is not None:
                    bulk.on = False
                    keys = None
            if data[pos] != 0x28:
                op = -1
            else:
                pos += 1
                event: dict[str, Any] = {}
                while True:
                    op = data[pos]
                    if op == 0x75:  # SETITEMS: the event is whole
                        pos += 1
                        break
                    token = key_token(data, pos) if keys is not None else None
                    if op == 0x68:
                        key = memo[data[pos + 1]]
                        pos += 2
                    elif op == 0x6A:
                        key = memo[unpack_I(data, pos + 1)[0]]
                        pos += 5
                    elif op == 0x8C:
                        size = data[pos + 1]
                        key = str(data[pos + 2 : pos + 2 + size], "utf-8", "surrogatepass")
                        pos += 2 + size
                        if data[pos] == 0x94:
                            memo[memo.next] = key
                            memo.next += 1
                            pos += 1
                    else:
                        op = -1
                        break
                    if type(key) is not str:
                        op = -1
                        break
                    if keys is not None:
                        keys.append((token, key))
                    op = data[pos]
                    if op == 0x8A:  # LONG1
                        size = data[pos + 1]
                        if size > _MAX_LONG_BYTES:
                            op = -1
                            break
                        value: Any = from_bytes(
                            data[pos + 2 : pos + 2 + size], "little", signed=True
                        )
                        pos += 2 + size
                    elif op == 0x4A:  # BININT
                        value = unpack_i(data, pos + 1)[0]
                        pos += 5
                    elif op == 0x4B:  # BININT1
                        value = data[pos + 1]
                        pos += 2
                    elif op == 0x4D:  # BININT2
                        value = unpack_h(data, pos + 1)[0]
                        pos += 3
                    elif op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                        if op == 0x68:
                            value = memo[data[pos + 1]]
                            pos += 2
                        else:
                            value = memo[unpack_I(data, pos + 1)[0]]
                            pos += 5
                        if type(value) in containers:
                            objects += weights.get(id(value)) or self._weight(value)
                    elif op == 0x8C:  # SHORT_BINUNICODE (+ MEMOIZE)
                        size = data[pos + 1]
                        value = str(data[pos + 2 : pos + 2 + size], "utf-8", "surrogatepass")
                        pos += 2 + size
                        if data[pos] == 0x94:
                            memo[memo.next] = value
                            memo.next += 1
                            pos += 1
                    elif op == 0x4E:  # NONE
                        value = None
                        pos += 1
                    elif op == 0x5D:  # EMPTY_LIST: frames, as memo references to frame dicts
                        value = []
                        pos += 1
                        if data[pos] == 0x94:
                            memo[memo.next] = value
                            memo.next += 1
                            pos += 1
                        else:
                            op = -1
                            break
                        single = data[pos] != 0x28
                        if not single:
                            pos += 1
                        while True:
                            op = data[pos]
                            if op == 0x68:
                                item = memo[data[pos + 1]]
                                pos += 2
                            elif op == 0x6A:
                                item = memo[unpack_I(data, pos + 1)[0]]
                                pos += 5
                            elif op == 0x65 and not single:  # APPENDS
                                pos += 1
                                break
                            elif single and op != 0x61:  # an empty list: the next key
                                break
                            else:
                                op = -1
                                break
                            if type(item) in containers:
                                objects += weights.get(id(item)) or self._weight(item)
                            else:
                                objects += 1
                            value.append(item)
                            if single:
                                if data[pos] != 0x61:  # APPEND
                                    op = -1
                                    break
                                pos += 1
                                break
                        if op == -1:
                            break
                    else:
                        op = -1
                        break
                    event[key] = value
                    objects += 2
            if op == -1:  # not an event the fast path reads: give it back
                for index in range(first_memo, memo.next):
                    memo.pop(index, None)
                memo.next = first_memo
                return start, built
            items.append(event)
            built += objects
            if keys is not None and bulk is not None:
                bulk.learn(keys)
        return pos, built

    def _progress(self, pos: int, n: int) -> int:
        if self.progress is not None:
            self.progress(pos, n)
        return pos + PROGRESS_BYTES

    def _text_op(
        self, op: int, data: bytes, pos: int, stack: list[Any], memo: _Memo
    ) -> tuple[int, int]:
        """The protocol 0 opcodes a protocol 2 pickle may still use: a value spelled as a
        line of text (INT, LONG, FLOAT, UNICODE, STRING) or a memo index (PUT, GET).

        Returns:
            Where the next opcode starts, and how many objects this one stands for.
        """
        objects = 1
        end = data.index(b"\n", pos)
        line = data[pos:end]
        if len(line) > 64 and op in (0x49, 0x4C, 0x46, 0x70, 0x67):
            raise _broken("a number of more than 64 characters", self.source)
        text = line.decode("ascii")
        if op == 0x49:  # INT (also True and False)
            stack.append(True if text == "01" else False if text == "00" else int(text))
        elif op == 0x4C:  # LONG
            stack.append(int(text.rstrip("L")))
        elif op == 0x46:  # FLOAT
            stack.append(float(text))
        elif op == 0x56:  # UNICODE (raw-unicode-escape)
            stack.append(line.decode("raw-unicode-escape"))
        elif op == 0x53:  # STRING (a quoted Python 2 str)
            if len(text) < 2 or text[0] != text[-1] or text[0] not in "'\"":
                raise _broken("a STRING that is not quoted", self.source)
            stack.append(text[1:-1])
        elif op == 0x70:  # PUT
            if self.bulk is not None:
                self.bulk.on = False
            memo[int(text)] = stack[-1]
        else:  # GET
            obj = memo[int(text)]
            if type(obj) in _CONTAINERS:
                objects = self._weight(obj)
            stack.append(obj)
        return end + 1, objects


def _children(obj: Any) -> Any:
    if type(obj) is dict:
        return [*obj.keys(), *obj.values()]
    if type(obj) in (list, tuple, set, frozenset):
        return obj
    return ()


def read_pickle(
    data: bytes,
    *,
    source: str,
    make_trace: Callable[[int], EventSink],
    max_objects: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """Read a pickle of plain data (see the module): what ``pickle.loads`` would give, the
    lists under ``device_traces`` replaced by the sinks ``make_trace(device)`` returned.

    Args:
        data: The pickle's bytes.
        source: The file, for messages.
        make_trace: A new sink for the trace of device ``device``.
        max_objects: Most objects it may stand for (default :func:`objects_limit`).
        progress: ``progress(done, total)`` in bytes, every :data:`PROGRESS_BYTES`.

    Raises:
        ConfigError: When it names a Python object, is cut off, is not a pickle of plain
            data, stands for more than ``max_objects`` objects, or a sink refuses an event.
    """
    limit = objects_limit(len(data)) if max_objects is None else max_objects
    return _Reader(data, source, make_trace, limit, progress).run()
