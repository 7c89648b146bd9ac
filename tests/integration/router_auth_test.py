"""cleave-router with --api-keys, as a real process, checked with grpcio stubs generated
from the .proto files and with the cleave CLI:

  * no key, a malformed one or an unknown one is UNAUTHENTICATED on every Generation call,
    with a message that says what to send; a listed key is accepted; health checks need no
    key (probes);
  * a key removed from the file is refused within seconds, without a restart;
  * the cleave CLI sends CLEAVE_API_KEY;
  * the router's log never contains a key;
  * with --api-key-rate, a key past its rate gets RESOURCE_EXHAUSTED on Generate, with the
    time until it may call again as grpc-retry-pushback-ms (HTTP: 429 with Retry-After and
    retry-after-ms).
"""
import http.client
import json
import os
import re
import subprocess
import tempfile
import time
import unittest

import grpc

import cleave_testing as ct

ALPHA = "alpha-" + "7f3a9c21" * 4
BETA = "beta-" + "19e0b4d6" * 4


class RouterAuthTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()
        cls.keys = os.path.join(tempfile.mkdtemp(prefix="cleave-keys-"), "keys")
        with open(cls.keys, "w") as f:
            f.write(f"# test keys\nteam-a {ALPHA}\nteam-b {BETA}\n")
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--api-keys={cls.keys}"])
        cls.address = f"127.0.0.1:{cls.router.ready['grpc_port']}"
        cls.channel = grpc.insecure_channel(cls.address)
        cls.stub = cls.pb["generation_grpc"].GenerationStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.router.stop()
        assert code == 0, f"router exited with {code}:\n{cls.router.log()}"

    def call(self, key=None, header=None):
        metadata = [("authorization", header if header is not None else f"Bearer {key}")]
        return self.stub.ListModels(self.pb["generation_pb2"].ListModelsRequest(), timeout=10,
                                    metadata=None if key is None and header is None else metadata)

    def expect_refused(self, words, **kwargs):
        with self.assertRaises(grpc.RpcError) as caught:
            self.call(**kwargs)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn(words, caught.exception.details())
        self.assertNotIn(ALPHA, caught.exception.details())

    def test_calls_need_a_listed_key(self):
        self.expect_refused("authorization: Bearer KEY")
        self.expect_refused("must be 'Bearer KEY'", header=f"Basic {ALPHA}")
        self.expect_refused("not valid", key=ALPHA + "0")
        self.expect_refused("not valid", key=ALPHA[:-1])
        self.call(key=ALPHA)
        self.call(key=BETA)
        pb = self.pb["generation_pb2"]
        for method, request in (("GetServerInfo", pb.GetServerInfoRequest()),
                                ("Tokenize", pb.TokenizeRequest(text="hi")),
                                ("Generate", pb.GenerateRequest(text="hi"))):
            with self.assertRaises(grpc.RpcError) as caught:
                result = getattr(self.stub, method)(request, timeout=10)
                if method == "Generate":
                    list(result)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED, method)
        health = self.pb["health_grpc"].HealthStub(self.channel)
        status = health.Check(self.pb["health_pb2"].HealthCheckRequest(service=""), timeout=10)
        self.assertEqual(status.status, self.pb["health_pb2"].HealthCheckResponse.SERVING)
        _, body = ct.http_get(self.router.ready["metrics_port"])
        self.assertRegex(body, r'cleave_router_requests_total\{code="UNAUTHENTICATED",'
                               r'method="ListModels"\} [1-9]')

    def test_the_cli_sends_cleave_api_key(self):
        code, _, err = ct.run([ct.binary("cleave"), "info", f"--router={self.address}"])
        self.assertNotEqual(code, 0)
        self.assertIn("API key", err)
        env = dict(os.environ, CLEAVE_API_KEY=BETA)
        done = subprocess.run([ct.binary("cleave"), "info", f"--router={self.address}"],
                              capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(done.returncode, 0, done.stderr)

    def test_a_revoked_key_is_refused_without_a_restart(self):
        with open(self.keys, "w") as f:
            f.write(f"team-b {BETA}\n")
        deadline = time.monotonic() + 10
        while True:
            try:
                self.call(key=ALPHA)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.UNAUTHENTICATED)
                break
            self.assertLess(time.monotonic(), deadline, "the revoked key still works")
            time.sleep(0.2)
        self.call(key=BETA)
        with open(self.keys, "w") as f:  # Back, for the other tests.
            f.write(f"team-a {ALPHA}\nteam-b {BETA}\n")
        time.sleep(1.2)

    def test_the_log_never_shows_a_key(self):
        self.expect_refused("not valid", key=ALPHA + "0")
        log = self.router.log()
        self.assertIn("API keys", log)
        for secret in (ALPHA, BETA, ALPHA[6:]):
            self.assertNotIn(secret, log)
        self.assertFalse(re.search(r"7f3a9c21", log))

    def test_a_key_over_its_rate_is_turned_away(self):
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--http-listen=127.0.0.1:0", "--metrics-port=0",
                             f"--api-keys={self.keys}", "--api-key-rate=0.2"])
        try:
            with grpc.insecure_channel(f"127.0.0.1:{router.ready['grpc_port']}") as channel:
                stub = self.pb["generation_grpc"].GenerationStub(channel)
                request = self.pb["generation_pb2"].GenerateRequest(text="hi")
                codes, hints = [], []
                for key in (ALPHA, ALPHA, BETA):
                    with self.assertRaises(grpc.RpcError) as caught:
                        list(stub.Generate(request, timeout=10,
                                           metadata=[("authorization", f"Bearer {key}")]))
                    codes.append(caught.exception.code())
                    hints.append(dict(caught.exception.trailing_metadata() or ())
                                 .get("grpc-retry-pushback-ms"))
                # No worker: the first call of each key gets past the key and its rate.
                self.assertEqual(codes, [grpc.StatusCode.UNAVAILABLE,
                                         grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         grpc.StatusCode.UNAVAILABLE])
                # The refused one is told when the key has a call to spend: within 5 s (one
                # call each 5 s, long enough that no bucket refills while this test runs).
                self.assertEqual([h is None for h in hints], [True, False, True])
                self.assertTrue(0 < int(hints[1]) <= 5000, hints)
                # Over HTTP: 429, and the same hint in the headers OpenAI's and Anthropic's
                # clients wait on.
                conn = http.client.HTTPConnection("127.0.0.1", router.ready["http_port"],
                                                  timeout=10)
                conn.request("POST", "/v1/completions",
                             json.dumps({"model": "m", "prompt": "hi", "max_tokens": 2}),
                             {"Authorization": f"Bearer {BETA}",
                              "Content-Type": "application/json"})
                answer = conn.getresponse()
                body = json.loads(answer.read())
                conn.close()
                self.assertEqual(answer.status, 429, body)
                self.assertIn("over its rate", body["error"]["message"])
                after_ms = int(answer.getheader("retry-after-ms"))
                self.assertTrue(0 < after_ms <= 5000, after_ms)
                self.assertEqual(answer.getheader("retry-after"), str((after_ms + 999) // 1000))
                # Rendering a chat draws on the rate too; plain tokenizing does not.
                pb = self.pb["generation_pb2"]
                metadata = [("authorization", f"Bearer {ALPHA}")]
                chat = pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user",
                                                                                 content="hi")]))
                for request, code in ((chat, grpc.StatusCode.RESOURCE_EXHAUSTED),
                                      (pb.TokenizeRequest(text="hi"),
                                       grpc.StatusCode.FAILED_PRECONDITION)):
                    with self.assertRaises(grpc.RpcError) as caught:
                        stub.Tokenize(request, timeout=10, metadata=metadata)
                    self.assertEqual(caught.exception.code(), code, caught.exception.details())
            # A channel whose retry policy (docs/reliability.md) covers RESOURCE_EXHAUSTED
            # waits out the hint and gets past the rate on its own: the call then reaches
            # the missing worker (UNAVAILABLE), where three quick retries would not have.
            config = json.dumps({"methodConfig": [{
                "name": [{"service": "cleave.v1.Generation"}],
                "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s",
                                "maxBackoff": "0.05s", "backoffMultiplier": 2,
                                "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]}}]})
            with grpc.insecure_channel(f"127.0.0.1:{router.ready['grpc_port']}",
                                       options=[("grpc.service_config", config),
                                                ("grpc.enable_retries", 1)]) as channel:
                stub = self.pb["generation_grpc"].GenerationStub(channel)
                metadata = [("authorization", f"Bearer {BETA}")]
                time.sleep(5.1)  # BETA's bucket refills.
                with self.assertRaises(grpc.RpcError) as caught:  # Spends it.
                    list(stub.Generate(request, timeout=10, metadata=metadata))
                self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
                started = time.monotonic()
                with self.assertRaises(grpc.RpcError) as caught:  # Refused, then retried.
                    list(stub.Generate(request, timeout=30, metadata=metadata))
                self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
                self.assertGreater(time.monotonic() - started, 2.5)
        finally:
            self.assertEqual(router.stop(), 0)


if __name__ == "__main__":
    unittest.main()
