"""cleave-router as a real process, checked by independent clients: Python grpcio stubs
generated from the .proto files, the standard health and reflection services, and
Prometheus' own promtool on the /metrics output."""
import os
import subprocess
import time
import unittest

import grpc

import cleave_testing as ct


class RouterHealthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen", "127.0.0.1:0",
                                 "--metrics-port", "0", "--queue-capacity", "33"])
        cls.address = f"127.0.0.1:{cls.router.ready['grpc_port']}"
        cls.channel = grpc.insecure_channel(cls.address)
        grpc.channel_ready_future(cls.channel).result(timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.router.stop()
        assert code == 0, f"router exited with {code}:\n{cls.router.log()}"

    def test_health_check_reports_serving(self):
        stub = self.pb["health_grpc"].HealthStub(self.channel)
        request = self.pb["health_pb2"].HealthCheckRequest
        serving = self.pb["health_pb2"].HealthCheckResponse.SERVING
        self.assertEqual(stub.Check(request(service=""), timeout=10).status, serving)
        self.assertEqual(stub.Check(request(service="cleave.v1.Generation"), timeout=10).status,
                         serving)
        with self.assertRaises(grpc.RpcError) as caught:
            stub.Check(request(service="no.such.Service"), timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_reflection_lists_the_services(self):
        pb2 = self.pb["reflection_pb2"]
        stub = self.pb["reflection_grpc"].ServerReflectionStub(self.channel)
        responses = list(stub.ServerReflectionInfo(
            iter([pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        self.assertEqual(len(responses), 1)
        names = {s.name for s in responses[0].list_services_response.service}
        self.assertIn("cleave.v1.Generation", names)
        self.assertIn("grpc.health.v1.Health", names)

    def test_an_idle_client_keeps_its_connection(self):
        # A Python client does not read its socket between calls: were the router to ping it
        # while idle (every 10 s, 5 s to answer), it would close the connection, and the next
        # call would fail with UNAVAILABLE, "Broken pipe" (seen 31 s after the last call).
        with grpc.insecure_channel(self.address) as channel:
            stub = self.pb["generation_grpc"].GenerationStub(channel)
            request = self.pb["generation_pb2"].GetServerInfoRequest()
            stub.GetServerInfo(request, timeout=10)
            time.sleep(36)
            self.assertEqual(stub.GetServerInfo(request, timeout=10).queue_capacity, 33)

    def test_server_info_matches_the_binary_version(self):
        stub = self.pb["generation_grpc"].GenerationStub(self.channel)
        info = stub.GetServerInfo(self.pb["generation_pb2"].GetServerInfoRequest(), timeout=10)
        code, out, _ = ct.run([ct.binary("cleave-router"), "--version"])
        self.assertEqual(code, 0)
        self.assertIn(info.version, out)
        self.assertIn(info.git_commit, out)
        self.assertEqual(info.queue_capacity, 33)
        self.assertEqual(len(info.workers), 0)

    def test_generate_statuses(self):
        pb2 = self.pb["generation_pb2"]
        stub = self.pb["generation_grpc"].GenerationStub(self.channel)
        bad = pb2.GenerateRequest(text="hi", sampling=pb2.SamplingParams(top_k=-3))
        with self.assertRaises(grpc.RpcError) as caught:
            list(stub.Generate(bad, timeout=10))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.top_k", caught.exception.details())
        with self.assertRaises(grpc.RpcError) as caught:
            list(stub.Generate(pb2.GenerateRequest(text="hi"), timeout=10))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("no decode worker", caught.exception.details())

    def test_metrics_pass_promtool(self):
        # Make sure the request counter has samples.
        stub = self.pb["generation_grpc"].GenerationStub(self.channel)
        stub.ListModels(self.pb["generation_pb2"].ListModelsRequest(), timeout=10)
        status, body = ct.http_get(self.router.ready["metrics_port"])
        self.assertEqual(status, 200)
        self.assertIn('cleave_build_info{', body)
        self.assertIn('component="router"', body)
        self.assertRegex(body, r'cleave_router_requests_total\{[^}]*method="ListModels"[^}]*\} [1-9]')
        promtool = os.environ.get("CLEAVE_PROMTOOL") or "promtool"
        check = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                               capture_output=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)


if __name__ == "__main__":
    unittest.main()
