// PyTorch cross-check (DESIGN.md §9): an independent PyTorch implementation
// (tests/reference/moe_model.py, run with /usr/bin/python3) loads the same
// safetensors weights and batches and must give the same logits, losses,
// every parameter gradient, and the same losses over 5 AdamW steps.
//
// Error measure per tensor: ||ours - torch||_2 / ||torch||_2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/train/optimizer.hpp"
#include "coremesh/train/safetensors.hpp"
#include "reference_fixture.hpp"

using namespace coremesh;
using namespace coremesh::model;
namespace fs = std::filesystem;

namespace {

using xcheck::rel_err;

struct Case {
  const char* name;
  ModelConfig cfg;
};

struct Run {
  int steps = 5, micro = 2, B = 2, T = 16;
  train::AdamWConfig opt{0.9, 0.95, 1e-8, 0.1, 1.0};
  double lr = 3e-3;
};

void cross_check(const ModelConfig& cfg, const std::string& label) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 (python3-torch) missing";
  Run run;
  char tmpl[] = "/tmp/coremesh_xcheck_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  Model model(cfg);
  xcheck::write_reference_weights(model, dir);  // weights; then batches, config
  const Shape bshape{run.steps, run.micro, run.B, run.T};
  Tensor tokens = Tensor::empty(bshape, DType::i32), targets = Tensor::empty(bshape, DType::i32);
  // Every step sees the same micro-batches, so the loss must fall.
  const int64_t per_step = tokens.numel() / run.steps;
  Rng rng(7);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    if (i >= per_step) {
      tokens.data<int32_t>()[i] = tokens.data<int32_t>()[i % per_step];
      targets.data<int32_t>()[i] = targets.data<int32_t>()[i % per_step];
      continue;
    }
    tokens.data<int32_t>()[i] = int32_t(rng.below(uint64_t(cfg.vocab_size)));
    targets.data<int32_t>()[i] = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  }
  train::write_safetensors(dir + "/batch.safetensors", {{"tokens", tokens}, {"targets", targets}});
  nlohmann::json j = to_json(cfg);
  j["train"] = {{"lr", run.lr}, {"beta1", run.opt.beta1}, {"beta2", run.opt.beta2},
                {"eps", run.opt.eps}, {"weight_decay", run.opt.weight_decay},
                {"grad_clip", run.opt.grad_clip}};
  std::ofstream(dir + "/config.json") << j.dump(2);
  ASSERT_EQ(xcheck::run_reference("crosscheck.py", dir), 0) << "tests/reference/crosscheck.py failed";
  train::SafetensorsFile ref = train::read_safetensors(dir + "/reference.safetensors");

  // ---- step 0: logits, losses, gradients of the accumulated loss
  train::AdamW opt(model, run.opt);
  const int64_t per = int64_t(run.B) * run.T;
  const int32_t* tok = tokens.data<int32_t>();
  const int32_t* tgt = targets.data<int32_t>();
  std::vector<double> losses;
  double worst_grad = 0;
  std::string worst_name;
  for (int s = 0; s < run.steps; ++s) {
    // As the trainer: zero_grad() makes the first write of each gradient
    // overwrite it. NaN in every parameter's gradient shows any gradient it
    // fails to write.
    for (const auto& p : model.params())
      std::fill_n(model.grad_data() + p.offset, p.numel, std::numeric_limits<float>::quiet_NaN());
    model.zero_grad();
    model.reset_stats();
    double loss = 0;
    for (int m = 0; m < run.micro; ++m) {
      const int64_t off = (int64_t(s) * run.micro + m) * per;
      const xcheck::Forward f = xcheck::forward_sync(model, m, tok + off, tgt + off, run.B, run.T, 1.0f / float(run.micro));
      const double ce = f.ce;
      if (s == 0 && m == 0) {
        const Tensor& rl = ref.at("logits");
        double e = rel_err(model.logits(m).data<float>(), rl.data<float>(), rl.numel());
        EXPECT_LT(e, 1e-5) << label << " logits rel err " << e;
        EXPECT_NEAR(ce, ref.at("ce").item({0}), 1e-5 * std::fabs(ce)) << label;
        EXPECT_NEAR(f.aux, ref.at("aux").item({0}), 1e-5 * std::fabs(f.aux) + 1e-9) << label;
        std::printf("[%s] logits rel err %.2e, ce %.7f vs %.7f, aux %.3e vs %.3e\n", label.c_str(), e, ce,
                    ref.at("ce").item({0}), f.aux, ref.at("aux").item({0}));
      }
      model.backward(m);
      loss += ce / run.micro;
    }
    runtime::current_stream().synchronize();
    losses.push_back(loss);
    if (s == 0) {
      for (const auto& p : model.params()) {
        const Tensor& rg = ref.at("grad/" + p.name);
        ASSERT_EQ(rg.numel(), p.numel) << p.name;
        double e = rel_err(model.grad_data() + p.offset, rg.data<float>(), p.numel);
        EXPECT_LE(e, 1e-4) << label << " gradient of " << p.name << " rel err " << e;
        if (e > worst_grad) worst_grad = e, worst_name = p.name;
      }
      std::printf("[%s] %zu parameter gradients, worst rel err %.2e (%s)\n", label.c_str(),
                  model.params().size(), worst_grad, worst_name.c_str());
    }
    EXPECT_EQ(model.seal_gradients(), 0) << label << ": a gradient was left unwritten";
    double gn = xcheck::clip_and_read(opt);
    EXPECT_NEAR(gn, ref.at("grad_norms").item({s}), 1e-4 * gn) << label << " step " << s;
    opt.step(run.lr);
    model.update_router_bias();
    runtime::current_stream().synchronize();
  }
  // ---- losses over the AdamW steps, final weights and router biases
  for (int s = 0; s < run.steps; ++s) {
    const double r = ref.at("losses").item({s});
    EXPECT_NEAR(losses[size_t(s)], r, 1e-4 * r) << label << " step " << s;
    std::printf("[%s] step %d loss %.7f torch %.7f\n", label.c_str(), s, losses[size_t(s)], r);
  }
  EXPECT_LT(losses.back(), losses.front()) << label << ": the loss should fall over 5 steps";
  for (const auto& p : model.params()) {
    const Tensor& rp = ref.at("param/" + p.name);
    double e = rel_err(model.param_data() + p.offset, rp.data<float>(), p.numel);
    EXPECT_LE(e, 1e-4) << label << " final " << p.name;
  }
  for (auto& [n, b] : model.named_buffers()) {
    const Tensor& rb = ref.at("buffer/" + n);
    for (int64_t i = 0; i < b.numel(); ++i)
      EXPECT_NEAR(b.data<float>()[i], rb.data<float>()[i], 1e-6) << label << " " << n;
  }
  fs::remove_all(dir);
}

ModelConfig base() { return xcheck::small_reference_config(); }

}  // namespace

TEST(PyTorchCrossCheck, SoftmaxGqaTiedGroupsAuxLossBias) {
  ModelConfig c = base();
  c.gating = Gating::softmax;
  c.n_groups = 4, c.topk_groups = 2;
  c.aux_loss_alpha = 0.01f;
  c.bias_update_rate = 1e-3f;
  cross_check(c, "softmax");
}

TEST(PyTorchCrossCheck, SigmoidMhaUntiedCapacityLowScore) {
  cross_check(xcheck::sigmoid_capacity_config(base()), "sigmoid");
}

// The margin bias step: its selection margins (binned distances to the
// top-k edge) and the shift read off them, written apart in the reference.
TEST(PyTorchCrossCheck, SigmoidMarginBias) {
  ModelConfig c = base();
  c.gating = Gating::sigmoid;
  c.bias_update = BiasUpdate::margin, c.bias_update_rate = 0.5f;
  cross_check(c, "margin");
}

TEST(PyTorchCrossCheck, TokenOrderDropsNoSharedExpertProportionalBias) {
  ModelConfig c = base();
  c.n_shared_experts = 0;
  c.first_k_dense = 0;
  c.capacity_factor = 0.75f;
  c.drop_policy = DropPolicy::token_order;
  c.bias_update = BiasUpdate::proportional, c.bias_update_rate = 3e-2f;
  cross_check(c, "token_order");
}
