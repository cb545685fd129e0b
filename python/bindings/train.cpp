// coremesh.train: the C++ trainer from Python, configured by the same JSON
// as `coremesh train --config` ({"model": {...}, "train": {...},
// "parallel": {...}}, given as a dict or a file path). A thin face: configs
// go through train_config_from_json / to_json, training is Trainer::run, and
// the metrics come back as dicts. Training releases the GIL; Ctrl-C stops it
// with KeyboardInterrupt at the next host wait (resume from a checkpoint).
#include <nlohmann/json.hpp>

#include <csignal>

#include "common.hpp"
#include "coremesh/core/json.hpp"
#include "coremesh/train/trainer.hpp"
#include "coremesh/train/tuning.hpp"

namespace coremesh::python {
namespace {

using nlohmann::json;

json json_arg(const py::object& config) {
  if (py::isinstance<py::dict>(config)) {
    // NumPy scalars (np.int64(4), np.float32(0.1)) are numbers: JSON takes their value
    const py::cpp_function numpy_scalars([](const py::object& o) -> py::object {
      if (py::isinstance(o, py::module_::import("numpy").attr("generic"))) return o.attr("item")();
      throw py::type_error(fmt::format("a value of type {} ({})", py::str(o.get_type().attr("__name__")).cast<std::string>(),
                                       py::repr(o).cast<std::string>()));
    });
    std::string text;
    try {
      text = py::module_::import("json")
                 .attr("dumps")(config, py::arg("allow_nan") = false, py::arg("default") = numpy_scalars)
                 .cast<std::string>();
    } catch (py::error_already_set& e) {  // nan/inf (ValueError) or a value JSON has no form for (TypeError)
      if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
      CM_THROW(InvalidArgument,
               "give numbers (finite: not nan or inf), strings, booleans, None, lists and dicts",
               "the config dict is not JSON: it holds {}", py::str(e.value()).cast<std::string>());
    }
    return parse_user_json(text, "the config dict");
  }
  CM_CHECK(py::isinstance<py::str>(config) || py::isinstance<py::bytes>(config) ||
               py::hasattr(config, "__fspath__"),
           "pass a dict (the JSON config's form) or the path of a JSON config file",
           "config is a {} ({}), not a dict or a path", py::str(config.get_type().attr("__name__")).cast<std::string>(),
           py::repr(config).cast<std::string>());
  const py::module_ os = py::module_::import("os");
  const auto path = os.attr("fsdecode")(os.attr("fspath")(config)).cast<std::string>();
  return load_user_json(path, "config", "pass a dict or the path of a JSON config");
}

py::object to_python(const json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

train::TrainConfig config_arg(const py::object& config) {
  train::TrainConfig cfg = train::train_config_from_json(json_arg(config));
  cfg.progress = false;
  return cfg;
}

py::dict step_dict(const train::StepRecord& r) {
  py::dict d;
  d["step"] = r.step;
  d["loss"] = r.loss;
  d["aux_loss"] = r.aux_loss;
  d["lr"] = r.lr;
  d["grad_norm"] = r.grad_norm;
  d["tokens_per_s"] = r.tokens_per_s;
  d["mfu"] = r.mfu;
  d["expert_balance"] = r.expert_balance;
  d["seconds"] = r.seconds;
  return d;
}

py::dict result_dict(const train::TrainResult& r) {
  py::dict d;
  d["steps_done"] = r.steps_done;
  d["final_loss"] = r.final_loss;
  d["final_val_loss"] = r.final_val_loss;
  d["mean_tokens_per_s"] = r.mean_tokens_per_s;
  d["mean_mfu"] = r.mean_mfu;
  d["final_balance"] = r.final_balance;
  d["checkpoint"] = r.checkpoint;
  d["report"] = r.report;
  return d;
}

py::list step_list(const std::vector<train::StepRecord>& records) {
  py::list out;
  for (const auto& r : records) out.append(step_dict(r));
  return out;
}

py::list validation_list(const std::vector<train::ValRecord>& validation) {
  py::list out;
  for (const auto& v : validation) {
    py::dict d;
    d["step"] = v.step;
    d["loss"] = v.loss;
    out.append(d);
  }
  return out;
}

// Ctrl-C during a run (the GIL released, so Python's own handler would act
// only after it): the trainer stops after its step on every PE and saves, as
// `coremesh train` does; then the caller gets KeyboardInterrupt naming the
// checkpoint. The process's previous handler comes back after the run.
class StopOnInterrupt {
 public:
  explicit StopOnInterrupt(train::Trainer& t) : previous_(std::signal(SIGINT, on_signal)) {
    flag_ = 0;
    t.stop_when([] { return flag_ != 0; });
  }
  ~StopOnInterrupt() { std::signal(SIGINT, previous_); }
  StopOnInterrupt(const StopOnInterrupt&) = delete;
  StopOnInterrupt& operator=(const StopOnInterrupt&) = delete;
  // After the run: KeyboardInterrupt when it stopped for Ctrl-C.
  static void raise_if_stopped(const train::TrainResult& r) {
    if (!r.stopped || flag_ == 0) return;
    const std::string text = fmt::format("stopped after step {}; checkpoint: {} (resume it to continue)",
                                         r.steps_done, r.checkpoint);
    PyErr_SetString(PyExc_KeyboardInterrupt, text.c_str());
    throw py::error_already_set();
  }

 private:
  static void on_signal(int) { flag_ = 1; }
  static inline volatile std::sig_atomic_t flag_ = 0;
  void (*previous_)(int);
};

constexpr const char* kOtherRunHint =
    "resume that run (Trainer.resume), give another out_dir, or pass overwrite=True to delete its checkpoints and "
    "metrics.jsonl and start over";

}  // namespace

void bind_train(py::module_& m) {
  m.def("config", [](const py::object& config) {
          const train::TrainConfig cfg = config_arg(config);
          cfg.validate();
          return to_python(train::to_json(cfg));
        }, py::arg("config"),
        "The full, validated config (every field, defaults filled in) as a dict.");

  m.def("tune", [](const py::object& config, const std::string& cache, double budget, int repeats,
                   double time_limit, double tolerance) {
          const train::TrainConfig cfg = config_arg(config);
          cfg.validate();
          runtime::TuneOptions o;
          o.budget = budget, o.repeats = repeats, o.time_limit_s = time_limit, o.tolerance = tolerance;
          const train::StepTuning t = without_gil(
              [&] { return train::tune_step_tilings(cfg, runtime::Device::default_device(), o, cache); });
          py::dict d;
          d["keys"] = t.keys, d["with_choice"] = t.with_choice, d["replaced"] = t.replaced, d["rejected"] = t.rejected;
          d["runs"] = t.report.runs, d["seconds"] = t.report.seconds, d["time_limited"] = t.report.time_limited;
          d["heuristic_ms"] = 1e3 * t.heuristic_s, d["tuned_ms"] = 1e3 * t.tuned_s, d["summary"] = t.summary();
          d["step_checked"] = t.report.step_checked, d["step_kept"] = t.report.step_kept;
          d["step_heuristic_ms"] = 1e3 * t.report.step_heuristic_s, d["step_tuned_ms"] = 1e3 * t.report.step_tuned_s;
          d["agreed"] = t.agreed;
          return d;
        }, py::arg("config"), py::arg("cache"), py::arg("budget") = 0.25, py::arg("repeats") = 5,
        py::arg("time_limit") = 300.0, py::arg("tolerance") = 0.0,
        R"doc(Measures the tilings of the config's training step (as `coremesh tune`) and adds them to the
tuning cache file `cache`; returns a summary dict. Load it with coremesh.runtime.load_tuning_cache.)doc");

  py::class_<train::Trainer>(m, "Trainer", R"doc(
Trainer(config, progress=False): the MoE trainer on the default device.
config: a dict or a JSON file path, as `coremesh train --config` reads.)doc")
      .def(py::init([](const py::object& config, bool progress) {
             train::TrainConfig cfg = config_arg(config);
             cfg.progress = progress;
             cfg.validate();
             py::gil_scoped_release nogil;
             return std::make_unique<train::Trainer>(cfg);
           }), py::arg("config"), py::arg("progress") = false,
           "Validates config and sets up training on the default device; progress: show the progress display.")
      .def("run", [](train::Trainer& t, int64_t until_step, bool save_at_end, bool overwrite) {
             CM_CHECK(until_step <= t.config().steps, "raise the config's steps to train further",
                      "until_step {} is past the config's {} steps", until_step, t.config().steps);
             CM_CHECK(until_step == -1 || until_step > t.step(),
                      "give a step after the trainer's (-1: the config's steps)",
                      "until_step {} is not after step {}, where the trainer is", until_step, t.step());
             train::TrainResult r;
             {
               StopOnInterrupt stop(t);
               r = without_gil([&] {
                 t.claim_out_dir(overwrite, kOtherRunHint);
                 return t.run(until_step, save_at_end);
               });
             }
             StopOnInterrupt::raise_if_stopped(r);
             return result_dict(r);
           }, py::arg("until_step") = -1, py::arg("save_at_end") = true, py::arg("overwrite") = false,
           "Trains until `until_step` (default: the config's steps) -> result dict. Unless the trainer resumed, "
           "out_dir may not hold another run's checkpoints unless overwrite=True, which deletes them and "
           "metrics.jsonl first (save_checkpoint refuses them too).")
      .def("queue_step", [](train::Trainer& t) {
             CM_CHECK(t.step() < t.config().steps, "raise the config's steps to train further",
                      "the trainer has done all {} steps of its config", t.config().steps);
             without_gil([&] { t.queue_step(); });
           }, "Launches one optimizer step on the trainer's stream and returns without waiting.")
      .def("finish_step", [](train::Trainer& t) {
             const train::StepRecord r = without_gil([&] { return t.finish_step(); });
             return step_dict(r);
           }, "Waits for the queued step and returns its record (mfu is left to run()).")
      .def("validate", &train::Trainer::validate, py::call_guard<py::gil_scoped_release>(),
           "Validation loss (nats/token) over the config's val_batches.")
      .def("sample", [](train::Trainer& t) {
             const std::string text = without_gil([&] { return t.sample(); });
             // a byte-level model may sample bytes that are not UTF-8: replaced, as the report shows them
             return py::reinterpret_steal<py::str>(PyUnicode_DecodeUTF8(text.data(), py::ssize_t(text.size()), "replace"));
           }, "A continuation of the config's sample_prompt, sampled as the report's samples "
              "(bytes that are not UTF-8 become U+FFFD).")
      .def("resume", &train::Trainer::resume, py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "Loads a checkpoint file, or a run directory's latest.")
      .def("save_checkpoint", &train::Trainer::save_checkpoint_now, py::call_guard<py::gil_scoped_release>(),
           "Waits for the queued work, saves this step's checkpoint into <out_dir>/checkpoints (the newest "
           "keep_checkpoints stay) and returns its path; collective when parallel.")
      .def_property_readonly("step", &train::Trainer::step, "Optimizer steps done so far.")
      .def_property_readonly("cores", &train::Trainer::cores,
                             "Cores the trainer's stream may use: the config's cores (all when 0), capped by the device.")
      .def_property_readonly("leader", &train::Trainer::leader, "True on the PE that reports (always on one PE).")
      .def_property_readonly("metrics_path", &train::Trainer::metrics_path,
                             "<out_dir>/metrics.jsonl: one JSON object per step, written by run() on the leader.")
      .def_property_readonly("records", [](const train::Trainer& t) { return step_list(t.records()); },
                             "One dict per trained step (loss, lr, grad_norm, mfu, ...).")
      .def_property_readonly("validation", [](const train::Trainer& t) { return validation_list(t.validation()); },
                             "[{'step', 'loss'}] of every validation.");

  m.def("run", [](const py::object& config, int64_t steps, bool progress, bool overwrite) {
          train::TrainConfig cfg = config_arg(config);
          if (steps >= 0) cfg.steps = steps;
          cfg.progress = progress;
          cfg.validate();
          if (!overwrite) train::refuse_other_run(cfg.out_dir, kOtherRunHint);  // before the trainer's start-up costs
          struct Finished {
            train::TrainResult result;
            std::vector<train::StepRecord> records;
            std::vector<train::ValRecord> validation;
          };
          const Finished f = without_gil([&] {
            train::Trainer trainer(cfg);
            trainer.claim_out_dir(overwrite, kOtherRunHint);  // deletes only once the run can start
            StopOnInterrupt stop(trainer);
            Finished done{trainer.run(), {}, {}};
            done.records = trainer.records();
            done.validation = trainer.validation();
            return done;
          });
          StopOnInterrupt::raise_if_stopped(f.result);
          py::dict out = result_dict(f.result);
          out["records"] = step_list(f.records);
          out["validation"] = validation_list(f.validation);
          return out;
        }, py::arg("config"), py::arg("steps") = -1, py::arg("progress") = false, py::arg("overwrite") = false, R"doc(
Trains a config (dict or JSON path) to the end -> {'steps_done', 'final_loss',
'final_val_loss', 'mean_tokens_per_s', 'mean_mfu', 'checkpoint', 'report',
'records': [per-step dicts], 'validation': [{'step', 'loss'}]}.
out_dir may not hold another run's checkpoints unless overwrite=True, which
deletes them and metrics.jsonl once the new run can start. Ctrl-C stops after
the step, saves a checkpoint and raises KeyboardInterrupt naming it.)doc");
}

}  // namespace coremesh::python
