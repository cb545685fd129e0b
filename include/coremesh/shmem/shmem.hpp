// coremesh::shmem, everything: session, symmetric heap, teams, RMA,
// collectives, on-stream variants and the launcher.
#pragma once

#include "coremesh/shmem/collectives.hpp"
#include "coremesh/shmem/heap.hpp"
#include "coremesh/shmem/launch.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"
#include "coremesh/shmem/team.hpp"
