"""Helpers for tests that drive Cleave's binaries as separate processes on loopback.

Every wait has a deadline; nothing sleeps to synchronize except polling for a file or a
process that has a deadline of its own.
"""
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN_DIR = os.environ.get("CLEAVE_BIN_DIR", "")
SOURCE_DIR = os.environ.get("CLEAVE_SOURCE_DIR",
                            os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def binary(name):
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not built; set CLEAVE_BIN_DIR to the build's bin/ folder")
    return path


_STUBS = None


def stubs():
    """Generates Python stubs from the repository's .proto files (and the standard health and
    reflection protos) with the system protoc, imports them, and returns them by name."""
    global _STUBS
    if _STUBS is not None:
        return _STUBS
    out = tempfile.mkdtemp(prefix="cleave-stubs-")
    proto_root = os.path.join(SOURCE_DIR, "proto")
    std_root = os.path.join(SOURCE_DIR, "tests", "integration", "protos")
    plugin = shutil.which("grpc_python_plugin")
    if plugin is None:
        raise RuntimeError("grpc_python_plugin not found; run scripts/install-deps.sh")
    for root, files in ((proto_root, ["cleave/v1/generation.proto", "cleave/v1/worker.proto"]),
                        (std_root, ["grpc/health/v1/health.proto",
                                    "grpc/reflection/v1alpha/reflection.proto"])):
        subprocess.run(["protoc", f"-I{root}", f"--python_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={plugin}", *files], check=True)
    sys.path.insert(0, out)
    names = {
        "generation_pb2": "cleave.v1.generation_pb2",
        "generation_grpc": "cleave.v1.generation_pb2_grpc",
        "worker_pb2": "cleave.v1.worker_pb2",
        "worker_grpc": "cleave.v1.worker_pb2_grpc",
        "health_pb2": "grpc.health.v1.health_pb2",
        "health_grpc": "grpc.health.v1.health_pb2_grpc",
        "reflection_pb2": "grpc.reflection.v1alpha.reflection_pb2",
        "reflection_grpc": "grpc.reflection.v1alpha.reflection_pb2_grpc",
    }
    # The generated packages "cleave" and "grpc.health" live under `out`; the real grpc
    # package must stay importable, so extend its package path instead of shadowing it.
    import grpc
    grpc.__path__.append(os.path.join(out, "grpc"))
    _STUBS = {key: importlib.import_module(module) for key, module in names.items()}
    return _STUBS


class Process:
    """A child process started with --ready-file; stop() sends SIGTERM and waits."""

    def __init__(self, args, ready_timeout=60.0, env=None):
        self.workdir = tempfile.mkdtemp(prefix="cleave-proc-")
        self.ready_path = os.path.join(self.workdir, "ready.json")
        self.log_path = os.path.join(self.workdir, "stderr.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args + ["--ready-file", self.ready_path],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.ready = self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_path):
                with open(self.ready_path) as f:
                    return json.load(f)
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError(f"not ready within {timeout}s:\n{self.log()}")

    def log(self):
        if not self._log.closed:
            self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, timeout=30.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"did not stop within {timeout}s after SIGTERM:\n{self.log()}")
        self._log.close()
        return self.proc.returncode


def run(args, timeout=60.0):
    """Runs a command to completion; returns (exit code, stdout, stderr)."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def http_get(port, path="/metrics", timeout=10.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
        return response.status, response.read().decode()


def listening_socket():
    """A socket bound and listening on a free loopback port (to make a port 'in use')."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def metric(port, name, **labels):
    """The value of an unlabelled metric (or the first series of a labelled one), or of the
    series with exactly `labels`."""
    _, text = http_get(port)
    if labels:
        series = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        match = re.search(rf"^{name}{{{re.escape(series)}}} ([0-9.e+-]+)$", text, re.M)
    else:
        match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    if match is None:
        raise AssertionError(f"{name} not in the metrics of port {port}")
    return float(match.group(1))


def wait_for_metric(port, name, at_least, seconds=15.0, **labels):
    """Polls until a metric (as metric() reads it) reaches `at_least`; returns its value.
    For what a process counts after its reply has left (an HTTP status is counted once the
    response is written), or on another thread."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = metric(port, name, **labels)
        except AssertionError:  # Not exported until first counted.
            value = None
        if value is not None and value >= at_least:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels or ''} stayed at {value}, below {at_least}, "
                                 f"for {seconds} s")
        time.sleep(0.02)


def wait_until_nothing_reserved(router, workers, seconds=15.0):
    """Waits until the router and every worker still running hold no KV block (but fenced
    ones, held a while on purpose: docs/reliability.md; fenced reservations sharing a
    cached block count it each, so a worker may hold fewer than it fenced); raises
    AssertionError naming what is still reserved when `seconds` pass."""
    deadline = time.monotonic() + seconds
    while True:
        port = router.ready["metrics_port"]
        held = {"router": metric(port, "cleave_router_reserved_blocks")}
        for i, w in enumerate(workers):
            if w.proc.poll() is None:
                port = w.ready["metrics_port"]
                held[f"worker {i}"] = max(0.0, metric(port, "cleave_worker_kv_blocks_reserved") -
                                          metric(port, "cleave_worker_kv_blocks_fenced"))
        if not any(held.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks still reserved after {seconds:.0f} s: {held}")
        time.sleep(0.1)


def wait_for_workers(stub, count, seconds=60.0, metadata=None):
    """Waits until the router behind Generation `stub` lists `count` registered workers
    (`metadata`: the call's, an API key's authorization for one)."""
    request = stubs()["generation_pb2"].GetServerInfoRequest()
    deadline = time.monotonic() + seconds
    while len(stub.GetServerInfo(request, timeout=5, metadata=metadata).workers) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} workers registered in {seconds:.0f} s")
        time.sleep(0.05)
