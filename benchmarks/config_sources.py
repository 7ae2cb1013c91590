"""Would pydantic-settings load our configuration as `load_config` does? Each case loads the shipped YAML with the
same environment and `--set` overrides both ways and compares the resulting configuration (or the error).

    python benchmarks/config_sources.py        # one line per case, then "N/M cases give the same configuration"

pydantic-settings is asked with its own sources in our order of precedence (YAML < environment < `--set`, the
`--set` values handed in as init arguments after our own dotted-name parsing), `FLINK_MEMORY__` prefix and `__`
as the nesting delimiter. docs/architecture.md ("Configuration") quotes the result.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict, YamlConfigSettingsSource

from flink_memory.config import PACKAGE_CONF, Config, ConfigError, _set_path, load_config, set_overrides


class Settings(Config, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLINK_MEMORY__", env_nested_delimiter="__", extra="forbid",
                                      yaml_file=str(PACKAGE_CONF), validate_assignment=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,  # noqa: ANN001
                                   file_secret_settings):  # noqa: ANN001
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)  # (the first one wins)


CASES: list[tuple[str, dict[str, str], list[str]]] = [
    ("defaults", {}, []),
    ("--set a number", {}, ["batching.max_items=7"]),
    ("environment: a number", {"FLINK_MEMORY__BATCHING__MAX_ITEMS": "7"}, []),
    ("--set over environment over YAML", {"FLINK_MEMORY__BATCHING__MAX_ITEMS": "7"}, ["batching.max_items=9"]),
    ("environment: a nested section", {"FLINK_MEMORY__SOURCE__KAFKA__GROUP_ID": "g"}, []),
    ("environment: text YAML reads as a number", {"FLINK_MEMORY__LLM__MODEL": "1.5"}, []),
    ("environment: a bool", {"FLINK_MEMORY__CHUNKING__SEMANTIC": "false"}, []),
    ("environment: null", {"FLINK_MEMORY__JOURNAL__PATH": "null"}, []),
    ("environment: a property name with dots", {"FLINK_MEMORY__SOURCE__KAFKA__PROPERTIES__MAX__POLL__RECORDS": "5"},
     []),
    ("environment: a misspelt key (the error names it)", {"FLINK_MEMORY__BATCHING__MAX_ITEM": "7"}, []),
]


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def ours(env: dict[str, str], sets: list[str]) -> Any:
    try:
        return load_config(None, sets, environ=env).model_dump(mode="json")
    except ConfigError as exc:
        return f"error: {exc}"


def theirs(env: dict[str, str], sets: list[str]) -> Any:
    tree: dict[str, Any] = {}
    for dotted, value, origin in set_overrides(sets):
        _set_path(tree, dotted, value, origin)
    with environment(env):
        try:
            return Settings(**tree).model_dump(mode="json")
        except Exception as exc:  # noqa: BLE001 - what it answers, whatever it is
            return f"error: {' '.join(str(exc).split())}"


def differences(a: Any, b: Any) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{s}.{k}: {a[s][k]!r} vs {b[s].get(k)!r}" for s in a for k in a[s] if a[s][k] != b[s].get(k)]
        return "; ".join(found[:2])
    return f"load_config: {str(a)[:110]} | pydantic-settings: {str(b)[:110]}"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    same = 0
    for name, env, sets in CASES:
        a, b = ours(env, sets), theirs(env, sets)
        if a == b:
            same += 1
            print(f"same     {name}")
        else:
            print(f"DIFFERS  {name}: {differences(a, b)}")
    print(f"{same}/{len(CASES)} cases give the same configuration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
