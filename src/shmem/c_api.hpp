// Helpers of the C API files (c_*.cpp): the error boundary and handle
// conversions. C has no exceptions: an error prints its message (file:line
// and hint) and ends this PE with status 1; the launcher stops the job.
#pragma once

#include <exception>

#include "coremesh/shmem/rma.hpp"
#include "internal.hpp"
#include "shmem.h"

namespace coremesh::shmem::capi {

[[noreturn]] void fail(const char* api, const std::exception& e);
internal::TeamData* team(shmem_team_t handle, const char* api);
shmem_team_t handle(internal::TeamData* team);
Cmp cmp(int value, const char* api);
// Contexts of `team` become orphans, refused on use (its team is gone);
// nullptr: every context is forgotten (shmem_finalize).
void orphan_contexts(const internal::TeamData* team);

}  // namespace coremesh::shmem::capi

// Wraps the body of every C entry point.
#define CM_C_API(api, ...)                                   \
  try {                                                      \
    __VA_ARGS__;                                             \
  } catch (const std::exception& cm_c_error) {               \
    ::coremesh::shmem::capi::fail(api, cm_c_error);          \
  }
