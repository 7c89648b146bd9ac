// `cleave info`: what a running router reports about itself and its workers.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "services/cli/commands.h"
#include "services/cli/router_client.h"

namespace cleave::cli {
namespace {

const char* roleName(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL: return "prefill";
    case v1::WORKER_ROLE_DECODE: return "decode";
    case v1::WORKER_ROLE_BOTH: return "both";
    default: return "unknown";
  }
}

}  // namespace

int runInfo(int argc, char** argv) {
  std::string router = "127.0.0.1:50051";
  int64_t timeout_ms = 5000;
  FlagSet flags("cleave info", "[flags]",
                "Prints the version, admission queue and registered workers of a running "
                "router.");
  flags.addString("router", &router, "Router address host:port");
  flags.addInt("timeout-ms", &timeout_ms, "How long to wait for the router");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (!positional.empty()) {
    exitWithUsageError(flags, absl::InvalidArgumentError("unexpected argument " + positional[0]));
  }
  client::RouterClient client(
      {.address = router, .timeout = std::chrono::milliseconds(timeout_ms)});
  absl::Status connected = client.waitUntilConnected();
  absl::StatusOr<v1::GetServerInfoResponse> info =
      connected.ok() ? client.serverInfo() : absl::StatusOr<v1::GetServerInfoResponse>(connected);
  if (!info.ok()) {
    std::fprintf(stderr, "cleave info: %s\n", std::string(info.status().message()).c_str());
    return 1;
  }
  std::printf("router %s: version %s (commit %s)\n", router.c_str(), info->version().c_str(),
              info->git_commit().c_str());
  std::printf("admission queue: %u waiting, capacity %u\n", info->queue_depth(),
              info->queue_capacity());
  std::printf("workers: %d registered\n", info->workers_size());
  for (const v1::WorkerSummary& w : info->workers()) {
    // Blocks held for others (fenced, another router's) show only when there are some.
    const std::string foreign =
        w.kv_blocks_foreign() > 0 ? absl::StrFormat(" (+%u held for others)", w.kv_blocks_foreign())
                                  : std::string();
    std::printf("  %s\n",
                absl::StrFormat("%-12s %-7s tp=%u model=%s running=%u/%u kv=%u%s/%u %s",
                                w.worker_id(), roleName(w.role()), w.tp_size(), w.model(),
                                w.running(), w.target_concurrency(), w.kv_blocks_reserved(),
                                foreign, w.kv_blocks_total(), w.healthy() ? "healthy" : "UNHEALTHY")
                    .c_str());
  }
  return 0;
}

}  // namespace cleave::cli
