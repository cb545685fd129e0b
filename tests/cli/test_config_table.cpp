// The config field tables: every field of the model, train and parallel
// sections round-trips through JSON and through its generated command-line
// flag; unknown keys are refused with the list of known ones; the checks and
// the differences come from the same table.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "../../src/cli/commands.hpp"
#include "../../src/cli/field_flags.hpp"
#include "coremesh/core/json.hpp"
#include "coremesh/train/trainer.hpp"

using namespace coremesh;
using nlohmann::json;

namespace {

// A value of the field's type that differs from `current`.
json other_value(const std::string& type, const std::vector<std::string>& choices, const json& current) {
  if (!choices.empty()) return choices[0] == current.get<std::string>() ? choices[1] : choices[0];
  if (type == "integer") return current.get<int64_t>() + 3;
  if (type == "number") return current.get<double>() * 2 + 0.25;
  if (type == "bool") return !current.get<bool>();
  if (type == "string") return current.get<std::string>() + "x";
  return json::array({"a.txt", "b.txt"});
}

// The command-line text of a JSON value.
std::vector<std::string> as_text(const json& v) {
  if (v.is_array()) return v.get<std::vector<std::string>>();
  if (v.is_string()) return {v.get<std::string>()};
  return {v.dump()};
}

template <class C>
void round_trip_every_field(const FieldTable<C>& table, const std::function<json(const C&)>& to,
                            const std::function<C(const json&)>& from) {
  ASSERT_GE(table.fields().size(), 5u);
  for (const Field<C>& f : table.fields()) {
    SCOPED_TRACE(table.section() + "." + f.name);
    C c{};
    const json v = other_value(f.type, f.choices, f.get(c));
    f.set(c, v);
    EXPECT_EQ(f.get(c), v);
    // JSON: written, read back, the same field value and no difference.
    const C back = from(to(c));
    EXPECT_EQ(f.get(back), v);
    EXPECT_TRUE(table.differences(c, back).empty());
    EXPECT_EQ(table.differences(C{}, c).size(), 1u);
    // The flag: the same value through the command line.
    CLI::App app;
    cli::FieldFlags<C> flags(app, table, "test");
    std::vector<std::string> args{"test", "--" + (f.flag.empty() ? cli::flag_name(f.name) : f.flag)};
    for (const auto& t : as_text(v)) args.push_back(t);
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(int(argv.size()), const_cast<char**>(argv.data()));
    C parsed{};
    flags.apply(parsed);
    EXPECT_EQ(f.get(parsed), v);
    EXPECT_TRUE(flags.given(f.name));
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

// Every number field of `table` refuses nan, inf and -inf, from JSON values
// and from its flag, with a problem that names the field.
template <class C>
void every_number_field_is_finite(const FieldTable<C>& table) {
  int numbers = 0;
  for (const Field<C>& f : table.fields()) {
    if (f.type != "number") continue;
    ++numbers;
    for (const std::string text : {"nan", "inf", "-inf"}) {
      SCOPED_TRACE(table.section() + "." + f.name + " = " + text);
      C c{};
      f.set(c, json(std::stod(text)));
      std::vector<std::string> problems = table.problems(c);
      ASSERT_EQ(problems.size(), 1u);
      EXPECT_NE(problems[0].find(table.section() + "." + f.name + " = "), std::string::npos) << problems[0];
      EXPECT_NE(problems[0].find("must be a finite number"), std::string::npos) << problems[0];
      CLI::App app;
      cli::FieldFlags<C> flags(app, table, "test");
      const std::string flag = "--" + (f.flag.empty() ? cli::flag_name(f.name) : f.flag);
      const char* argv[] = {"test", flag.c_str(), text.c_str()};
      app.parse(3, const_cast<char**>(argv));
      C parsed{};
      flags.apply(parsed);
      EXPECT_EQ(table.problems(parsed), problems);
    }
  }
  EXPECT_GT(numbers, 0);
}

}  // namespace

TEST(ConfigTable, EveryNumberFieldRefusesNanAndInf) {
  every_number_field_is_finite(model::model_fields());
  every_number_field_is_finite(train::train_fields());
}

// The commands' own number options (not config fields): a range that refuses
// nan and inf, which CLI::Range lets through.
TEST(ConfigTable, FiniteInRefusesNanInfAndText) {
  for (const std::string text : {"nan", "inf", "-inf", "0.5", "11", "abc", "2x", ""}) {
    CLI::App app;
    double v = 0;
    app.add_option("--x", v)->check(cli::finite_in(1.0, 10.0));
    const char* argv[] = {"test", "--x", text.c_str()};
    EXPECT_THROW(app.parse(3, const_cast<char**>(argv)), CLI::ValidationError) << text;
  }
  CLI::App app;
  double v = 0;
  app.add_option("--x", v)->check(cli::finite_in(1.0, 10.0));
  const char* argv[] = {"test", "--x", "2.5"};
  app.parse(3, const_cast<char**>(argv));
  EXPECT_EQ(v, 2.5);
}

TEST(ConfigTable, EveryModelFieldRoundTripsJsonAndFlags) {
  round_trip_every_field<model::ModelConfig>(
      model::model_fields(), [](const model::ModelConfig& c) { return model::to_json(c); },
      [](const json& j) { return model::model_config_from_json(j); });
}

TEST(ConfigTable, EveryTrainFieldRoundTripsJsonAndFlags) {
  round_trip_every_field<train::TrainConfig>(
      train::train_fields(), [](const train::TrainConfig& c) { return train::to_json(c); },
      [](const json& j) { return train::train_config_from_json(j); });
}

// A bool flag alone means true (`--graph`); with a value it takes it.
TEST(ConfigTable, ABoolFlagAloneMeansTrue) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"test", "--graph", "--steps", "7"}, {"test", "--graph", "true", "--steps", "7"},
        {"test", "--steps", "7", "--graph"}}) {
    CLI::App app;
    cli::FieldFlags<train::TrainConfig> flags(app, train::train_fields(), "test");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(int(argv.size()), const_cast<char**>(argv.data()));
    train::TrainConfig c{};
    flags.apply(c);
    EXPECT_TRUE(c.graph) << args[1] << " " << args[2];
    EXPECT_EQ(c.steps, 7);
  }
  CLI::App app;
  cli::FieldFlags<train::TrainConfig> flags(app, train::train_fields(), "test");
  const char* argv[] = {"test", "--report", "maybe"};
  app.parse(3, const_cast<char**>(argv));
  train::TrainConfig c{};
  EXPECT_NE(error_of([&] { flags.apply(c); }).find("--report expects true or false, got 'maybe'"), std::string::npos);
}

TEST(ConfigTable, EveryParallelFieldRoundTripsJsonAndFlags) {
  round_trip_every_field<parallel::ParallelConfig>(
      parallel::parallel_fields(), [](const parallel::ParallelConfig& c) { return json{{"parallel", parallel::parallel_fields().to_json(c)}}; },
      [](const json& j) { return train::train_config_from_json(j).parallel; });
}

TEST(ConfigTable, UnknownKeysListTheKnownOnes) {
  std::string e = error_of([] { train::train_config_from_json(json::parse(R"({"train": {"stesp": 3}})")); });
  EXPECT_NE(e.find("unknown train config field 'stesp'"), std::string::npos) << e;
  EXPECT_NE(e.find("known train fields: data, tokenizer, val_fraction, batch_size"), std::string::npos) << e;
  // a misspelt section beside "train" (it was ignored: "paralel" trained on one PE)
  e = error_of([] { train::train_config_from_json(json::parse(R"({"paralel": {"dp": 2}, "train": {"steps": 3}})")); });
  EXPECT_NE(e.find("unknown config section 'paralel'"), std::string::npos) << e;
  EXPECT_NE(e.find(R"("model", "train" and "parallel")"), std::string::npos) << e;
  e = error_of([] { train::train_config_from_json(json::parse(R"({"paralel": {"dp": 2}, "steps": 3})")); });
  EXPECT_NE(e.find("unknown config section 'paralel'"), std::string::npos) << e;  // the flat form: an object
  e = error_of([] { train::train_config_from_json(json::parse(R"({"parallel": {"dq": 2}})")); });
  EXPECT_NE(e.find("known parallel fields: dp, cp, pp, ep, tp"), std::string::npos) << e;
  e = error_of([] { train::train_config_from_json(json::parse(R"({"train": {"steps": 2.5}})")); });
  EXPECT_NE(e.find("'steps' has the wrong type"), std::string::npos) << e;
  e = error_of([] { train::train_config_from_json(json::parse(R"({"parallel": {"schedule": "zigzag"}})")); });
  EXPECT_NE(e.find("unknown schedule 'zigzag'"), std::string::npos) << e;
  EXPECT_NE(e.find("gpipe|1f1b|interleaved|zb-h1|zbv|dualpipe|dualpipev"), std::string::npos) << e;
  e = error_of([] { train::train_config_from_json(json::parse(R"({"parallel": {"cp_comm": "star"}})")); });
  EXPECT_NE(e.find("unknown cp_comm 'star'"), std::string::npos) << e;
  EXPECT_NE(e.find("ring|ulysses"), std::string::npos) << e;
}

// A key written twice in one object is refused (a parser keeps one value
// silently); the same key in two objects is fine.
TEST(ConfigTable, AKeyTwiceInOneObjectIsRefused) {
  std::string e = error_of([] {
    train::train_config_from_text(R"({"model": {"n_layers": 4}, "train": {"steps": 5, "lr": 1e-3, "steps": 50}})", "c.json");
  });
  EXPECT_NE(e.find("'c.json' gives the key \"steps\" twice in one object"), std::string::npos) << e;
  EXPECT_NE(e.find("keep one \"steps\""), std::string::npos) << e;
  e = error_of([] { train::train_config_from_text(R"({"model": {"n_layers": 4}} {)", "c.json"); });
  EXPECT_NE(e.find("cannot parse 'c.json'"), std::string::npos) << e;
  const json j = parse_user_json(R"({"a": {"x": 1, "y": [{"x": 2}, {"x": 3}]}, "b": {"x": 4}})", "j.json");
  EXPECT_EQ(j["b"]["x"], 4);
  EXPECT_NE(error_of([] { parse_user_json(R"({"a": [{"x": 1, "x": 2}]})", "j.json"); }).find("\"x\" twice"),
            std::string::npos);
}

TEST(ConfigTable, RenamedFieldsStillReadAndChecksComeFromTheTable) {
  // `threads` was renamed `cores`; old configs and flags still work.
  EXPECT_EQ(train::train_config_from_json(json::parse(R"({"train": {"threads": 3}})")).cores, 3);
  train::TrainConfig c;
  c.data = {"x.txt"};
  c.cores = -1, c.parallel.dp = 0, c.batch_size = 0;
  const std::string e = error_of([&] { c.validate(); });
  EXPECT_NE(e.find("train.cores = -1 must be >= 0"), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.dp = 0 must be positive"), std::string::npos) << e;
  EXPECT_NE(e.find("train.batch_size = 0 must be positive"), std::string::npos) << e;
  // Every difference, section by section.
  train::TrainConfig a, b;
  b.model.d_model = 64, b.steps = 7, b.parallel.ep = 2;
  const auto d = train::config_differences(a, b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], "model.d_model: 256 vs 64");
  EXPECT_EQ(d[1], "train.steps: 100 vs 7");
  EXPECT_EQ(d[2], "parallel.ep: 1 vs 2");
  // Floats are written as the shortest decimal.
  model::ModelConfig m;
  m.bias_update_rate = 0.001f;
  EXPECT_EQ(model::to_json(m)["bias_update_rate"].dump(), "0.001");
}
