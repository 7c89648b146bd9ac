"""The files in deploy/ are what their tools accept, and name only real metrics: the
compose files validate (CPU, and with the GPU override), the Grafana dashboard is valid
JSON whose every query names a metric documented in docs/metrics.md
(tests/e2e/serving_test.py checks the documented metrics against live scrapes), and the
model shapes load."""
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cleave_testing as ct  # noqa: E402

DEPLOY = os.path.join(ct.SOURCE_DIR, "deploy")


def documented_metrics():
    """Metric names in docs/metrics.md's tables, by section."""
    sections, current = {}, None
    with open(os.path.join(ct.SOURCE_DIR, "docs", "metrics.md")) as f:
        for line in f:
            if line.startswith("## "):
                current = sections.setdefault(line[3:].strip(), set())
            match = re.match(r"\| `(cleave_[a-z0-9_]+)` \|", line)
            if match and current is not None:
                current.add(match.group(1))
    return sections


def base_name(metric):
    return re.sub(r"_(bucket|sum|count)$", "", metric)


class DeployFilesTest(unittest.TestCase):
    def test_every_dashboard_query_names_a_documented_metric(self):
        known = set().union(*documented_metrics().values())
        with open(os.path.join(DEPLOY, "grafana", "dashboards", "cleave.json")) as f:
            dashboard = json.load(f)
        self.assertTrue(dashboard["panels"])
        for panel in dashboard["panels"]:
            self.assertTrue(panel["targets"], panel["title"])
            for target in panel["targets"]:
                names = re.findall(r"cleave_[a-z0-9_]+", target["expr"])
                self.assertTrue(names, target["expr"])
                for name in names:
                    self.assertIn(base_name(name), known, f"{panel['title']}: {name}")

    def test_compose_files_validate(self):
        compose = shutil.which("docker-compose")
        self.assertIsNotNone(compose, "docker-compose not found; run scripts/install-deps.sh")
        for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.gpu.yml"]):
            args = [compose]
            for f in files:
                args += ["-f", os.path.join(DEPLOY, f)]
            check = subprocess.run(args + ["config", "-q"], capture_output=True, text=True,
                                   timeout=60)
            self.assertEqual(check.returncode, 0, check.stderr)
            self.assertNotIn("not set", check.stderr)
        # Every worker advertises the name the router reaches it by, and Prometheus scrapes
        # the ports the services expose metrics on.
        with open(os.path.join(DEPLOY, "docker-compose.yml")) as f:
            text = f.read()
        with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
            scrape = f.read()
        workers = re.findall(r'--advertise=([a-z0-9-]+):\d+".*?--metrics-port=(\d+)', text, re.S)
        self.assertEqual(len(workers), 2)
        for service, port in workers:
            self.assertIn(f'"{service}:{port}"', scrape)

    def test_model_shapes_give_a_roofline(self):
        for name in sorted(os.listdir(os.path.join(DEPLOY, "models"))):
            if not os.path.isdir(os.path.join(DEPLOY, "models", name)):
                continue
            code, out, err = ct.run([ct.binary("cleave"), "roofline", f"--model={name}",
                                     "--hardware=h200", "--dtype=fp8", "--tp=8"])
            self.assertEqual(code, 0, err)
            self.assertIn("ceiling", out)


if __name__ == "__main__":
    unittest.main()
