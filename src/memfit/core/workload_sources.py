"""Workloads built in code: from a dict or a YAML string, not only from files.

Both go through the same validation as a file (:func:`memfit.core.workload.parse_workload`),
so a mistake names its key path the same way.

>>> from memfit.core._workload_load import BUNDLED_DIR
>>> text = (BUNDLED_DIR / "dqn_fire_raster.yaml").read_text()
>>> workload_from_yaml(text, name="fires").family
'offpolicy'
>>> data = yaml.safe_load(text)
>>> workload_from_dict({**data, "name": "mine"}).name
'mine'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from memfit._checks import require_instance
from memfit.core._workload_load import parse_workload
from memfit.core.workload import Workload
from memfit.errors import ConfigError

__all__ = ["workload_from_dict", "workload_from_yaml"]


def workload_from_yaml(
    text: str, *, variant: str | None = None, name: str = "workload"
) -> Workload:
    """A workload from YAML text (what a workload file holds).

    Raises:
        ConfigError: As for a file: the key path says where.
    """
    require_instance(
        "text",
        text,
        str,
        what="YAML text",
        hint="pass the YAML as a str; a dict goes to workload_from_dict",
    )
    return parse_workload(text, source="<yaml text>", variant=variant, default_name=name)


def workload_from_dict(
    data: Mapping[str, Any], *, variant: str | None = None, name: str = "workload"
) -> Workload:
    """A workload from a mapping with a workload file's keys.

    Raises:
        ConfigError: When ``data`` is not a mapping of plain values, or as for a file.
    """
    require_instance(
        "data",
        data,
        Mapping,
        what="a mapping",
        hint="pass {'family': 'ppo', ...} with a workload file's keys",
    )
    try:
        text = yaml.safe_dump(dict(data), sort_keys=False)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"a value of the workload is not plain data: {exc}",
            key_path="data",
            hint="use numbers, strings, lists and dicts, as in a workload file",
        ) from exc
    return parse_workload(text, source="<dict>", variant=variant, default_name=name)
