"""A `cleave up` deployment (router, prefill worker, decode worker) under a `cleave bench`
sweep, every process scraped throughout:

  * each /metrics passes `promtool check metrics` and exports exactly what docs/metrics.md
    documents for its binary;
  * the metrics move as the load predicts: the router answers and admits every request
    once; the prefill worker computes every prompt token, samples each first token and
    writes each prompt's KV blocks into the decode worker; the decode worker samples the
    other tokens, its batch reaches the target and never passes it; every reserved block
    comes back (router and both workers at 0); the memory plan's terms add up;
  * `cleave bench` reports the load it sent, and its HTML report's charts are valid SVG
    with one point per sweep point and series.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from deploy_files_test import documented_metrics  # noqa: E402
from serving_test import MODEL  # noqa: E402

TARGET = 8
# Below the target, and past what the router admits to a decode worker (twice its target:
# one batch decoding, one prefilled ahead), so requests also wait in the router.
SWEEP = (4, 2 * TARGET + 4)
REQUESTS, WARMUP = 20, 2  # Per sweep point.
PROMPT, OUTPUT = 40, 64  # Tokens: a 40-token prompt fills 3 KV blocks of 16.
# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, bf16 keys and values (the default), per
# position.
KV_BYTES_PER_POSITION = 30 * 3 * 64 * 2 * 2
SVG = "{http://www.w3.org/2000/svg}"


def scrape(port):
    """{(name, labels): value} of one /metrics page, and the page."""
    _, body = ct.http_get(port)
    values = {}
    for line in body.splitlines():
        match = re.match(r"^([a-z_:]+)(\{[^}]*\})? ([0-9.e+-]+|NaN)$", line)
        if match:
            values[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return values, body


def value(values, name, labels=""):
    if (name, labels) not in values:
        raise AssertionError(f"{name}{labels} is not exported")
    return values[(name, labels)]


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class ObservabilityTest(unittest.TestCase):
    def test_metrics_of_every_process_move_as_the_load_predicts(self):
        up = ct.Process([ct.binary("cleave"), "up", f"--model={MODEL}", "--listen=127.0.0.1:0",
                         "--prefill=1", "--decode=1", "--threads=1",
                         f"--target-concurrency={TARGET}", "--planned-seq-len=256"],
                        ready_timeout=120)
        try:
            self.run_load(up)
        finally:
            up.proc.send_signal(2)  # SIGINT: cleave up stops its children.
            up.proc.wait(60)

    def run_load(self, up):
        ports = {"router": up.ready["metrics_port"],
                 "prefill": up.ready["prefill-0_metrics_port"],
                 "decode": up.ready["decode-0_metrics_port"]}
        before = {name: scrape(port)[0] for name, port in ports.items()}
        # Watch the decode batch and the queue while the sweep runs.
        samples, stop = [], threading.Event()

        def watch():
            while not stop.is_set():
                decode, _ = scrape(ports["decode"])
                router, _ = scrape(ports["router"])
                samples.append((value(router, "cleave_router_queue_depth"),
                                value(decode, "cleave_worker_decode_sequences")))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        out = tempfile.mkdtemp(prefix="cleave-bench-")
        try:
            code, stdout, stderr = ct.run(
                [ct.binary("cleave"), "bench", f"--router=127.0.0.1:{up.ready['grpc_port']}",
                 f"--sweep={','.join(map(str, SWEEP))}", f"--requests={REQUESTS}",
                 f"--warmup={WARMUP}", f"--prompt-len={PROMPT}", f"--output-len={OUTPUT}",
                 "--label=disaggregated", f"--json={out}/bench.json", f"--html={out}/bench.html"],
                timeout=300)
        finally:
            stop.set()
            watcher.join()
        self.assertEqual(code, 0, stdout + stderr)
        print("\n" + stdout)
        sent = len(SWEEP) * (REQUESTS + WARMUP)

        # The decode batch reached the target and never passed it.
        batches = [b for _, b in samples]
        self.assertEqual(max(batches), TARGET, f"decode batch samples: {sorted(set(batches))}")
        self.assertGreater(sum(1 for q, _ in samples if q > 0), 0, "no request ever waited")

        # Every reservation comes back.
        deadline = time.monotonic() + 20
        while True:
            after = {name: scrape(port)[0] for name, port in ports.items()}
            held = (value(after["router"], "cleave_router_reserved_blocks"),
                    value(after["prefill"], "cleave_worker_kv_blocks_reserved"),
                    value(after["decode"], "cleave_worker_kv_blocks_reserved"))
            if held == (0, 0, 0):
                break
            self.assertLess(time.monotonic(), deadline, f"blocks still reserved: {held}")
            time.sleep(0.1)

        def delta(process, name, labels=""):
            return value(after[process], name, labels) - before[process].get((name, labels), 0)

        self.assertEqual(delta("router", "cleave_router_requests_total",
                               '{code="OK",method="Generate"}'), sent)
        self.assertEqual(delta("router", "cleave_router_admissions_total",
                               '{outcome="admitted"}'), sent)
        self.assertEqual(delta("router", "cleave_router_time_to_first_token_seconds_count"), sent)
        self.assertEqual(delta("router", "cleave_router_prefill_seconds_count"), sent)
        self.assertEqual(delta("router", "cleave_router_kv_transfer_seconds_count"), sent)
        # Every prompt token was computed or came from the prefix cache (the sweep's points
        # send the same prompts, request i of each being the same).
        self.assertEqual(delta("prefill", "cleave_worker_prefix_cache_lookup_tokens_total"),
                         sent * PROMPT)
        self.assertEqual(delta("prefill", "cleave_worker_prefill_tokens_total")
                         + delta("prefill", "cleave_worker_prefix_cache_hit_tokens_total"),
                         sent * PROMPT)
        self.assertEqual(delta("prefill", "cleave_worker_generated_tokens_total"), sent)
        # Every prompt's three blocks, less those the decode worker held already (the
        # sweep's repeated prompts).
        cached = delta("decode", "cleave_worker_kv_reserve_cached_blocks_total")
        self.assertGreater(cached, 0)
        self.assertEqual(delta("prefill", "cleave_worker_kv_sent_bytes_total"),
                         (sent * 3 - cached) * 16 * KV_BYTES_PER_POSITION)
        self.assertEqual(delta("prefill", "cleave_worker_kv_send_seconds_count"), sent)
        self.assertEqual(delta("prefill", "cleave_worker_kv_send_failures_total"), 0)
        self.assertEqual(delta("decode", "cleave_worker_generated_tokens_total"),
                         sent * (OUTPUT - 1))
        self.assertEqual(delta("decode", "cleave_worker_prefill_tokens_total"), 0)
        floor = delta("decode", "cleave_worker_step_floor_seconds_total")
        spent = delta("decode", "cleave_worker_step_seconds_total")
        self.assertGreater(floor, 0)
        # No step beats its floor by more than the bandwidth probe's error: the worker measures
        # its floor's bandwidth once at start, and a test running beside it then (ctest runs two
        # at once) slows every pass of the probe, raising the floor by up to ~15% here.
        self.assertLess(floor, 1.3 * spent)
        print(f"decode worker efficiency over the sweep: {floor / spent:.2f}")
        for process in ("prefill", "decode"):
            plan = {term: value(after[process], "cleave_worker_memory_plan_bytes",
                                f'{{term="{term}"}}')
                    for term in ("budget", "weights", "workspace", "kv_pool")}
            self.assertEqual(plan["budget"], plan["weights"] + plan["workspace"] + plan["kv_pool"])
        decode_id = next(labels for (name, labels) in after["router"]
                         if name == "cleave_router_worker_admitted_requests")
        self.assertEqual(value(after["router"], "cleave_router_worker_reserved_blocks", decode_id),
                         0)

        # Every page is valid for Prometheus and exports what docs/metrics.md documents.
        promtool = os.environ.get("CLEAVE_PROMTOOL") or "promtool"
        documented = documented_metrics()
        for process, port in ports.items():
            _, body = scrape(port)
            check = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                                   capture_output=True, timeout=60)
            self.assertEqual(check.returncode, 0, f"{process}: {check.stdout}{check.stderr}")
            exported = set(re.findall(r"^# TYPE (cleave_[a-z0-9_]+)", body, re.M))
            section = "cleave-router" if process == "router" else "cleave-worker"
            self.assertEqual(exported - documented["Every process"], documented[section], process)

        self.check_bench_results(out)

    def check_bench_results(self, out):
        with open(os.path.join(out, "bench.json")) as f:
            result = json.load(f)
        self.assertEqual([p["concurrency"] for p in result["points"]], list(SWEEP))
        for point in result["points"]:
            s = point["summary"]
            self.assertEqual((s["requests"], s["failed"]), (REQUESTS, 0))
            self.assertEqual(s["output_tokens"], REQUESTS * OUTPUT)
            self.assertEqual(s["prompt_tokens"], REQUESTS * PROMPT)
            self.assertEqual(s["itl_ms"]["count"], REQUESTS * (OUTPUT - 1))
            self.assertGreater(s["output_token_rate"], 0)
            self.assertLessEqual(s["ttft_ms"]["p50"], s["ttft_ms"]["p99"])
        with open(os.path.join(out, "bench.html")) as f:
            html = f.read()
        charts = [ET.fromstring(svg) for svg in re.findall(r"<svg.*?</svg>", html, re.S)]
        self.assertEqual(len(charts), 4)
        for chart in charts:
            series = chart.findall(f"{SVG}g[@class='series']")
            self.assertIn(len(series), (1, 2))  # Throughput; or p50 and p99 of a latency.
            for s in series:
                points = s.findall(f"{SVG}circle[@class='point']")
                self.assertEqual(len(points), len(SWEEP))
                for p in points:  # Inside the plot.
                    self.assertTrue(0 <= float(p.get("cx")) <= 600, p.attrib)
                    self.assertTrue(0 <= float(p.get("cy")) <= 380, p.attrib)
        # The throughput chart plots the JSON's numbers against the sweep's concurrencies.
        throughput = charts[0].findall(f"{SVG}g[@class='series']/{SVG}circle")
        self.assertEqual([float(p.get("data-x")) for p in throughput], list(SWEEP))
        for p, point in zip(throughput, result["points"]):
            self.assertAlmostEqual(float(p.get("data-y")) / point["summary"]["output_token_rate"],
                                   1, places=3)


if __name__ == "__main__":
    unittest.main()
