// Teams as objects: ordered sets of world PEs, the shape of an MPI
// communicator. Every way to make a team is collective over the parent team
// (all its members call, in the same order as their other collectives) and
// returns an invalid Team on the parent's PEs outside the new team:
//   split_strided / split_2d  the OpenSHMEM strided splits;
//   from_pes                  any list of the parent's PEs (same list on every
//                             parent member, checked);
//   split                     MPI_Comm_split: one call makes every team of a
//                             partition (e.g. all data-parallel groups).
// Collectives, on-stream collectives and barriers work on every team. A
// team made here is destroyed when its last handle goes away.
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace coremesh::shmem {

namespace internal {
struct TeamData;
}

class Team {
 public:
  Team() = default;  // invalid
  static Team world();
  // PEs whose memory this one reaches by load/store: all on the shm
  // transport, only this PE on shm-rma and mpi.
  static Team shared();

  bool valid() const { return data_ != nullptr; }
  int my_pe() const;  // index of this PE in the team
  int n_pes() const;
  // Index in `other` of this team's PE `pe`, or -1 if not a member there.
  int translate(int pe, const Team& other) const;
  int world_pe(int pe) const;
  // The world PE of every member, in team order.
  std::vector<int> world_pes() const;

  // PEs start, start + stride, ... (size of them), in this team's numbering;
  // stride may be negative.
  Team split_strided(int start, int stride, int size) const;
  // Rows of `xrange` consecutive PEs (first) and the columns (second).
  std::pair<Team, Team> split_2d(int xrange) const;
  // The team of `world_pes`, in that order (team PE i is world_pes[i]).
  // Every PE of `parent` calls with the same list; each listed PE must be
  // in `parent`.
  static Team from_pes(const Team& parent, const std::vector<int>& world_pes);
  // This team's members with the same `color` form a new team, ordered by
  // (key, index in this team); color < 0 gives an invalid Team.
  Team split(int color, int key = 0) const;

  internal::TeamData* handle() const { return data_.get(); }
  bool operator==(const Team& other) const { return data_ == other.data_; }

 private:
  explicit Team(std::shared_ptr<internal::TeamData> data) : data_(std::move(data)) {}
  internal::TeamData& checked(const char* api) const;
  std::shared_ptr<internal::TeamData> data_;
};

}  // namespace coremesh::shmem
