"""The Grafana dashboard imports into an existing Grafana.

No Grafana server is installable here (Debian ships none, PyPI and npm only client libraries
and TypeScript types), so the dashboard is checked against the rules Grafana applies when a
dashboard JSON is imported (Dashboards > Import, the /api/dashboards/db API, or file
provisioning), with the queries themselves evaluated by a real Prometheus in
tests/test_observability_prometheus.py:

- no data source uid of the machine it was made on: every panel, query and variable reads the
  `datasource` variable (type datasource, plugin prometheus), which Grafana sets to the
  importing instance's default Prometheus; no `__inputs` left to fill;
- every `$variable` used is defined (or one of Grafana's own); the model and backend variables
  are `label_values()` queries of labels the gateway really exports;
- `id` null (Grafana assigns one; a foreign id would overwrite another dashboard), a `uid` of
  at most 40 characters of [A-Za-z0-9_-], unique panel ids, unique refIds per panel, panels of
  core types on the 24-column grid without overlaps;
- every metric a query names is exported by the gateway (metrics.py) or an engine.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from vlm_gateway.docgen_refs import gateway_metrics

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "grafana"))
import build_dashboard  # noqa: E402

DASH = json.loads((ROOT / "grafana" / "dashboards" / "vlm-gateway.json").read_text())
GRAFANA_GLOBALS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms",
                   "__all", "__dashboard", "__from", "__to", "__org", "__user", "timeFilter"}
CORE_PANELS = {"row", "timeseries", "stat", "gauge", "table", "bargauge", "text", "heatmap"}
_VAR = re.compile(r"\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, node


def test_no_machine_local_data_source_and_a_datasource_variable():
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert "__inputs" not in DASH and "__requires" not in DASH or all(
        i.get("type") != "datasource" for i in DASH.get("__inputs", []))
    refs = [(p, v) for p, v in _walk(DASH) if p.endswith(".datasource.uid")]
    assert len(refs) > 50
    assert {v for _, v in refs} == {"${datasource}"}, {v for _, v in refs}
    for p in DASH["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["type"] == "prometheus"
            assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])


def test_every_variable_used_is_defined():
    defined = {v["name"] for v in DASH["templating"]["list"]} | GRAFANA_GLOBALS
    used = set()
    for path, value in _walk(DASH):
        if isinstance(value, str) and not path.endswith(".allValue"):
            used |= {a or b for a, b in _VAR.findall(value)}
    assert used - defined == set(), used - defined
    assert {"datasource", "model", "backend", "__rate_interval"} <= used


def test_model_and_backend_variables_query_labels_the_gateway_exports():
    exported = {m._name + ("_total" if m._type == "counter" else ""): set(m._labelnames) for m in gateway_metrics()}
    for name in ("model", "backend"):
        v = next(x for x in DASH["templating"]["list"] if x["name"] == name)
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"]["query"])
        assert m and m.group(2) == name and v["definition"] == v["query"]["query"]
        assert name in exported[m.group(1)], (m.group(1), exported.get(m.group(1)))
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
        assert v["current"]["value"] == ["$__all"]
    # a panel of a metric with the label is filtered by its variable
    for title, expr in build_dashboard.queries(DASH):
        for metric in re.findall(r"(vlm_gateway_\w+?)(?:_bucket)?[{\[( ]", expr + " "):
            labels = exported.get(metric) or exported.get(metric.removesuffix("_bucket")) or set()
            for label in ("model", "backend"):
                if label in labels:
                    assert f'{label}=~"${label}"' in expr, (title, metric, label)


def test_import_rules_ids_grid_and_types():
    assert DASH["id"] is None
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", DASH["uid"]) and DASH["title"]
    assert isinstance(DASH["schemaVersion"], int) and DASH["schemaVersion"] >= 36
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in DASH["panels"]:
        assert p["type"] in CORE_PANELS, p["type"]
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, (p["title"], g)
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in p.get("targets", []))


def test_every_metric_a_query_names_exists():
    ours = set()
    for m in gateway_metrics():
        ours |= {m._name + s for s in (("_total",) if m._type == "counter" else
                                        ("_bucket", "_sum", "_count") if m._type == "histogram" else ("",))}
    for title, expr in build_dashboard.queries(DASH):
        for name in re.findall(r"\b(vlm_gateway_\w+)", expr):
            assert name in ours, (title, name)
        for name in re.findall(r"\b((?:vllm:|trtllm_)\w+)", expr):
            assert name in {"vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                            "trtllm_prompt_tokens_total", "trtllm_generation_tokens_total"}, (title, name)
