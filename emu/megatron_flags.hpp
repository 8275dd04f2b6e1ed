// Megatron-LM launch flags (pretrain_gpt.py's arguments, megatron/training/arguments.py) that are
// not the name of a recipe key. A flag that names a key ("--num-layers 4") sets it (Recipe::
// set_flag); these are the rest, each one of three kinds:
//
//  - Model: it states something NodeEmu models ("--swiglu", "--normalization RMSNorm",
//    "--disable-bias-linear"), so it is accepted when its value is the one NodeEmu models, and
//    refused with what NodeEmu models otherwise. Some also set a key.
//  - Io: data, tokenizer, checkpoint, logging and evaluation flags. Accepted; the run summary
//    names them as without effect on the emulated training steps.
//  - LrSchedule: the learning-rate schedule (warm-up, decay, its floor): host arithmetic between
//    steps, no effect on timing. Accepted in meta mode and named in the summary like Io;
//    refused in functional mode, whose rate is the constant optimizer.lr (its losses would not
//    be Megatron's).
//  - Refused: a setting NodeEmu does not model, with what to do instead.
#pragma once
#include <string>
#include <vector>

namespace nodeemu::emu {

struct MegatronFlag {
  enum class Kind { Model, Io, LrSchedule, Refused };
  std::string name;  // without the leading "--"
  Kind kind;
  int values;  // words it takes: 0 or 1; -1 = every word up to the next flag
  // Model flags: the value NodeEmu models ("" = any value, or no value); compared as numbers
  // when both parse as numbers.
  std::string models;
  std::string why;  // Model: what NodeEmu models; Refused: why, and what to do instead
  std::string key = {}, key_value = {};  // a recipe key the flag also sets, and its value
};

// The flag's entry, or null when NodeEmu does not know it.
const MegatronFlag* find_megatron_flag(const std::string& name);

// The words of a file of launch flags, as a launch script holds them: `#` comments, `\` line
// continuations, quotes, and bash array lines (`MODEL_ARGS=(` and `)`) are dropped, so that a
// script's argument arrays can be pasted whole. Throws ConfigError naming the file and line for
// a command (`torchrun ...`) or a stray word before the first flag.
std::vector<std::string> read_megatron_args(const std::string& path);

}  // namespace nodeemu::emu
