"""Loading a workload: bundled names and variants, strict YAML, validation."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from memfit._checks import MAX_INT_DIGITS, require, too_many_digits
from memfit._plain import deep_merge
from memfit._userfiles import file_error, read_user_text, strip_bom
from memfit.core._workload_errors import translate_validation_error
from memfit.core._workload_schema import Workload
from memfit.errors import ConfigError, did_you_mean

#: Folder of the bundled workload files, shipped inside the package.
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "workloads"


def bundled_names() -> list[str]:
    """Names of the bundled workloads and their variants (``brax_humanoid_ppo@quick``)."""
    names: list[str] = []
    for path in sorted(BUNDLED_DIR.glob("*.yaml")):
        names.append(path.stem)
        try:
            data = _load_yaml(path.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            continue
        variants = data.get("variants") if isinstance(data, dict) else None
        if isinstance(variants, dict):
            names.extend(f"{path.stem}@{v}" for v in variants)
    return names


def _resolve(ref: str | Path) -> tuple[Path, str | None]:
    """Find the file for a path or a bundled name; split off an ``@variant``."""
    text = str(ref)
    variant: str | None = None
    path = Path(text)
    if not path.is_file() and "@" in text:
        text, variant = text.rsplit("@", 1)
        path = Path(text)
    if path.is_file():
        return path, variant
    bundled = BUNDLED_DIR / f"{text}.yaml"
    if bundled.is_file() and "/" not in text and "\\" not in text:
        return bundled, variant  # a bundled name wins over a folder of the same name
    if path.exists():
        return path, variant  # a folder: reading it says so
    known = [p.stem for p in sorted(BUNDLED_DIR.glob("*.yaml"))]
    raise ConfigError(
        f"no workload file or bundled workload named {text!r}",
        hint=did_you_mean(
            text,
            known,
            otherwise=f"give a path to a YAML file, or one of: {', '.join(known)} "
            "(memfit examples)",
        ),
    )


def command_ref(workload: Workload) -> str:
    """How a memfit command names ``workload``, for a hint to paste: a bundled workload by its
    name (``brax_humanoid_ppo@production``), a file by its path (with its ``@variant``),
    shell-quoted where it needs it; one read from stdin or built in code by its name."""
    import shlex

    if workload.source is None:
        return workload.name
    path = Path(workload.source)
    with contextlib.suppress(OSError):
        if path.parent.resolve() == BUNDLED_DIR.resolve() or not path.is_file():
            return workload.name
    variant = workload.name.partition("@")[2]
    return shlex.quote(workload.source + (f"@{variant}" if variant else ""))


#: The largest workload file memfit reads (the bundled ones take a few KiB).
MAX_WORKLOAD_BYTES = 256 * 2**10


def load_workload(ref: str | Path | Workload, *, variant: str | None = None) -> Workload:
    """Load and validate a workload file or a bundled workload.

    Args:
        ref: A path to a YAML file, a bundled name (``"dqn_fire_raster"``), a bundled name with
            a variant (``"brax_humanoid_ppo@production"``), or an already loaded workload.
        variant: A variant to apply (same as ``@variant``).

    Returns:
        The validated workload.

    Raises:
        ConfigError: When the file is missing, is not valid YAML (the key path is
            ``file:line:column``), has an unknown key (with a did-you-mean hint), or a value of
            the wrong type or out of range (the key path names it), or the variant is unknown.
    """
    require_workload("ref", ref)
    require("variant", variant, "str", optional=True)
    if isinstance(ref, Workload):
        return ref
    try:
        path, at_variant = _resolve(ref)
    except OSError as exc:  # a path the system cannot even look up (a name too long, ...)
        raise file_error(exc, str(ref), action="read the workload file") from exc
    text = read_user_text(path, what="the workload file", max_bytes=MAX_WORKLOAD_BYTES)
    return parse_workload(
        text, source=str(path), variant=variant or at_variant, default_name=path.stem
    )


#: Most nodes a workload file may stand for with its aliases expanded (the bundled ones have
#: a few hundred; a file with a few thousand lines has a few tens of thousands).
MAX_YAML_NODES = 200_000


def check_expansion(root: yaml.Node) -> None:
    """Refuse a YAML document whose aliases expand to more than :data:`MAX_YAML_NODES` nodes.

    An alias is the anchored node itself (PyYAML composes it once), so the document is a
    graph; its expanded size is counted bottom-up with each node's size kept, in time linear
    in the graph's nodes and edges, whatever the expansion.

    Raises:
        yaml.constructor.ConstructorError: At the root's mark, saying how large it would be.
    """
    sizes: dict[int, int] = {}
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, children_done = todo.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            sizes[key] = 1
            continue
        if not children_done:
            sizes[key] = 0  # a cycle through an alias counts as the node itself
            todo.append((node, True))
            todo.extend((c, False) for c in children if id(c) not in sizes)
            continue
        total = 1 + sum(sizes.get(id(c), 1) for c in children)
        if total > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the file's aliases (*name) expand to more than {MAX_YAML_NODES:,} values; "
                "a workload is a few hundred",
                node.start_mark,
            )
        sizes[key] = total


class _UniqueKeys:
    """A key given twice in one mapping is an error (PyYAML keeps the last silently, so a
    second ``knobs:`` section would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor`: merged below, its keys overridable as YAML allows
            key = self.construct_object(key_node, deep=deep)  # type: ignore[attr-defined]
            if isinstance(key, (str, int, float, bool)) and key in seen:
                first = seen[key].start_mark
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first.line + 1})",
                    key_node.start_mark,
                )
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc,no-any-return]

    def _refuse_base_60(self, node: yaml.ScalarNode) -> None:
        text = str(node.value)
        if ":" in text:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"{text!r} is a base-60 number in YAML 1.1 (1:30 reads as 90); memfit refuses "
                "it rather than guess",
                node.start_mark,
            )

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        self._refuse_base_60(node)
        text = str(node.value)
        digits = sum(1 for c in text if c.isdigit())
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                too_many_digits(digits),
                node.start_mark,
            )
        # its size is the schema's to check, with the key's path (every integer < 2**63)
        return int(super().construct_yaml_int(node))  # type: ignore[misc]

    def get_single_data(self) -> Any:
        """The document, composed first and refused when its aliases would expand to more
        than :data:`MAX_YAML_NODES` nodes (a "billion laughs" file: nine levels of nine
        aliases are 387 million nodes once expanded, from a few hundred bytes)."""
        node = self.get_single_node()  # type: ignore[attr-defined]
        if node is None:
            return None
        check_expansion(node)
        return self.construct_document(node)  # type: ignore[attr-defined]

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        self._refuse_base_60(node)
        return float(super().construct_yaml_float(node))  # type: ignore[misc]


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """PyYAML's safe loader with :class:`_UniqueKeys`: its error messages are the ones users
    see."""


_C_LOADER = getattr(yaml, "CSafeLoader", None)
#: The same checks on libyaml's parser (ten times faster; None without libyaml). A file it
#: refuses is read again with :class:`_UniqueKeyLoader` for the message.
_FastLoader: Any = type("_FastLoader", (_UniqueKeys, _C_LOADER), {}) if _C_LOADER else None


def _load_yaml(text: str) -> Any:
    if _FastLoader is not None:
        # a file libyaml refuses is read again below: that loader's message is the one users know
        with contextlib.suppress(yaml.YAMLError):
            return yaml.load(text, Loader=_FastLoader)
    return yaml.load(text, Loader=_UniqueKeyLoader)


for _loader in (_UniqueKeyLoader, _FastLoader):
    if _loader is not None:  # YAML 1.1 base-60 numbers refused by both parsers
        _loader.add_constructor("tag:yaml.org,2002:int", _UniqueKeys.construct_yaml_int)  # type: ignore[type-var]
        _loader.add_constructor("tag:yaml.org,2002:float", _UniqueKeys.construct_yaml_float)  # type: ignore[type-var]


def _yaml_hint(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or ""
    if problem.startswith("duplicate key"):
        return "give each key once; merge the two entries into one"
    if "constructor for the tag" in problem:
        return "workload files are plain YAML: remove the '!!' tag"
    if "'\\t'" in problem:
        return "indent with spaces; YAML does not allow tabs"
    if "base-60" in problem:
        return "write the number itself (90), or quote the text ('1:30')"
    if "aliases" in problem:
        return "write the values out, or use fewer aliases of aliases"
    if "digits" in problem:
        return "give the count or size itself: at most 19 digits, under 2**63"
    return "check the indentation and the punctuation (':', '-', quotes) at that spot"


_SURROGATE = re.compile("[\ud800-\udfff]")


#: Deepest nesting a workload file may have (the bundled ones are five levels deep).
MAX_WORKLOAD_DEPTH = 64


def _check_tree(data: Any, source: str) -> None:
    """Refuse nesting deeper than :data:`MAX_WORKLOAD_DEPTH` and text holding a lone
    surrogate (a ``"\\ud800"`` escape: no file or terminal encoding can write it back).

    Raises:
        ConfigError: Naming the key where it is.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_WORKLOAD_DEPTH:
            raise ConfigError(
                "the YAML is nested too deeply to read (hundreds of levels or more)",
                key_path=source,
                hint="a workload file is a few levels deep; check that this is the right file",
            )
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise ConfigError(
                    f"text with a lone surrogate ({value.encode('utf-8', 'backslashreplace')!r})",
                    key_path=where or source,
                    hint="a \\uD800-\\uDFFF escape must be half of a pair; write the "
                    "character itself",
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, where or source, depth + 1))
                stack.append((item, f"{where}.{key}" if where else str(key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def parse_workload(
    text: str, *, source: str = "<workload>", variant: str | None = None, default_name: str = ""
) -> Workload:
    """Validate workload YAML text (see :func:`load_workload`).

    Raises:
        ConfigError: On a syntax error, an unknown key, a wrong type or range, or an unknown
            variant; the key path says where.
    """
    text = strip_bom(text, source=source, what="the workload file")
    try:
        data = _load_yaml(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = exc.problem or "invalid YAML"
        bounded = "digits" in problem or "aliases" in problem  # read, but past a bound
        raise ConfigError(
            problem if bounded else f"YAML syntax error: {problem}",
            key_path=where,
            hint=_yaml_hint(exc),
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"YAML error: {exc}", key_path=source, hint="check that the file is YAML"
        ) from exc
    except RecursionError:
        raise ConfigError(
            "the YAML is nested too deeply to read (hundreds of levels or more)",
            key_path=source,
            hint="a workload file is a few levels deep; check that this is the right file",
        ) from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise ConfigError(
            f"a value of the workload cannot be read: {exc}",
            key_path=source,
            hint="sizes and counts in a workload file are numbers of at most 20 digits",
        ) from None
    _check_tree(data, source)
    if not isinstance(data, dict):
        raise ConfigError(
            "a workload file must be a mapping of keys to values",
            key_path=source,
            hint="start with 'family: ppo' (see docs/workload.md)",
        )
    variants = data.pop("variants", None)
    if variants is not None and not isinstance(variants, dict):
        raise ConfigError(
            "variants must be a mapping of name -> overrides",
            key_path="variants",
            hint="write variants: {quick: {knobs: ...}}",
        )
    if variant is not None and variant != "default":
        if not variants or variant not in variants:
            known = sorted(variants or {})
            raise ConfigError(
                f"unknown variant {variant!r}",
                key_path="variants",
                hint=f"variants here: {', '.join(known)}" if known else "this file has none",
            )
        override = variants[variant]
        if not isinstance(override, dict):
            raise ConfigError(
                "a variant must be a mapping",
                key_path=f"variants.{variant}",
                hint="a variant holds the keys it changes, e.g. {knobs: {num_envs: ...}}",
            )
        data = deep_merge(data, override)
        data.setdefault("name", default_name)
        data["name"] = f"{data['name']}@{variant}"
    data.setdefault("name", default_name or "workload")
    data["source"] = source
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        raise translate_validation_error(exc, text, source, variant) from None


def require_workload(name: str, value: object) -> None:
    """Check that ``value`` names a workload: a ``Workload``, a path or a bundled name.

    Raises:
        ConfigError: Otherwise, with ``name`` as the key path.
    """
    if not isinstance(value, Workload):
        require(
            name,
            value,
            "path",
            hint="pass a Workload, the path of a workload file, or a bundled name "
            "(memfit examples lists them)",
        )
