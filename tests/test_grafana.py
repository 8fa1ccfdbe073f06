"""The Grafana dashboard queries only metrics the testbed exports; the scrape config targets the exporter."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from testbed.launch.collector import RunCollector, exported_metric_names
from testbed.launch.runlog import RunLog
from tests.fakes import fake_lap, fake_scenario

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"
GRAFANA_JSON = DASHBOARDS / "grafana.json"
PROMETHEUS_YML = DASHBOARDS / "prometheus.yml"
METRIC_NAME = re.compile(r"\btestbed_[a-z0-9_]+")
DEFAULT_EXPORTER_TARGET = "127.0.0.1:9464"
PROMTOOL = "/usr/bin/promtool"
PROMTOOL_TIMEOUT_S = 30


def load_dashboard() -> dict:
    return json.loads(GRAFANA_JSON.read_text(encoding="utf-8"))


def query_panels(dashboard: dict) -> list[dict]:
    """Every panel that shows data (rows are layout only), including panels nested in collapsed rows."""
    panels = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            panels += panel.get("panels", [])
        else:
            panels.append(panel)
    return panels


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in query_panels(dashboard) for target in panel["targets"]]


@pytest.fixture(scope="module")
def exported() -> set[str]:
    logs = [RunLog(fake_scenario("plain")), RunLog(fake_scenario("speculative"))]
    logs[0].add_lap(fake_lap(1, 0.0, spec=False))
    logs[1].add_lap(fake_lap(1, 0.0, spec=True))
    registry = CollectorRegistry()
    registry.register(RunCollector(lambda: logs))
    return exported_metric_names(registry)


def test_dashboard_is_grafana_json_with_a_prometheus_datasource_variable():
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = query_panels(dashboard)
    assert len(panels) >= 10
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_every_panel_queries_at_least_one_exported_metric(exported):
    for panel in query_panels(load_dashboard()):
        names = {name for target in panel["targets"] for name in METRIC_NAME.findall(target["expr"])}
        assert names, f"panel {panel['title']!r} names no testbed_ metric"


def test_every_expression_names_only_exported_metrics(exported):
    for title, expr in expressions(load_dashboard()):
        unknown = set(METRIC_NAME.findall(expr)) - exported
        assert not unknown, f"panel {title!r}: {sorted(unknown)} not exported (expr: {expr})"


def test_expressions_are_balanced_and_use_concrete_windows():
    for title, expr in expressions(load_dashboard()):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), title
        assert expr.count("[") == expr.count("]"), title
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert re.fullmatch(r"\d+[smh]", window), f"{title}: window [{window}]"


def test_dashboard_covers_the_quantities_of_the_live_view(exported):
    used = {name for _, expr in expressions(load_dashboard()) for name in METRIC_NAME.findall(expr)}
    for name in ("testbed_tokens_total", "testbed_decode_rate_tokens_per_second", "testbed_hop_latency_p50_seconds",
                 "testbed_hop_latency_p99_seconds", "testbed_hop_configured_latency_seconds", "testbed_stage_compute_seconds_sum",
                 "testbed_ring_latency_seconds", "testbed_compute_seconds", "testbed_spec_acceptance_rate",
                 "testbed_spec_gamma_tokens_per_round", "testbed_spec_k",
                 "testbed_spec_decode_num_accepted_tokens_per_pos_total"):
        assert name in used, name
    all_exprs = " ".join(expr for _, expr in expressions(load_dashboard()))
    assert "rate(testbed_tokens_total[1m])" in all_exprs
    # hop latency quantiles come from the exporter's exact gauges, never from interpolated buckets
    assert "testbed_hop_latency_seconds_bucket" not in all_exprs


def scrape_settings(text: str) -> tuple[list[str], list[str]]:
    """(scrape_interval values, targets) read line by line: the file is YAML and there is no yaml package."""
    intervals = re.findall(r"^\s*scrape_interval:\s*(\S+)\s*$", text, flags=re.MULTILINE)
    targets = [t.strip().strip("'\"") for line in re.findall(r"^\s*-?\s*targets:\s*\[(.*)\]\s*$", text, re.MULTILINE)
               for t in line.split(",")]
    return intervals, targets


def test_prometheus_yml_scrapes_the_exporter_every_second():
    text = PROMETHEUS_YML.read_text(encoding="utf-8")
    assert "\t" not in text, "YAML forbids tabs for indentation"
    assert re.search(r"^scrape_configs:\s*$", text, re.MULTILINE)
    intervals, targets = scrape_settings(text)
    assert intervals and set(intervals) == {"1s"}
    assert targets == [DEFAULT_EXPORTER_TARGET]
    assert re.search(r"^\s*-\s*job_name:\s*\S+", text, re.MULTILINE)


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason=f"{PROMTOOL} not installed (apt-get install prometheus)")
def test_promtool_accepts_prometheus_yml():
    result = subprocess.run([PROMTOOL, "check", "config", str(PROMETHEUS_YML)], capture_output=True, text=True,
                            timeout=PROMTOOL_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason=f"{PROMTOOL} not installed (apt-get install prometheus)")
def test_promtool_parses_every_panel_expression(tmp_path):
    """Each expression becomes a recording rule; `promtool check rules` runs the real PromQL parser on it."""
    rules = ["groups:", "  - name: grafana-panels", "    rules:"]
    for index, (_title, expr) in enumerate(expressions(load_dashboard())):
        rules += [f"      - record: grafana_panel_expr_{index}", f"        expr: {json.dumps(expr)}"]
    rules_file = tmp_path / "panels.rules.yml"
    rules_file.write_text("\n".join(rules) + "\n", encoding="utf-8")
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True,
                            timeout=PROMTOOL_TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
