"""The Kubernetes manifests in deploy/kubernetes, checked offline: rendered by kustomize
(kubectl's built-in), every object validated against the Kubernetes OpenAPI schemas that
kubernetes-validate ships (strict: unknown fields are errors) for the oldest and newest
supported releases, and the references between objects checked (selectors, ports, names,
the gateway config loaded by the gateway's own loader, the engine flags equal to
`vlm-gateway launch`). No cluster is involved: nothing here was applied to one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vlm_gateway import metrics
from vlm_gateway.backends.launch import command_for
from vlm_gateway.backends.profiles import load_profiles
from vlm_gateway import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"
VERSIONS = ("1.30.0", "1.37.0")   # preStop `sleep` needs 1.29+ (beta, on by default from 1.30)
CRD_KINDS = {"ServiceMonitor"}    # Prometheus Operator CRDs: checked structurally below


def render(path: Path) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (for its built-in kustomize) is not installed")
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def objs() -> dict[tuple[str, str], dict]:
    docs = render(ROOT) + render(ROOT / "monitoring")
    by = {}
    for d in docs:
        key = (d["kind"], d["metadata"]["name"])
        assert key not in by, f"duplicate {key}"
        by[key] = d
    return by


def test_every_file_parses():
    files = sorted(ROOT.rglob("*.yaml"))
    assert len(files) >= 9
    for f in files:
        assert list(yaml.safe_load_all(f.read_text())), f


@pytest.mark.parametrize("version", VERSIONS)
def test_objects_match_the_kubernetes_schemas(objs, version):
    kv = pytest.importorskip("kubernetes_validate")
    checked = 0
    for (kind, name), d in objs.items():
        if kind in CRD_KINDS:
            continue
        try:
            kv.validate(d, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{kind}/{name} against Kubernetes {version}: {e.message}")
        checked += 1
    assert checked == len(objs) - 2


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_gateway_deployment(objs):
    dep = objs[("Deployment", "vlm-gateway")]
    assert dep["metadata"]["namespace"] == "llm"
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {p["name"] for p in c["ports"]} == {"http"}
    assert _selects(dep["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    svc = objs[("Service", "vlm-gateway")]
    assert _selects(svc["spec"]["selector"], pod["metadata"]["labels"])
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = objs[("PodDisruptionBudget", "vlm-gateway")]
    assert _selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    hpa = objs[("HorizontalPodAutoscaler", "vlm-gateway")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vlm-gateway"}
    assert hpa["spec"]["minReplicas"] >= 2, "the PDB keeps one replica up; two are needed for a disruption"
    # the redis URL comes from a Secret; the config file from the ConfigMap mounted where args point
    env = {e["name"]: e for e in c.get("env", [])}
    assert env["VLM_GATEWAY_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["config"]
    assert c["args"][c["args"].index("--config") + 1].startswith(mount + "/")
    # room to finish streams after the pod leaves the Service
    assert pod["spec"]["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"]


def test_gateway_config_loads_and_points_at_the_engines(objs, tmp_path):
    text = objs[("ConfigMap", "vlm-gateway")]["data"]["gateway.yaml"]
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    try:
        cfg = load_config(str(path), environ={})
    except ConfigError as e:
        pytest.fail(f"the shipped gateway.yaml does not load: {e}")
    (d,) = cfg.discovery
    assert d.kind == "kubernetes"
    svc = objs[("Service", d.service)]
    assert svc["spec"]["clusterIP"] == "None", "discovery reads the pods behind a headless Service"
    assert d.port_name in {p["name"] for p in svc["spec"]["ports"]}
    assert cfg.server.host == "0.0.0.0"


def test_discovery_rbac(objs):
    dep = objs[("Deployment", "vlm-gateway")]
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert ("ServiceAccount", sa) in objs
    rb = objs[("RoleBinding", "vlm-gateway-discovery")]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": "llm"} in rb["subjects"]
    role = objs[("Role", rb["roleRef"]["name"])]
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules[("discovery.k8s.io", "endpointslices")] >= {"list", "watch"}
    assert rules[("", "pods")] == {"get"}
    assert len(rules) == 2, "nothing beyond what discovery reads"


def test_engines_follow_vlm_gateway_launch(objs):
    dep = objs[("Deployment", "vllm-h200")]
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    profile = pod["metadata"]["labels"]["vlm-gateway.io/profile"]
    model = pod["metadata"]["annotations"]["vlm-gateway.io/models"]
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    argv, _ = command_for(load_profiles({})[profile], model, "0.0.0.0", port)
    assert c["command"] + c["args"] == list(argv)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    svc = objs[("Service", "vllm")]
    assert _selects(svc["spec"]["selector"], pod["metadata"]["labels"])
    assert svc["spec"]["ports"][0]["targetPort"] == "http"


def test_service_monitors_and_adapter_rule(objs):
    for name in ("vlm-gateway", "vllm"):
        sm = objs[("ServiceMonitor", name)]
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        svc = objs[("Service", name)]
        assert _selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        ports = {p["name"] for p in svc["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
    rules = yaml.safe_load((ROOT / "monitoring" / "prometheus-adapter-rules.yaml").read_text())
    (rule,) = rules["rules"]["custom"]
    # the series it reads is one the gateway exports, and it serves the name the HPA asks for
    series = metrics.BACKEND_INFLIGHT._name
    assert rule["seriesQuery"].startswith(series + "{")
    hpa = objs[("HorizontalPodAutoscaler", "vlm-gateway")]
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted == {rule["name"]["as"]}
