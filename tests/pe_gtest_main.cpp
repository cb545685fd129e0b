// main() of test_shmem_pe and test_parallel_pe: gtests that every PE of a
// launched job runs together (`coremesh run -n N test_shmem_pe`). Each test
// is collective: all PEs run the same tests in the same order, so tests use
// EXPECT_* (never an early return) around collective calls.
#include <gtest/gtest.h>

#include "coremesh/shmem/shmem.hpp"

int main(int argc, char** argv) {
  coremesh::shmem::Session session;
  ::testing::InitGoogleTest(&argc, argv);
  // Only PE 0 prints the per-test lines; failures print on every PE.
  if (coremesh::shmem::my_pe() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    struct FailurePrinter : ::testing::EmptyTestEventListener {
      void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (r.failed())
          std::fprintf(stderr, "%s:%d: Failure\n%s\n", r.file_name() ? r.file_name() : "?",
                       r.line_number(), r.summary());
      }
    };
    listeners.Append(new FailurePrinter);
  }
  return RUN_ALL_TESTS();
}
