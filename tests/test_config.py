import pytest
import yaml

from flink_memory.chunking.plans import chunking_fingerprint
from flink_memory.config import PACKAGE_CONF, Config, ConfigError, load_config
from flink_memory.summarize.prompts import summarization_fingerprint


def test_shipped_yaml_matches_model_defaults_and_lists_every_key():
    shipped = yaml.safe_load(PACKAGE_CONF.read_text())
    defaults = Config().model_dump()
    parsed = Config.model_validate(shipped).model_dump()  # as the job reads it ("30d" is 2592000 seconds)
    assert set(shipped) == set(defaults)
    for section, values in defaults.items():
        assert set(shipped[section]) == set(values), section
        assert parsed[section] == values, section


def test_precedence_file_env_set(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("batching:\n  max_items: 10\nllm:\n  model: from-file\n")
    env = {"FLINK_MEMORY__BATCHING__MAX_ITEMS": "20", "FLINK_MEMORY__LLM__TEMPERATURE": "0.5"}
    cfg = load_config(conf, ["batching.max_items=30"], environ=env)
    assert cfg.batching.max_items == 30
    assert cfg.llm.temperature == 0.5
    assert cfg.llm.model == "from-file"
    assert load_config(conf, [], environ=env).batching.max_items == 20
    assert load_config(conf, [], environ={}).batching.max_items == 10


def test_set_parses_yaml_scalars():
    cfg = load_config(None, ["chunking.semantic=false", "journal.path=null", "llm.seed=7"], environ={})
    assert cfg.chunking.semantic is False and cfg.journal.path is None and cfg.llm.seed == 7


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("batching.max_items=abc", "batching.max_items = 'abc'"),
        ("batching.max_items=0", "greater than or equal to 1"),
        ("summarization.retention=some", "summarization.retention = 'some'"),
        ("llm.nope=1", "unknown key 'llm.nope'"),
        ("nosection.x=1", "unknown section 'nosection'"),
        ("justakey", "expected section.key=value"),
    ],
)
def test_invalid_values_name_key_value_and_reason(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override], environ={})
    assert needle in str(err.value)


def test_batch_api_refused_with_semantic_chunking():
    with pytest.raises(ConfigError, match="batch_api: true is refused while chunking.semantic"):
        load_config(None, ["llm.batch_api=true"], environ={})
    with pytest.raises(ConfigError, match="batch_api: true is not supported yet"):  # (no batch API is built)
        load_config(None, ["llm.batch_api=true", "chunking.semantic=false"], environ={})


def test_openai_provider_needs_base_url():
    with pytest.raises(ConfigError, match="base_url is required"):
        load_config(None, ["llm.provider=openai"], environ={})


def test_fingerprints_change_only_with_their_settings():
    base = load_config(None, [], environ={})
    chunk = load_config(None, ["chunking.max_chunk_tokens=512"], environ={})
    batch = load_config(None, ["batching.max_items=10"], environ={})
    assert chunking_fingerprint(base) != chunking_fingerprint(chunk)
    assert summarization_fingerprint(base) == summarization_fingerprint(chunk)
    assert summarization_fingerprint(base) != summarization_fingerprint(batch)
    assert chunking_fingerprint(base) == chunking_fingerprint(batch)
    assert chunking_fingerprint(base) == chunking_fingerprint(load_config(None, ["llm.max_concurrency=9"], environ={}))


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("llm: [1, 2]\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad, environ={})


def test_store_location_defaults_beside_the_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = load_config(None, [], environ={}).store
    assert store.enabled and store.url is None
    assert store.location("out") == str(tmp_path / "out" / "memory.sqlite")
    assert store.location(f"file://{tmp_path}/o") == str(tmp_path / "o" / "memory.sqlite")
    assert load_config(None, ["store.url=m/live.sqlite"], environ={}).store.location("s3://b/out") == str(
        tmp_path / "m" / "live.sqlite")  # absolute on the client: workers run elsewhere
    url = "postgresql://flink@db:5432/memory"
    assert load_config(None, [f"store.url={url}"], environ={}).store.location("s3://b/out") == url
    assert load_config(None, ["store.enabled=false"], environ={}).store.location("s3://b/out") is None
    with pytest.raises(ConfigError, match="store.url must be set when the output is not a local path"):
        store.location("s3://bucket/out")


def test_a_relative_journal_path_is_made_absolute_on_the_client(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    journal = load_config(None, [], environ={}).journal
    assert journal.location() == str(tmp_path / ".flink-memory" / "journal.sqlite")  # workers run elsewhere
    url = "postgresql://flink@db:5432/memory"
    assert load_config(None, [f"journal.path={url}"], environ={}).journal.location() == url
    assert load_config(None, ["journal.path=null"], environ={}).journal.location() is None


def test_a_text_setting_keeps_what_was_written():
    """YAML would read 1.5 as a number and yes as true: a text setting gets the text as given."""
    config = load_config(None, ["llm.model=1.5", "llm.base_url=http://h:1/v1"],
                         environ={"FLINK_MEMORY__LLM__API_KEY_ENV": "yes"})
    assert config.llm.model == "1.5" and config.llm.api_key_env == "yes"
    assert load_config(None, ["llm.max_concurrency=8"], environ={}).llm.max_concurrency == 8  # numbers stay


def test_a_drill_names_a_stage_of_the_topology_or_a_record():
    from flink_memory.topology import STAGES, check_drill

    for spec in [f"{s.name}:3:/tmp/marker" for s in STAGES] + ["call:2:/tmp/m", "record:agent-0/m1",
                                                              "merger:after:agent-0/batch-000001:/tmp/m"]:
        check_drill(load_config(None, [f"job.inject_failure={spec}"], environ={}))
    for spec, reason in [("sorter:3:/tmp/m", "'sorter' is no stage of the job"),
                         ("record:3:m", "a record drill is record:agent/record-id"),
                         ("call:after:a/b:/tmp/m", "'call' is no stage")]:
        with pytest.raises(ConfigError, match=reason):
            check_drill(load_config(None, [f"job.inject_failure={spec}"], environ={}))


def test_the_pydantic_settings_comparison_runs(capsys):
    """benchmarks/config_sources.py (quoted in docs/architecture.md): loading through pydantic-settings agrees
    on plain values and parts from ours on null, property names with dots and the error's origin."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import config_sources

    assert config_sources.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"7/{len(config_sources.CASES)} cases give the same configuration"
    assert {line.split(":")[0] for line in lines if line.startswith("DIFFERS")} == {"DIFFERS  environment"}
