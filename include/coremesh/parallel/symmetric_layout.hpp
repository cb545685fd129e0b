// One symmetric block cut into named regions. A component lists its regions
// once (a static layout function of its sizes): --dry-run reads bytes(), the
// constructor allocates the block and takes the regions by index, so the
// size the job is started with and what is allocated cannot drift apart.
//
//   | region 0 | pad | region 1 | pad | ... |   each region 64-byte aligned
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::parallel {

class SymmetricLayout {
 public:
  struct Region {
    std::string name;
    Shape shape;
    DType dtype = DType::f32;
    int64_t offset = 0;  // bytes from the block's start
  };
  // Reserves a region; returns its index (take it from allocate()'s result).
  int add(std::string name, Shape shape, DType dtype = DType::f32);
  const std::vector<Region>& regions() const { return regions_; }
  int64_t bytes() const { return bytes_; }
  // Collective: allocates the zeroed block in the symmetric heap (every PE
  // the same layout) and returns the regions' tensors, by index.
  std::vector<Tensor> allocate() const;

 private:
  std::vector<Region> regions_;
  int64_t bytes_ = 0;
};

}  // namespace coremesh::parallel
