# Third-party dependencies: Debian packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(civetweb CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)

# Integration tests drive the binaries from Debian's Python, which carries grpcio.
find_program(CLEAVE_TEST_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(CLEAVE_PROMTOOL promtool)
find_package(nlohmann_json CONFIG REQUIRED)
# Collectives between the rank threads of a CPU tensor-parallel group.
find_package(Gloo CONFIG REQUIRED)
# SHA-256 of model files (the fingerprint workers register with).
find_package(OpenSSL REQUIRED)
