// Process-wide Prometheus metrics.
//
// Every Cleave process has exactly one registry (metricsRegistry()); modules add their
// families to it. A MetricsServer exposes that registry as text at http://ADDRESS:PORT/metrics.
// Each process also exports cleave_build_info and cleave_process_start_time_seconds.
//
// Threading: the registry and the families in it are thread-safe (prometheus-cpp).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}

namespace cleave {

// The process's registry. `component` names the binary ("router", "worker") in the
// build-info metric; it is fixed by the first call.
prometheus::Registry& metricsRegistry();
void registerProcessMetrics(const std::string& component);

// An unlabelled gauge / counter `name` in metricsRegistry().
prometheus::Gauge& plainGauge(const std::string& name, const std::string& help);
prometheus::Counter& plainCounter(const std::string& name, const std::string& help);

// metricsRegistry() in Prometheus's text format, as MetricsServer serves it (for another
// server's /metrics route).
std::string metricsText();

class MetricsServer {
 public:
  // Serves metricsRegistry() on `address`:`port` (port 0 picks a free port). Fails with
  // a message naming the address when the port is taken or not permitted.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> start(const std::string& address, int port);
  ~MetricsServer();

  // The port actually bound.
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace cleave
