// Status conventions shared by every module.
//
// Across module boundaries Cleave returns absl::Status / absl::StatusOr<T>. Errors caused by
// the outside world (a client, a model file, a peer, the OS) are Status values whose message
// says what to fix; a broken internal invariant is a CLEAVE_CHECK (common/log.h).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define CLEAVE_RETURN_IF_ERROR(expr)              \
  do {                                            \
    if (::absl::Status _st = (expr); !_st.ok()) { \
      return _st;                                 \
    }                                             \
  } while (false)

#define CLEAVE_STATUS_CONCAT_INNER(a, b) a##b
#define CLEAVE_STATUS_CONCAT(a, b) CLEAVE_STATUS_CONCAT_INNER(a, b)

// `CLEAVE_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value of an absl::StatusOr<T> or
// returns its error from the enclosing function.
#define CLEAVE_ASSIGN_OR_RETURN(lhs, expr) \
  CLEAVE_ASSIGN_OR_RETURN_IMPL(CLEAVE_STATUS_CONCAT(_status_or_, __LINE__), lhs, expr)
#define CLEAVE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) {                                   \
    return std::move(tmp).status();                  \
  }                                                  \
  lhs = *std::move(tmp)
