// Teams as objects. Team::world() holds every PE; split_strided and split_2d
// are collective over the parent and return an invalid Team on PEs outside
// the new team. A split team is destroyed when its last handle goes away.
#pragma once

#include <memory>
#include <utility>

namespace coremesh::shmem {

namespace internal {
struct TeamData;
}

class Team {
 public:
  Team() = default;  // invalid
  static Team world();
  static Team shared();  // PEs sharing memory with this one: all, on one machine

  bool valid() const { return data_ != nullptr; }
  int my_pe() const;  // index of this PE in the team
  int n_pes() const;
  // Index in `other` of this team's PE `pe`, or -1 if not a member there.
  int translate(int pe, const Team& other) const;
  int world_pe(int pe) const { return translate(pe, world()); }

  // PEs start, start + stride, ... (size of them), in this team's numbering.
  Team split_strided(int start, int stride, int size) const;
  // Rows of `xrange` consecutive PEs (first) and the columns (second).
  std::pair<Team, Team> split_2d(int xrange) const;

  internal::TeamData* handle() const { return data_.get(); }
  bool operator==(const Team& other) const { return data_ == other.data_; }

 private:
  explicit Team(std::shared_ptr<internal::TeamData> data) : data_(std::move(data)) {}
  internal::TeamData& checked(const char* api) const;
  std::shared_ptr<internal::TeamData> data_;
};

}  // namespace coremesh::shmem
