#include "common/grpc_logging.h"

#include <grpc/support/log.h>

#include "common/log.h"

namespace cleave {
namespace {

void logFromGrpc(gpr_log_func_args* args) {
  if (log::minLevel() > log::Level::kDebug) return;
  log::Message(log::Level::kDebug, args->file, args->line).stream()
      << "[grpc " << gpr_log_severity_string(args->severity) << "] " << args->message;
}

}  // namespace

void routeGrpcLogsToDebug() {
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  gpr_set_log_function(logFromGrpc);
}

}  // namespace cleave
