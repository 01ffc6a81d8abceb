"""Loading the config: the file (`load_config`) or an already-parsed document (`parse_config`) to a `LakehouseConfig`.

In order: the YAML is read as the Go processor reads it (`go_yaml.py`); the top-level keys KafScale's Helm chart
renders into the file (`HELM_CHART_KEYS`) are dropped with a log line; `${VAR}` references are replaced from the
environment (`$${` is a literal `${`; a value that is one reference to a variable that is not set is an error naming
the key; inside other text an unset variable, and any `${...}` that is no variable name, is kept as written, as the
Go processor, which expands nothing, reads it: a secret may hold `${`); the `KAFSCALE_ICEBERG_LFS_*`
variables override `lfs` of every mapping, as in Go; the models validate strictly; relative paths and derived
defaults are resolved and the cross-key rules applied (`rules.py`). Every problem found is reported at once in one
`ConfigError` whose lines name the file and the key.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kafscale_lakehouse.config.errors import ConfigError, describe_validation_error, format_path, json_kind
from kafscale_lakehouse.config.go_yaml import ConfigYamlLoader, describe_yaml_error, plain
from kafscale_lakehouse.config.models import LakehouseConfig
from kafscale_lakehouse.config.rules import check_rules, resolve_paths_and_defaults

log = logging.getLogger(__name__)

CONFIG_PATH_ENV_VAR = "KAFSCALE_LAKEHOUSE_CONFIG"
DEFAULT_CONFIG_PATH = "lakehouse.yaml"

_ENV_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def load_config(path: str | os.PathLike[str] | None = None) -> LakehouseConfig:
    """Load and validate the config file: `path`, else `$KAFSCALE_LAKEHOUSE_CONFIG`, else `lakehouse.yaml`."""
    if path is None:
        path = os.environ.get(CONFIG_PATH_ENV_VAR) or DEFAULT_CONFIG_PATH
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        hint = f" (set {CONFIG_PATH_ENV_VAR} or pass a path)" if isinstance(exc, FileNotFoundError) else ""
        raise ConfigError(source, [f"cannot read the config file: {exc.strerror or exc}{hint}"]) from exc
    try:
        document = yaml.load(text, Loader=ConfigYamlLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        # Not chained: the parser's exception quotes the offending line, which may hold a secret.
        raise ConfigError(source, [f"not valid YAML: {describe_yaml_error(exc)}"]) from None
    if document is None:
        document = {}
    config = parse_config(document, source=source, base_dir=Path(source).resolve().parent)
    log.info("loaded config %s: %d mapping(s), %d topic pattern(s)", source, len(config.mappings),
             len(config.pattern_mappings))
    return config


def parse_config(
    mapping: Mapping[str, Any],
    source: str = "<config>",
    base_dir: str | os.PathLike[str] | None = None,
) -> LakehouseConfig:
    """Validate an already-parsed config document. Relative paths resolve against `base_dir` (default: cwd)."""
    if not isinstance(mapping, Mapping):
        kind = json_kind(plain(mapping))
        raise ConfigError(source, [f"the config must be a mapping of keys to values, not {kind}"])
    problems: list[str] = []
    expanded = _expand_env(_without_helm_chart_keys(mapping, source), (), problems)
    _apply_lfs_env_overrides(expanded, os.environ, problems)
    try:
        config = LakehouseConfig.model_validate(expanded)
    except ValidationError as exc:
        problems.extend(describe_validation_error(error, LakehouseConfig) for error in exc.errors())
        raise ConfigError(source, problems) from None
    problems.extend(resolve_paths_and_defaults(config, Path(base_dir) if base_dir is not None else Path.cwd()))
    problems.extend(check_rules(config))
    if problems:
        raise ConfigError(source, problems)
    # `mappings` holds the mappings of one topic each; the topic patterns are resolved against the topics found
    # (topic_patterns.py), so a caller that does not resolve them never sees a mapping without its topic.
    config._pattern_mappings = [(index, m) for index, m in enumerate(config.mappings) if m.topic_pattern is not None]
    config.mappings = [m for m in config.mappings if m.topic_pattern is None]
    return config


# Top-level keys KafScale's Helm chart for the Go processor renders into the config (its `config:` values go through
# `toYaml` whole): where the chart mounts the file and which ConfigMap to use instead. Nothing for the processor.
HELM_CHART_KEYS = {
    "existingConfigMap": "the Helm chart's choice of an existing ConfigMap",
    "path": "the Helm chart's mount path of this file",
}


def _without_helm_chart_keys(mapping: Mapping[str, Any], source: str) -> dict[str, Any]:
    document = dict(mapping)
    for key, meaning in HELM_CHART_KEYS.items():
        if key in document:
            value = plain(document.pop(key))
            log.info(
                "%s: ignoring top-level key %r = %r (%s; it carries nothing for kafscale-lakehouse)",
                source,
                key,
                value,
                meaning,
            )
    return document


# Environment variables that override `mappings[].lfs` of every mapping, as in the Go processor.
LFS_ENV_OVERRIDES = {
    "KAFSCALE_ICEBERG_LFS_MODE": "mode",
    "KAFSCALE_ICEBERG_LFS_MAX_INLINE_SIZE": "max_inline_size",
    "KAFSCALE_ICEBERG_LFS_STORE_METADATA": "store_metadata",
    "KAFSCALE_ICEBERG_LFS_VALIDATE_CHECKSUM": "validate_checksum",
    "KAFSCALE_ICEBERG_LFS_RESOLVE_CONCURRENCY": "resolve_concurrency",
}


def _apply_lfs_env_overrides(document: dict, environ: Mapping[str, str], problems: list[str]) -> None:
    """Set `lfs.<key>` of every mapping from the `KAFSCALE_ICEBERG_LFS_*` variables that are set and not blank (Go
    applies them before its defaults and validation). Go ignores a value it cannot parse; we report it."""
    overrides: dict[str, Any] = {}
    for variable, key in LFS_ENV_OVERRIDES.items():
        text = environ.get(variable, "").strip()
        if not text:
            continue
        if key in ("store_metadata", "validate_checksum"):
            value: Any = _GO_PARSE_BOOL.get(text)
            expected = "a boolean (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)"
        elif key == "mode":
            value, expected = text, ""
        else:
            value = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
            expected = "an integer"
        if value is None:
            problems.append(f"environment variable {variable}: {text!r} is not {expected}")
            continue
        overrides[key] = value
    mappings = document.get("mappings")
    if not overrides or not isinstance(mappings, list):
        return
    for mapping in mappings:
        lfs = mapping.get("lfs") if isinstance(mapping, dict) else None
        if isinstance(mapping, dict) and (lfs is None or isinstance(lfs, dict)):  # anything else: a type error below
            mapping["lfs"] = {**(lfs or {}), **overrides}
    log.info("lfs settings of every mapping overridden from the environment: %s", overrides)


# Go's strconv.ParseBool.
_GO_PARSE_BOOL = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


def _expand_env(value: Any, path: tuple[str | int, ...], problems: list[str]) -> Any:
    if isinstance(value, dict):
        return {key: _expand_env(item, (*path, key), problems) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, (*path, index), problems) for index, item in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if not _ENV_NAME.match(name):
            return match.group(0)  # no reference (`${a-b}`, `${}`): text, as the Go processor reads every value
        if name in os.environ:
            return os.environ[name]
        if match.group(0) == value:
            # The whole value is a reference: meant for the environment, never a secret (fail fast, name it).
            problems.append(f"{format_path(path)}: environment variable {name} is not set")
        else:
            # Inside other text (a password `p${a}ss`): kept as written, as the Go processor keeps it.
            log.warning("%s: ${%s} is kept as written: no environment variable %s is set", format_path(path),
                        name, name)
        return match.group(0)

    return _ENV_REFERENCE.sub(substitute, value)
