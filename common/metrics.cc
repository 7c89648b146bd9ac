#include "common/metrics.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace cleave {

namespace {
// Never destroyed: exporters and metric handles may outlive main().
std::shared_ptr<prometheus::Registry> sharedRegistry() {
  static auto* registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}
}  // namespace

prometheus::Registry& metricsRegistry() { return *sharedRegistry(); }

void registerProcessMetrics(const std::string& component) {
  static bool registered = [&] {
    prometheus::Registry& registry = metricsRegistry();
    prometheus::BuildGauge()
        .Name("cleave_build_info")
        .Help("Constant 1, labelled with the version and commit of the running binary")
        .Register(registry)
        .Add({{"component", component}, {"version", version()}, {"commit", gitCommit()}})
        .Set(1);
    double start =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    prometheus::BuildGauge()
        .Name("cleave_process_start_time_seconds")
        .Help("Start time of the process since the Unix epoch, in seconds")
        .Register(registry)
        .Add({{"component", component}})
        .Set(start);
    return true;
  }();
  (void)registered;
}

std::string metricsText() {
  return prometheus::TextSerializer().Serialize(metricsRegistry().Collect());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& address,
                                                                    int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port ", port, " is out of range; use 0..65535 (0 picks one)"));
  }
  std::string bind = absl::StrCat(address, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", bind, " (", e.what(),
        "); the port may be in use: pick another --metrics-port, or 0 for any free port"));
  }
  exposer->RegisterCollectable(sharedRegistry());
  std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics server on ", bind, " bound no port"));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), ports.front()));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

prometheus::Gauge& plainGauge(const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(metricsRegistry()).Add({});
}

prometheus::Counter& plainCounter(const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(metricsRegistry()).Add({});
}

}  // namespace cleave
