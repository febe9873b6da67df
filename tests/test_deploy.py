"""The Kubernetes deployment in deploy/, checked with the installed dagster-k8s and no cluster: the
Definitions resolve with the k8s job executor, the instance yaml (K8sRunLauncher, run queue, pools)
passes Dagster's own config schema, the kuzu_writer pool has one slot, and the Helm values agree."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.instance.config import dagster_instance_config
from dagster._serdes.config_class import class_from_code_pointer
from dagster_k8s import K8sRunLauncher, k8s_job_executor

from assets.partitions import GRAPH_WRITER_POOL
from lexgraph.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
JOBS = ("ingest_documents", "build_corpus_index", "extract_documents", "purge_documents")
FAKE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: not-a-token}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Nothing here may reach a cluster (or anything else over IP)."""
    connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"a network connection was attempted: {address}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", guarded)


@pytest.fixture
def pg_env(monkeypatch):
    for name in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(name, "unused")


def _yaml(name: str):
    return yaml.safe_load((DEPLOY / name).read_text())


def _k8s_definitions(tmp_path) -> dg.Definitions:
    from deploy.definitions_k8s import build_k8s_definitions

    return build_k8s_definitions(Settings.from_env(home=tmp_path / "index", inbox=tmp_path / "inbox"))


def _steps(defs: dg.Definitions) -> dict[str, str | None]:
    """step (node) name -> its pool, over every job."""
    steps = {}
    for name in JOBS:
        for node in defs.resolve_job_def(name).graph.nodes:
            steps[node.name] = getattr(node.definition, "pool", None)
    return steps


def test_k8s_definitions_resolve_with_the_k8s_job_executor(tmp_path):
    from orchestration.definitions import build_definitions

    defs = _k8s_definitions(tmp_path)
    dg.Definitions.validate_loadable(defs)
    local = build_definitions(Settings.from_env(home=tmp_path / "index", inbox=tmp_path / "inbox"))
    # the same project: assets, sensors, schedules and resources are the local ones
    assert set(defs.resolve_all_asset_keys()) == set(local.resolve_all_asset_keys())
    assert {s.name for s in defs.sensors} == {s.name for s in local.sensors}
    assert {s.name for s in defs.schedules} == {s.name for s in local.schedules}
    assert set(defs.resources) == set(local.resources)

    steps = _steps(defs)
    for name in JOBS:
        executor = defs.resolve_job_def(name).executor_def
        assert executor.executor_creation_fn is k8s_job_executor.executor_creation_fn, name
    resolved = executor.config_schema.resolve_config({})
    assert resolved.success, resolved.errors
    config = resolved.value["config"]
    # per-step pod sizes name real steps (a renamed asset would silently lose its pod size otherwise)
    assert set(config["per_step_k8s_config"]) <= set(steps), set(config["per_step_k8s_config"]) - set(steps)
    assert {"chunk_vectors", "chunk_knn_graph", "document_graph"} <= set(config["per_step_k8s_config"])
    for step, pod in config["per_step_k8s_config"].items():
        resources = pod["container_config"]["resources"]
        assert resources["requests"]["memory"] and resources["limits"]["memory"], step
    # graph writers: every one in the kuzu_writer pool
    writers = {step for step, pool in steps.items() if pool}
    assert {"document_graph", "chunk_knn_graph", "purge_removed_documents"} <= writers
    assert {steps[s] for s in writers} == {GRAPH_WRITER_POOL} == {"kuzu_writer"}


@pytest.mark.subprocess
def test_the_code_server_command_of_the_helm_values_loads_the_definitions(tmp_path):
    """`dagster definitions validate` with the code server's own -f/-a/-d arguments (deploy/values.yaml)."""
    [deployment] = _yaml("values.yaml")["dagster-user-deployments"]["deployments"]
    args = [arg.replace("/app", str(ROOT)) for arg in deployment["dagsterApiGrpcArgs"]]
    assert args[args.index("-f") + 1] == str(DEPLOY / "definitions_k8s.py") and args[args.index("-a") + 1] == "defs"
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "LEXGRAPH_HOME": str(tmp_path / "index"),
           "LEXGRAPH_INBOX": str(tmp_path / "inbox")}
    dagster = Path(sys.executable).parent / "dagster"
    done = subprocess.run([str(dagster), "definitions", "validate", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation successful" in done.stdout + done.stderr


def test_instance_yaml_parses_with_the_k8s_run_launcher(tmp_path, pg_env):
    config, instance_class = dagster_instance_config(str(DEPLOY), "dagster.k8s.yaml")  # Dagster's own schema
    assert instance_class is None
    launcher = config["run_launcher"]
    assert class_from_code_pointer(launcher["module"], launcher["class"]) is K8sRunLauncher
    processed = process_config(resolve_to_config_type(K8sRunLauncher.config_type()), launcher["config"])
    assert processed.success, processed.errors
    # constructed as the daemon would, but with a kubeconfig that points nowhere: nothing is contacted
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(FAKE_KUBECONFIG)
    run_launcher = K8sRunLauncher.from_config_value(
        None, {**processed.value, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)})
    assert run_launcher.job_namespace == "lexgraph" and run_launcher.dagster_home == "/opt/dagster/dagster_home"
    mounts = {m["mountPath"] for m in launcher["config"]["volume_mounts"]}
    assert {"/data", "/inbox"} <= mounts
    coordinator = config["run_coordinator"]
    assert class_from_code_pointer(coordinator["module"], coordinator["class"]).__name__ == "QueuedRunCoordinator"
    assert config["storage"]["postgres"]["postgres_db"]["password"] == {"env": "DAGSTER_PG_PASSWORD"}


@pytest.mark.subprocess
def test_pool_limits_give_the_graph_writer_one_slot(tmp_path):
    """The deploy instance's queue and pool settings on a real (SQLite) instance."""
    deploy = _yaml("dagster.k8s.yaml")
    assert deploy["concurrency"]["pools"]["default_limit"] == 1
    overrides = {k: deploy[k] for k in ("run_coordinator", "concurrency", "run_monitoring", "run_retries", "retention")}
    with dg.instance_for_test(overrides=overrides) as instance:
        concurrency = instance.get_concurrency_config()
        assert concurrency.pool_config.default_pool_limit == 1
        assert concurrency.pool_config.pool_granularity.value == "op"
        assert concurrency.run_queue_config.max_concurrent_runs == 8
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default(GRAPH_WRITER_POOL)  # what the first claim does
        assert storage.get_concurrency_info("kuzu_writer").slot_count == 1

    # deploy/pool-limits.yaml's Job sets the limit explicitly: its command against a real instance
    [container] = _yaml("pool-limits.yaml")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["dagster", "instance", "concurrency", "set", "kuzu_writer", "1"]
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dagster = Path(sys.executable).parent / "dagster"
    done = subprocess.run([str(dagster), *container["command"][1:]], env={**os.environ, "DAGSTER_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.event_log_storage.get_concurrency_info("kuzu_writer").slot_count == 1


def test_helm_values_agree_with_the_instance_yaml():
    values, instance = _yaml("values.yaml"), _yaml("dagster.k8s.yaml")
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    k8s = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher = instance["run_launcher"]["config"]
    assert k8s["volumes"] == launcher["volumes"] and k8s["volumeMounts"] == launcher["volume_mounts"]
    assert [c["name"] for c in k8s["envConfigMaps"]] == launcher["env_config_maps"]
    # the chart passes the PostgreSQL password itself (global.postgresqlSecretName)
    assert [s["name"] for s in k8s["envSecrets"]] == [s for s in launcher["env_secrets"] if s != "lexgraph-postgres"]
    assert values["global"]["postgresqlSecretName"] == "lexgraph-postgres"
    assert k8s["jobNamespace"] == launcher["job_namespace"]
    assert k8s["runK8sConfig"]["containerConfig"] == launcher["run_k8s_config"]["container_config"]
    runs, pools = values["concurrency"]["runs"], values["concurrency"]["pools"]
    assert runs["maxConcurrentRuns"] == instance["concurrency"]["runs"]["max_concurrent_runs"]
    assert runs["tagConcurrencyLimits"] == instance["concurrency"]["runs"]["tag_concurrency_limits"]
    assert pools == {"defaultLimit": 1, "granularity": instance["concurrency"]["pools"]["granularity"]}
    # the chart refuses run-queue limits in both the run coordinator and `concurrency`
    assert not any(values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"].values())
    assert values["additionalInstanceConfig"]["run_retries"] == instance["run_retries"]
    assert values["postgresql"]["postgresqlScheme"] == instance["storage"]["postgres"]["postgres_db"]["scheme"]
    monitoring = values["dagsterDaemon"]["runMonitoring"]
    assert monitoring["startTimeoutSeconds"] == instance["run_monitoring"]["start_timeout_seconds"]
    assert monitoring["freeSlotsAfterRunEndSeconds"] == instance["run_monitoring"]["free_slots_after_run_end_seconds"]
    # the code server evaluates the inbox sensor: it mounts the same volumes at the same paths
    [deployment] = values["dagster-user-deployments"]["deployments"]
    assert deployment["volumes"] == k8s["volumes"] and deployment["volumeMounts"] == k8s["volumeMounts"]

    # the namespace objects the configuration refers to exist, with paths under the mounts
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all((DEPLOY / "lexgraph.yaml").read_text())}
    for volume in k8s["volumes"]:
        assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in objects
    assert objects[("PersistentVolumeClaim", "lexgraph-index")]["spec"]["accessModes"] == ["ReadWriteMany"]
    settings = objects[("ConfigMap", "lexgraph-settings")]["data"]
    mounts = {m["mountPath"] for m in k8s["volumeMounts"]}
    assert settings["LEXGRAPH_INBOX"] in mounts and any(settings["LEXGRAPH_HOME"].startswith(m + "/") for m in mounts)
    assert ("ServiceAccount", launcher["service_account_name"]) in objects
    assert ("Service", "lexgraph-embedder") in objects
