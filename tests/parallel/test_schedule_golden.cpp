// Golden text forms of every generator at pp=4, 8 micro-batches (interleaved:
// 2 chunks per rank), in tests/parallel/golden/<name>.txt, and of the form
// training runs where it differs (DualPipe's, golden/dualpipe-exact.txt). A change to a
// generator shows up here as a diff. After an intended change, rewrite them with
//   COREMESH_UPDATE_GOLDEN=1 build/tests/test_parallel --gtest_filter='ScheduleGolden.*'
// and review the diff.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/schedule_generators.hpp"

using namespace coremesh::parallel;

TEST(ScheduleGolden, EveryGeneratorAtFourRanksAndEightMicroBatches) {
  const bool update = std::getenv("COREMESH_UPDATE_GOLDEN") != nullptr;
  std::vector<Schedule> schedules;
  for (const std::string& name : schedule_names()) {
    schedules.push_back(make_schedule(name, 4, 8, 2));
    if (Schedule run = executed_form(schedules.back()); run.name != name) schedules.push_back(std::move(run));
  }
  EXPECT_EQ(schedules.size(), schedule_names().size() + 1) << "dualpipe-exact";
  for (const Schedule& s : schedules) {
    SCOPED_TRACE(s.name);
    const std::string path =
        std::string(COREMESH_SOURCE_DIR) + "/tests/parallel/golden/" + s.name + ".txt";
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
