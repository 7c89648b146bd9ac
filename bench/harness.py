"""What the benchmark scripts that drive real processes share: the build's binaries (the
default preset unless CLEAVE_BIN_DIR says otherwise), the test helpers that start and stop
them (tests/integration/cleave_testing.py, imported as `ct`), and the demo model."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("CLEAVE_BIN_DIR", os.path.join(ROOT, "build", "default", "bin"))
os.environ.setdefault("CLEAVE_SOURCE_DIR", ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import cleave_testing as ct  # noqa: E402,F401

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
