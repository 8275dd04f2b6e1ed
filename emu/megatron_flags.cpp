#include "emu/megatron_flags.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "devices/errors.hpp"
#include "emu/recipe_keys.hpp"

namespace nodeemu::emu {

namespace {

using K = MegatronFlag::Kind;

MegatronFlag io(const std::string& name, int values) {
  return {name, K::Io, values, "", ""};
}

// megatron/training/arguments.py, _add_learning_rate_args; the schedule itself is
// OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py), a host computation.
MegatronFlag lr_schedule(const std::string& name, int values) {
  return {name, K::LrSchedule, values, "", ""};
}

// What the flags state, from megatron/training/arguments.py (names and defaults) and the model
// NodeEmu builds (layers/): RMSNorm, SwiGLU experts and MLPs, RoPE, grouped-query attention,
// no biases, no dropout, an output layer of its own, a constant learning rate (clipping is
// optimizer.clip_grad, which --clip-grad sets by name).
const std::vector<MegatronFlag>& table() {
  static const std::vector<MegatronFlag> t = {
      // --- the model NodeEmu builds ---
      {"use-mcore-models", K::Model, 0, "", "Megatron-Core's GPT model"},
      {"swiglu", K::Model, 0, "", "SwiGLU MLPs and experts"},
      {"normalization", K::Model, 1, "RMSNorm", "RMSNorm"},
      {"disable-bias-linear", K::Model, 0, "", "linear layers without biases",
       key::model_add_bias_linear, "false"},
      {"group-query-attention", K::Model, 0, "", "grouped-query attention (num_query_groups)"},
      {"untie-embeddings-and-output-weights", K::Model, 0, "",
       "an output layer with a weight of its own"},
      {"position-embedding-type", K::Model, 1, "rope", "rotary position embeddings"},
      {"no-position-embedding", K::Model, 0, "", "no learned absolute position embedding"},
      {"max-position-embeddings", K::Model, 1, "",
       "positions from RoPE: the table's length changes no kernel"},
      {"attention-dropout", K::Model, 1, "0", "no dropout"},
      {"hidden-dropout", K::Model, 1, "0", "no dropout"},
      {"no-masked-softmax-fusion", K::Model, 0, "",
       "attention priced by model.attention_backend (Megatron's masked-softmax kernel serves "
       "only its local unfused attention)"},
      {"distributed-backend", K::Model, 1, "nccl", "NCCL collectives"},
      // --- the learning-rate schedule: no effect on timing ---
      lr_schedule("lr-decay-style", 1),
      lr_schedule("lr-decay-iters", 1),
      lr_schedule("lr-decay-samples", 1),
      lr_schedule("lr-warmup-iters", 1),
      lr_schedule("lr-warmup-samples", 1),
      lr_schedule("lr-warmup-fraction", 1),
      lr_schedule("lr-warmup-init", 1),
      lr_schedule("min-lr", 1),
      lr_schedule("lr-wsd-decay-style", 1),
      lr_schedule("lr-wsd-decay-iters", 1),
      lr_schedule("lr-wsd-decay-samples", 1),
      lr_schedule("override-opt_param-scheduler", 0),
      lr_schedule("use-checkpoint-opt_param-scheduler", 0),
      // --- data, tokenizer, checkpoints, logging, evaluation: not the training step ---
      io("data-path", -1),
      io("train-data-path", -1),
      io("valid-data-path", -1),
      io("test-data-path", -1),
      io("mock-data", 0),
      io("split", 1),
      io("data-cache-path", 1),
      io("tokenizer-type", 1),
      io("tokenizer-model", 1),
      io("vocab-file", 1),
      io("merge-file", 1),
      io("save", 1),
      io("load", 1),
      io("save-interval", 1),
      io("no-load-optim", 0),
      io("no-load-rng", 0),
      io("no-save-optim", 0),
      io("no-save-rng", 0),
      io("ckpt-format", 1),
      io("use-dist-ckpt", 0),
      io("log-interval", 1),
      io("log-throughput", 0),
      io("log-timers-to-tensorboard", 0),
      io("log-validation-ppl-to-tensorboard", 0),
      io("log-memory-to-tensorboard", 0),
      io("log-params-norm", 0),
      io("log-num-zeros-in-grad", 0),
      io("timing-log-level", 1),
      io("tensorboard-dir", 1),
      io("tensorboard-log-interval", 1),
      io("wandb-project", 1),
      io("wandb-exp-name", 1),
      io("wandb-save-dir", 1),
      io("eval-iters", 1),
      io("eval-interval", 1),
      io("exit-interval", 1),
      io("exit-duration-in-mins", 1),
      io("distributed-timeout-minutes", 1),
      // --- settings NodeEmu does not model ---
      {"fp8-format", K::Refused, 1, "", "FP8 training is not modelled; remove it"},
      {"fp8-recipe", K::Refused, 1, "", "FP8 training is not modelled; remove it"},
  };
  return t;
}

}  // namespace

const MegatronFlag* find_megatron_flag(const std::string& name) {
  for (const auto& f : table())
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> read_megatron_args(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "--megatron-args", "cannot read the file; check the path");
  std::vector<std::string> words;
  std::string line;
  int number = 0;
  static const std::regex array_open(R"(^\s*[A-Za-z_][A-Za-z_0-9]*\+?=\(\s*$)");
  static const std::regex array_close(R"(^\s*\)\s*$)");
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    if (std::regex_match(line, array_open) || std::regex_match(line, array_close)) continue;
    std::istringstream ws(line);
    std::string w;
    while (ws >> w) {
      if (w == "\\") continue;  // a line continuation
      w.erase(std::remove(w.begin(), w.end(), '"'), w.end());
      w.erase(std::remove(w.begin(), w.end(), '\''), w.end());
      if (w.empty()) continue;
      if (words.empty() && w.rfind("--", 0) != 0)
        throw ConfigError(path + ":" + std::to_string(number), w,
                          "the file holds launch flags (--num-layers 4 ...), not a command; "
                          "paste the arguments of pretrain_gpt.py only");
      words.push_back(w);
    }
  }
  if (words.empty()) throw ConfigError(path, "--megatron-args", "holds no flags");
  return words;
}

}  // namespace nodeemu::emu
