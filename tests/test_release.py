"""Release integrity: the wheel carries the commented defaults and runs outside the checkout with the same
effective configuration; stored state and manifests of an unknown version are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from flink_memory import config as config_module
from flink_memory.chunking.manifest import SCHEMA_VERSION, ManifestMismatch, build_manifest, load_verified
from flink_memory.config import CHECKOUT_CONF, ConfigError, load_config
from flink_memory.digests import digest_messages
from flink_memory.migrations import decode_state, encode_state
from flink_memory.state_layout import STATE_VERSION, StateVersionError

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = "flink_memory/conf/flink-memory.yaml"


# --- fast: versions and the defaults file -------------------------------------------------------------------


def sealed_manifest() -> str:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    manifest = build_manifest(agent_id="a", source_id="c", input_digest="i" * 32, policy_fingerprint="p",
                              method="semantic", chunks=[{"index": 0, "start": 0, "end": 2, "messages": messages,
                                                          "tokens": 9, "oversized": False}])
    assert manifest.chunks[0].digest == digest_messages(messages)
    return manifest.model_dump_json()


def test_manifest_of_an_unknown_schema_version_is_refused_by_name():
    stored = sealed_manifest()
    assert load_verified(stored, input_digest="i" * 32, policy_fingerprint="p").schema_version == SCHEMA_VERSION
    newer = json.loads(stored)
    newer["schema_version"] = SCHEMA_VERSION + 1
    newer["new_field"] = [1, 2]  # a later layout need not parse as ours: the version is checked first
    with pytest.raises(ManifestMismatch, match=f"schema_version {SCHEMA_VERSION + 1}; this release reads only"):
        load_verified(json.dumps(newer), input_digest="i" * 32, policy_fingerprint="p")
    unversioned = {k: v for k, v in json.loads(stored).items() if k != "schema_version"}
    with pytest.raises(ManifestMismatch, match="schema_version None"):
        load_verified(json.dumps(unversioned), input_digest="i" * 32, policy_fingerprint="p")
    with pytest.raises(ManifestMismatch, match="not a JSON object"):
        load_verified("[1, 2]", input_digest="i" * 32, policy_fingerprint="p")


def test_state_of_an_unknown_version_is_refused_by_name():
    data = {"next_seq": 3, "batches": [{"seq": 1}]}
    assert decode_state(encode_state(data), None) == data
    assert decode_state(None, {"empty": True}) == {"empty": True}  # a key with no state yet
    newer = json.dumps({"v": STATE_VERSION + 1, "d": data})
    with pytest.raises(StateVersionError, match=f"version {STATE_VERSION + 1} is not readable.*reads version "
                                                f"{STATE_VERSION}.*without --restore"):
        decode_state(newer, None)
    for foreign in ('{"next_seq": 3}', "[1, 2]", '"text"'):
        with pytest.raises(StateVersionError, match="no version tag"):
            decode_state(foreign, None)
    with pytest.raises(StateVersionError, match="not JSON"):
        decode_state("{broken", None)


def test_checkout_reads_the_top_level_conf_and_keeps_no_second_copy():
    assert config_module.PACKAGE_CONF == CHECKOUT_CONF == ROOT / "conf" / "flink-memory.yaml"
    # the packaged copy exists only in a built wheel (setup.py copies it): a second copy in the source tree
    # could drift from conf/ and would shadow it
    assert not (ROOT / PACKAGED).exists()


def test_missing_defaults_file_is_an_error_not_built_in_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(config_module, "PACKAGE_CONF", tmp_path / "nowhere" / "flink-memory.yaml")
    with pytest.raises(ConfigError, match="default configuration is missing from this installation"):
        load_config(None, environ={})
    assert load_config(CHECKOUT_CONF, environ={}).llm.model  # an explicit file still works


# --- slow: build, install outside the checkout, compare ----------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """No FLINK_MEMORY__ overrides, no PYTHONPATH: both sides read only their defaults file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_MEMORY__") and k != "PYTHONPATH"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this checkout (through its sdist, as a release is), installed in a fresh venv.

    The venv gets the project venv's site-packages on its path through a .pth (the dependencies, Flink
    included, are ~900 MB): that directory is not a site dir there, so the editable install's hooks in it
    never run, and flink_memory comes from the wheel alone."""
    tmp = tmp_path_factory.mktemp("release")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], check=True,
                   capture_output=True, text=True, timeout=600)
    wheel = next(dist.glob("flink_memory-*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    outside = tmp / "elsewhere"
    outside.mkdir()
    return {"wheel": wheel, "venv": venv, "python": python, "site": site, "cwd": outside}


@pytest.mark.slow
def test_wheel_carries_the_defaults_and_type_marker_and_no_tests(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
        assert wheel.read(PACKAGED) == (ROOT / "conf" / "flink-memory.yaml").read_bytes()  # cannot drift
        assert "flink_memory/py.typed" in names
        for part in ("rows.npy", "scales.npy", "tokenizer.json", "json"):  # the default embedding model
            assert f"flink_memory/embeddings/data/e5-static.{part}" in names
        assert "flink_memory/embeddings/data/all-minilm-l6-v2.tokenizer.json" in names  # (the minilm extra's)
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
        metadata = wheel.read(f"{dist_info}/METADATA").decode()
        notice = wheel.read(f"{dist_info}/licenses/NOTICE").decode()
        top_level = wheel.read(f"{dist_info}/top_level.txt").decode().split()
    assert "flink-memory = flink_memory.cli:main" in entry_points
    # the static model's word list comes from wordfreq's CC BY-SA 4.0 lists: the metadata and NOTICE say so
    assert "License-Expression: Apache-2.0 AND CC-BY-SA-4.0" in metadata
    assert "CC BY-SA 4.0" in notice and "flink_memory/embeddings/data/" in notice and "MIT" in notice
    assert top_level == ["flink_memory"]
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n or Path(n).name.startswith("test_")]
    assert all(n.startswith(("flink_memory/", dist_info)) for n in names)


@pytest.mark.slow
def test_installed_wheel_runs_the_same_effective_config_as_the_checkout(installed):
    checkout = subprocess.run([sys.executable, "-m", "flink_memory.cli", "config"], cwd=ROOT, env=clean_env(),
                              check=True, capture_output=True, text=True, timeout=120).stdout
    wheel = subprocess.run([str(installed["venv"] / "bin" / "flink-memory"), "config"], cwd=installed["cwd"],
                           env=clean_env(), check=True, capture_output=True, text=True, timeout=120).stdout
    assert "chunking fingerprint" in checkout and "summarization fingerprint" in checkout
    assert wheel == checkout
    # the installed copy reads its packaged file (no silent built-in defaults): without it, a clear refusal
    packaged = installed["site"] / PACKAGED
    hidden = packaged.with_suffix(".hidden")
    packaged.rename(hidden)
    try:
        missing = subprocess.run([str(installed["venv"] / "bin" / "flink-memory"), "config"], cwd=installed["cwd"],
                                 env=clean_env(), capture_output=True, text=True, timeout=120)
    finally:
        hidden.rename(packaged)
    assert missing.returncode == 2 and "default configuration is missing from this installation" in missing.stderr


@pytest.mark.slow
def test_installed_wheel_has_the_checkouts_versions_and_reads_its_own_conf(installed):
    probe = ("import json, flink_memory, flink_memory.config as c, flink_memory.chunking.manifest as m, "
             "flink_memory.state_layout as s; print(json.dumps({'path': list(flink_memory.__path__), "
             "'conf': str(c.PACKAGE_CONF), 'schema': m.SCHEMA_VERSION, 'state': s.STATE_VERSION}))")
    found = json.loads(subprocess.run([str(installed["python"]), "-c", probe], cwd=installed["cwd"],
                                      env=clean_env(), check=True, capture_output=True, text=True).stdout)
    package = installed["site"] / "flink_memory"
    assert found["path"] == [str(package)]  # the wheel's copy only, nothing from the checkout
    assert found["conf"] == str(package / "conf" / "flink-memory.yaml")
    assert (found["schema"], found["state"]) == (SCHEMA_VERSION, STATE_VERSION)
    installed_conf = Path(found["conf"]).read_text(encoding="utf-8")
    assert installed_conf == CHECKOUT_CONF.read_text(encoding="utf-8") and installed_conf.count("\n  # ") > 20
