"""deploy/k8s: every manifest parses and passes a strict schema, and the manifests agree with each other
and with the config in the ConfigMap. The upstream Kubernetes schemas are checked by kubernetes-validate
(tests/integration/test_deploy_validators.py); the schema here is a vendored subset of the 1.30 API
(deploy/k8s/schema/) that is stricter where upstream's is loose: enums, quantities, names, one probe
handler, and an unknown field is an error."""

from __future__ import annotations

import copy
import json
import re
import shlex

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from services.cli.main import build_parser
from services.common.config import load_config
from services.common.config.services import SERVICE_NAMES
from tests.conftest import REPO

K8S = REPO / "deploy" / "k8s"
SCHEMA = json.loads((K8S / "schema" / "kubernetes-subset.schema.json").read_text())
REGISTRY = Registry().with_resource(SCHEMA["$id"], Resource.from_contents(SCHEMA))
CONFIG_DIR = "/etc/trinity-grpc"
WORKLOADS = ("StatefulSet", "Deployment", "Job")


def manifests() -> list[tuple[str, dict]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def schema_errors(doc: dict) -> list[str]:
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    assert key in SCHEMA["kinds"], f"no schema for {key}: add its definition to the vendored schema first"
    ref = {"$ref": f"{SCHEMA['$id']}#/kinds/{key.replace('~', '~0').replace('/', '~1')}"}
    validator = Draft202012Validator(ref, registry=REGISTRY)
    return [f"{e.json_path}: {e.message[:300]}" for e in validator.iter_errors(doc)]


def objects() -> list[dict]:
    return [doc for _, doc in manifests() if doc["kind"] != "Kustomization"]


def of_kind(kind: str) -> list[dict]:
    return [doc for doc in objects() if doc["kind"] == kind]


def workload(component: str) -> dict:
    found = [
        w
        for w in objects()
        if w["kind"] in WORKLOADS and pod_labels(w).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, (component, found)
    return found[0]


def pod_labels(doc: dict) -> dict[str, str]:
    return doc["spec"]["template"]["metadata"]["labels"]


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


def container(doc: dict) -> dict:
    return pod_spec(doc)["containers"][0]


def config_map() -> dict:
    return next(d for d in of_kind("ConfigMap") if d["metadata"]["name"] == "trinity-config")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    path = tmp_path_factory.mktemp("k8s") / "config.yaml"
    path.write_text(config_map()["data"]["config.yaml"])
    return load_config(path)


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(("file", "doc"), manifests(), ids=[f"{f}:{d['kind']}" for f, d in manifests()])
def test_manifest_passes_the_strict_schema(file, doc) -> None:
    assert schema_errors(doc) == []


@pytest.mark.parametrize(
    ("kind", "mutate", "expected"),
    [
        ("StatefulSet", lambda d: d["spec"].update(replica=1), "'replica' was unexpected"),
        ("Job", lambda d: pod_spec(d).update(restartPolicy="Always"), "'Always' is not one of"),
        (
            "Deployment",
            lambda d: container(d)["readinessProbe"].update(httpGet={"port": 1}),
            "valid under each of",
        ),
        (
            "Deployment",
            lambda d: container(d)["resources"]["limits"].update(memory="lots"),
            "'lots' is not valid",
        ),
        ("Service", lambda d: d["spec"]["ports"][0].update(port=70000), "70000 is greater than"),
        ("StatefulSet", lambda d: d["metadata"].update(name="Trinity_Buffer"), "does not match"),
        ("Job", lambda d: container(d).pop("image"), "'image' is a required property"),
    ],
    ids=[
        "unknown-field",
        "job-restart-always",
        "two-probe-handlers",
        "bad-quantity",
        "port-range",
        "bad-name",
        "missing-image",
    ],
)
def test_schema_rejects_broken_manifests(kind, mutate, expected) -> None:
    doc = copy.deepcopy(of_kind(kind)[0])
    mutate(doc)
    errors = schema_errors(doc)
    assert any(expected in e for e in errors), errors


def test_kustomization_lists_every_manifest_and_nothing_else() -> None:
    kustomization = next(doc for name, doc in manifests() if name == "kustomization.yaml")
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    namespaces = {d["metadata"]["name"] for d in of_kind("Namespace")}
    assert namespaces == {kustomization["namespace"]}
    for doc in objects():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == kustomization["namespace"], doc["metadata"]


def test_buffer_and_synchronizer_are_single_replica_statefulsets_with_their_own_volume() -> None:
    for component in ("buffer", "synchronizer"):
        sts = workload(component)
        assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 1
        claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
        mounted = {m["name"] for m in container(sts)["volumeMounts"]}
        assert claims and claims <= mounted
        service = next(s for s in of_kind("Service") if s["metadata"]["name"] == sts["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None"


def test_selectors_labels_volumes_and_ports_agree() -> None:
    config_maps = {d["metadata"]["name"] for d in of_kind("ConfigMap")}
    claims = {d["metadata"]["name"] for d in of_kind("PersistentVolumeClaim")}
    for doc in objects():
        if doc["kind"] not in WORKLOADS:
            continue
        selector = doc["spec"].get("selector", {}).get("matchLabels", {})
        assert selector.items() <= pod_labels(doc).items(), doc["metadata"]["name"]
        spec = pod_spec(doc)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        volumes.update({t["metadata"]["name"]: t for t in doc["spec"].get("volumeClaimTemplates", [])})
        for c in spec["containers"]:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, (doc["metadata"]["name"], mount)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
    workloads = [w for w in objects() if w["kind"] in WORKLOADS]
    for service in of_kind("Service"):
        selected = [w for w in workloads if service["spec"]["selector"].items() <= pod_labels(w).items()]
        assert len(selected) == 1, service["metadata"]["name"]
        port_names = {p.get("name") for p in container(selected[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (service["metadata"]["name"], port)


def test_every_container_mounts_the_config_read_only_and_runs_a_parseable_command(cfg) -> None:
    for component in SERVICE_NAMES:
        c = container(workload(component))
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == CONFIG_DIR)
        assert mount.get("readOnly") is True
        argv = c["command"] + c.get("args", [])
        assert f"{CONFIG_DIR}/config.yaml" in argv
        if argv[0] == "trinity":
            args = build_parser().parse_args(argv[1:])
            assert (args.command, args.service, args.config) == (
                "serve",
                component,
                f"{CONFIG_DIR}/config.yaml",
            )


def test_config_map_config_uses_service_dns_names_and_binds_all_interfaces(cfg) -> None:
    namespace = config_map()["metadata"]["namespace"]
    for component in SERVICE_NAMES:
        w = workload(component)
        endpoint = cfg.services.endpoint(component)
        assert endpoint.bind == "0.0.0.0"
        if w["kind"] == "Job":  # rank 0's pod of the Indexed Job, under its subdomain
            expected = f"{w['metadata']['name']}-0.{pod_spec(w)['subdomain']}.{namespace}.svc.cluster.local"
        else:
            service = next(
                s for s in of_kind("Service") if s["spec"]["selector"].items() <= pod_labels(w).items()
            )
            expected = f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
        assert endpoint.host == expected
        c = container(w)
        assert endpoint.port in {p["containerPort"] for p in c["ports"] if p["name"] == "grpc"}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "grpc" in c.get(probe, {}):
                assert c[probe]["grpc"]["port"] == endpoint.port, (component, probe)
        if "exec" in c.get("readinessProbe", {}):
            assert f"trinity health 127.0.0.1:{endpoint.port}" in shlex.join(
                c["readinessProbe"]["exec"]["command"]
            )
        grace = pod_spec(w)["terminationGracePeriodSeconds"]
        assert grace > cfg.services.shutdown_grace_s


def test_every_pod_announces_its_configured_metrics_port_to_prometheus(cfg) -> None:
    for component in SERVICE_NAMES:
        w = workload(component)
        port = cfg.services.endpoint(component).metrics_port
        assert port is not None, component
        annotations = w["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }, component
        assert {"name": "metrics", "containerPort": port, "protocol": "TCP"} in container(w)["ports"]


def test_config_map_taskset_is_in_the_config_map(cfg) -> None:
    path = cfg.buffer.explorer_input.taskset.path
    assert path.startswith(CONFIG_DIR + "/") and path.removeprefix(CONFIG_DIR + "/") in config_map()["data"]
    for line in config_map()["data"]["tasks.jsonl"].splitlines():
        assert set(json.loads(line)) == {"prompt", "response"}


def test_trainer_is_an_indexed_job_whose_torchrun_matches_its_gpus_and_pods(cfg) -> None:
    job = workload("trainer")
    spec, pod = job["spec"], pod_spec(job)
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    c = container(job)
    assert c["command"] == ["torchrun"]
    args = c["args"]
    opts = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)
    assert int(opts["nnodes"]) == spec["completions"] == spec["parallelism"]
    assert int(opts["nproc-per-node"]) == int(c["resources"]["limits"]["nvidia.com/gpu"])
    assert cfg.cluster.node_num == spec["completions"] and cfg.cluster.gpu_per_node == int(
        opts["nproc-per-node"]
    )
    assert opts["master-addr"] == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    assert opts["node-rank"] == "$(NODE_RANK)"
    assert args[args.index("-m") + 1] == "services.trainer"
    assert args[args.index("--config") + 1] == f"{CONFIG_DIR}/config.yaml"
    rank = next(e for e in c["env"] if e["name"] == "NODE_RANK")
    assert (
        rank["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    service = next(s for s in of_kind("Service") if s["metadata"]["name"] == pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["torchrun"] == int(opts["master-port"])
    assert ports["weight-sync"] == cfg.synchronizer.master_port
    assert cfg.trainer.strategy == "fsdp2"


def test_container_args_reference_only_defined_env_vars() -> None:
    for doc in objects():
        if doc["kind"] in WORKLOADS:
            for c in pod_spec(doc)["containers"]:
                defined = {e["name"] for e in c.get("env", [])}
                for arg in c["command"] + c.get("args", []):
                    for var in re.findall(r"\$\((\w+)\)", arg):
                        assert var in defined, (doc["metadata"]["name"], arg)


def test_trainer_and_explorers_share_the_read_write_many_checkpoint_volume(cfg) -> None:
    pvc = of_kind("PersistentVolumeClaim")[0]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for component in ("trainer", "explorer"):
        w = workload(component)
        volume = next(
            v
            for v in pod_spec(w)["volumes"]
            if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]
        )
        mount = next(m for m in container(w)["volumeMounts"] if m["name"] == volume["name"])
        env = {e["name"]: e.get("value") for e in container(w)["env"]}
        assert env["TRINITY_CHECKPOINT_ROOT_DIR"] == mount["mountPath"]
    assert cfg.synchronizer.sync_method == "checkpoint"


def test_explorers_scale_as_a_deployment_each_named_after_its_pod(tmp_path) -> None:
    deployment = workload("explorer")
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] >= 2
    c = container(deployment)
    args = c["args"]
    override = args[args.index("--set") + 1]
    assert override == "explorer.name=$(POD_NAME)"
    pod_name = next(e for e in c["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    path = tmp_path / "config.yaml"
    path.write_text(config_map()["data"]["config.yaml"])
    assert (
        load_config(path, [override.replace("$(POD_NAME)", "trinity-explorer-7d9f-x2")]).explorer.name
        == "trinity-explorer-7d9f-x2"
    )
