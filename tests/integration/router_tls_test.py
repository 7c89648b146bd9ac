"""cleave-router serving TLS with --tls-client-ca, as real processes with certificates from
scripts/make-test-certs.sh:

  * plaintext to the TLS port fails; a client that trusts the CA is served without a
    client certificate (API clients need none);
  * the worker registry refuses a caller without a client certificate (UNAUTHENTICATED)
    and one whose certificate another CA signed (the handshake fails);
  * a cleave-worker with --router-ca and its certificate registers and serves a request
    through the TLS router (which calls it over TLS with its own certificate,
    --worker-ca); one without a certificate never registers; the worker's own port
    answers nobody but holders of a certificate from the CA;
  * the cleave CLI reaches the router with CLEAVE_TLS_CA.
"""
import os
import subprocess
import tempfile
import time
import unittest

import grpc

import cleave_testing as ct

MODEL = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def read(path):
    with open(path, "rb") as f:
        return f.read()


class RouterTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()
        cls.certs = tempfile.mkdtemp(prefix="cleave-certs-")
        subprocess.run([os.path.join(ct.SOURCE_DIR, "scripts", "make-test-certs.sh"), cls.certs],
                       check=True, capture_output=True, timeout=120)
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--tls-cert={cls.cert('server.pem')}",
                                 f"--tls-key={cls.cert('server.key')}",
                                 f"--tls-client-ca={cls.cert('ca.pem')}",
                                 f"--worker-ca={cls.cert('ca.pem')}"])
        cls.address = f"127.0.0.1:{cls.router.ready['grpc_port']}"

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs, name)

    @classmethod
    def tearDownClass(cls):
        code = cls.router.stop()
        assert code == 0, f"router exited with {code}:\n{cls.router.log()}"

    def test_the_plain_http_api_stays_on_loopback_with_tls(self):
        args = [ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0",
                f"--tls-cert={self.cert('server.pem')}", f"--tls-key={self.cert('server.key')}"]
        code, _, err = ct.run(args + ["--http-listen=0.0.0.0:0"])
        self.assertEqual(code, 2, err)
        self.assertIn("loopback", err)
        router = ct.Process(args + ["--http-listen=127.0.0.1:0"])
        try:
            status, _ = ct.http_get(router.ready["http_port"], "/health")
            self.assertEqual(status, 200)
        finally:
            self.assertEqual(router.stop(), 0)

    def channel(self, client=None):
        key, chain = (read(self.cert(client + ".key")), read(self.cert(client + ".pem"))) \
            if client else (None, None)
        credentials = grpc.ssl_channel_credentials(read(self.cert("ca.pem")), key, chain)
        return grpc.secure_channel(self.address, credentials)

    def list_models(self, channel):
        stub = self.pb["generation_grpc"].GenerationStub(channel)
        return stub.ListModels(self.pb["generation_pb2"].ListModelsRequest(), timeout=10)

    def register(self, channel):
        stub = self.pb["worker_grpc"].RegistryStub(channel)
        return stub.Heartbeat(self.pb["worker_pb2"].HeartbeatRequest(worker_id="nobody"),
                              timeout=10)

    def test_clients_need_the_ca_but_no_certificate(self):
        with grpc.insecure_channel(self.address) as plain:
            with self.assertRaises(grpc.RpcError) as caught:
                self.list_models(plain)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
        with self.channel() as secure:
            self.list_models(secure)

    def test_the_registry_needs_a_worker_certificate_from_the_ca(self):
        with self.channel() as anonymous:
            with self.assertRaises(grpc.RpcError) as caught:
                self.register(anonymous)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
            self.assertIn("client certificate", caught.exception.details())
        with self.channel("rogue-worker") as rogue:
            with self.assertRaises(grpc.RpcError) as caught:
                self.register(rogue)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
        with self.channel("worker") as worker:
            self.assertTrue(self.register(worker).reregister)  # Known to be unknown: served.

    @unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing")
    def test_a_worker_with_its_certificate_registers_and_serves(self):
        common = [ct.binary("cleave-worker"), f"--model={MODEL}", f"--router={self.address}",
                  "--listen=127.0.0.1:0", "--metrics-port=0", "--target-concurrency=2",
                  "--planned-seq-len=128", "--threads=1", f"--router-ca={self.cert('ca.pem')}"]
        without = ct.Process(common)
        good = ct.Process(common + [f"--tls-cert={self.cert('worker.pem')}",
                                    f"--tls-key={self.cert('worker.key')}"])
        try:
            pb = self.pb["generation_pb2"]
            with self.channel() as channel:
                stub = self.pb["generation_grpc"].GenerationStub(channel)
                deadline = time.monotonic() + 60
                while not stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).workers:
                    self.assertLess(time.monotonic(), deadline, good.log())
                    time.sleep(0.1)
                # The worker without a certificate keeps being refused.
                while "client certificate" not in without.log():
                    self.assertLess(time.monotonic(), deadline, without.log())
                    time.sleep(0.1)
                workers = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).workers
                self.assertEqual([w.address for w in workers],
                                 [f"127.0.0.1:{good.ready['grpc_port']}"])
                self.assertIn("client certificate", without.log())
                request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1000, 2000, 3000]),
                                             stopping=pb.StoppingCriteria(max_new_tokens=4,
                                                                          ignore_eos=True))
                ids = [t for m in stub.Generate(request, timeout=60) for t in m.token_ids]
                self.assertEqual(len(ids), 4)
            # The worker's port: plaintext and anonymous TLS callers are turned away.
            worker_address = f"127.0.0.1:{good.ready['grpc_port']}"
            release = self.pb["worker_pb2"].ReleaseRequest(request_id="x")
            anonymous = grpc.ssl_channel_credentials(read(self.cert("ca.pem")))
            for channel in (grpc.insecure_channel(worker_address),
                            grpc.secure_channel(worker_address, anonymous)):
                with channel, self.assertRaises(grpc.RpcError) as caught:
                    self.pb["worker_grpc"].DecodeControlStub(channel).Release(release, timeout=10)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
            env = dict(os.environ, CLEAVE_TLS_CA=self.cert("ca.pem"))
            done = subprocess.run([ct.binary("cleave"), "info", f"--router={self.address}"],
                                  capture_output=True, text=True, timeout=60, env=env)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(f"127.0.0.1:{good.ready['grpc_port']}", done.stdout)
        finally:
            self.assertEqual(good.stop(), 0)
            self.assertEqual(without.stop(), 0)


if __name__ == "__main__":
    unittest.main()
