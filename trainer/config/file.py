"""``--config FILE``: the options of ``ilab-train`` (or InstructLab's arguments) from a JSON or
YAML file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def load_config_file(path: Path) -> dict[str, Any]:
    """Read ``--config file.json|yaml``; raises ValueError with a clear message."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ValueError(f"config {path} is not valid {path.suffix[1:] or 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a mapping of option names to values")
    return data
