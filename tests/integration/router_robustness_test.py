"""A running cleave-router stays healthy when the transport itself is abused:

  * raw garbage, a half HTTP/2 preface, and frames that break the HTTP/2 rules on a TCP
    connection to its port;
  * connections opened and dropped mid-request;
  * messages larger than it accepts (a 64 MiB prompt), answered RESOURCE_EXHAUSTED;
  * a message whose bytes are not a valid protobuf, answered INTERNAL or INVALID_ARGUMENT.

After each, the health check still answers SERVING and a normal call still works.
"""
import os
import random
import socket
import struct
import unittest

import grpc

import cleave_testing as ct


def frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) \
        + payload


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class RouterRobustnessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0"])
        cls.port = cls.router.ready["grpc_port"]
        cls.address = f"127.0.0.1:{cls.port}"

    @classmethod
    def tearDownClass(cls):
        code = cls.router.stop()
        assert code == 0, f"router exited with {code}:\n{cls.router.log()}"

    def assertHealthy(self):
        self.assertIsNone(self.router.proc.poll(), self.router.log())
        with grpc.insecure_channel(self.address) as channel:
            health = self.pb["health_grpc"].HealthStub(channel)
            status = health.Check(self.pb["health_pb2"].HealthCheckRequest(service=""),
                                  timeout=10)
            self.assertEqual(status.status, self.pb["health_pb2"].HealthCheckResponse.SERVING)
            stub = self.pb["generation_grpc"].GenerationStub(channel)
            stub.ListModels(self.pb["generation_pb2"].ListModelsRequest(), timeout=10)

    def send_raw(self, data, read=True):
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(data)
            if read:
                try:
                    while s.recv(65536):
                        pass
                except (socket.timeout, ConnectionResetError):
                    pass

    def test_garbage_and_broken_http2_leave_it_serving(self):
        rng = random.Random(1)
        cases = [
            bytes(rng.randrange(256) for _ in range(4096)),              # noise
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                          # not HTTP/2
            PREFACE[:10],                                                  # half a preface
            PREFACE + frame(4, 0, 0, b"") + frame(0xFF, 0, 1, b"x" * 50),  # unknown frame type
            PREFACE + frame(4, 0, 3, b""),                                 # SETTINGS on a stream
            PREFACE + frame(4, 0, 0, b"") + frame(1, 4, 2, b"\xff" * 64),  # bad HPACK, even id
            PREFACE + frame(4, 0, 0, b"") + frame(0, 1, 1, b"data"),       # DATA on idle stream
            PREFACE + frame(4, 0, 0, b"") + struct.pack(">I", 0xFFFFFFFF)[1:] + b"\x00\x00" * 3,
        ]
        for data in cases:
            self.send_raw(data)
            self.assertHealthy()
        for _ in range(50):  # Dropped mid-preface, many times.
            self.send_raw(PREFACE[:5], read=False)
        self.assertHealthy()

    def test_oversized_and_malformed_messages_get_a_status(self):
        with grpc.insecure_channel(self.address) as channel:
            stub = self.pb["generation_grpc"].GenerationStub(channel)
            huge = self.pb["generation_pb2"].GenerateRequest(text="x" * (64 << 20))
            with self.assertRaises(grpc.RpcError) as caught:
                list(stub.Generate(huge, timeout=30))
            self.assertEqual(caught.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            raw = channel.unary_unary("/cleave.v1.Generation/Tokenize",
                                      request_serializer=lambda b: b,
                                      response_deserializer=lambda b: b)
            for junk in (b"\xff" * 32, b"\x0a\xff\xff\xff\xff\x0f", os.urandom(1024)):
                try:
                    raw(junk, timeout=10)
                except grpc.RpcError as e:
                    self.assertIn(e.code(), (grpc.StatusCode.INTERNAL,
                                             grpc.StatusCode.INVALID_ARGUMENT,
                                             grpc.StatusCode.FAILED_PRECONDITION,
                                             grpc.StatusCode.NOT_FOUND))
        self.assertHealthy()


if __name__ == "__main__":
    unittest.main()
