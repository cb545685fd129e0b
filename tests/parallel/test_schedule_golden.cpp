// Golden text forms of every generator at pp=4, 8 micro-batches (interleaved:
// 2 chunks per rank), in tests/parallel/golden/<name>.txt. A change to a
// generator shows up here as a diff. After an intended change, rewrite them with
//   COREMESH_UPDATE_GOLDEN=1 build/tests/test_parallel --gtest_filter='ScheduleGolden.*'
// and review the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"

using namespace coremesh::parallel;

TEST(ScheduleGolden, EveryGeneratorAtFourRanksAndEightMicroBatches) {
  const bool update = std::getenv("COREMESH_UPDATE_GOLDEN") != nullptr;
  for (const std::string& name : schedule_names()) {
    SCOPED_TRACE(name);
    const std::string path =
        std::string(COREMESH_SOURCE_DIR) + "/tests/parallel/golden/" + name + ".txt";
    const Schedule s = make_schedule(name, 4, 8, 2);
    validate(s);
    const std::string text = to_text(s);
    if (update) std::ofstream(path) << text;
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << "missing " << path;
    std::stringstream golden;
    golden << in.rdbuf();
    EXPECT_EQ(text, golden.str());
    // The golden file is a valid schedule that reads back as the generator's.
    const Schedule loaded = load_schedule(path);
    validate(loaded);
    EXPECT_EQ(loaded.actions, s.actions);
  }
}
