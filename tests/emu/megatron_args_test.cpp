// Megatron launch flags (issue 18): a launch script's pretrain_gpt.py flags pasted into a file
// and given with --megatron-args. Flags that state what NodeEmu models are accepted when true
// and refused naming what NodeEmu models otherwise; data, checkpoint and logging flags are
// accepted and named in the summary as without effect; the rest is refused with what to do.
#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "tests/emu/cli_runner.hpp"

namespace nodeemu::testing {
namespace {

const std::string kBase = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/megatron_launch.yaml";

// The argument arrays of Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh
// (NVIDIA/Megatron-LM, the version at commit 0a40979e), written here by hand from the public
// script, comments and line continuations included. It runs on GPUS_PER_NODE=2 and takes the
// vocabulary from Llama-2's tokenizer (32000).
const std::string kMixtralExample = R"(MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 256
    --max-position-embeddings 2048
    --num-layers 2
    --hidden-size 256
    --ffn-hidden-size 896
    --num-attention-heads 2
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 2
    --no-masked-softmax-fusion
    --no-position-embedding
    --rotary-base 1000000
)

MOE_ARGS=(
    --num-experts 2
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
#    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --mock-data
    #--data-path $DATA_PATH
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 4
    --lr 1e-4
    --train-iters 7
    # --lr-decay-iters 320000
    # --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    # --lr-warmup-iters 500
    --clip-grad 1.0
    # --bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --expert-model-parallel-size 2
    --use-distributed-optimizer
    --sequence-parallel
)

LOGGING_ARGS=(
  #  --log-interval 1 \
   # --save-interval 10000 \
    #--eval-interval 1000 \
    --eval-iters 10 \
    #--save $CHECKPOINT_PATH \
    #--load $CHECKPOINT_PATH \
    #--tensorboard-dir "${CHECKPOINT_PATH}/tensorboard" \
    --no-load-optim \
    --no-load-rng
)
)";

const std::string kNode = " model.vocab_size=32000 emulator.gpus_per_node=2";

TEST(MegatronArgs, TheMixtralExampleValidatesAsPasted) {
  const std::string file = write_temp_file("mixtral_args.sh", kMixtralExample);
  const CliResult r = run_cli("validate " + kBase + " --megatron-args " + file + kNode);
  EXPECT_EQ(r.code, 0) << r.err;
  // Megatron-LM's own reading of the script: no sequence parallelism at TP 1.
  EXPECT_NE(r.err.find("warning: --sequence-parallel: turned off at tensor_model_parallel_size 1"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("error:"), std::string::npos) << r.err;
  // The learning-rate schedule changes no kernel: accepted in meta mode; --clip-grad 1.0 is
  // modelled (the distributed optimizer's norm and scale; issue 54).
  EXPECT_EQ(r.err.find("--min-lr"), std::string::npos) << r.err;
  // --overlap-grad-reduce and --overlap-param-gather are modelled: accepted.
  EXPECT_EQ(r.err.find("--overlap-grad-reduce"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--overlap-param-gather"), std::string::npos) << r.err;
}

TEST(MegatronArgs, TheMixtralExampleRunsInMetaMode) {
  const std::string file = write_temp_file("mixtral_ok.sh", kMixtralExample);
  const CliResult r =
      run_cli("run " + kBase + " --megatron-args " + file + kNode + " --iterations 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("recipe megatron_launch (meta), 2 GPUs of dgx_h100"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("steady mean step"), std::string::npos);
  // The data, checkpoint and evaluation flags are named as without effect, values and all.
  EXPECT_NE(r.out.find("--tokenizer-type Llama2Tokenizer --tokenizer-model ${TOKENIZER_MODEL} "
                       "--mock-data --split 99990,8,2 --min-lr 1.0e-5 --eval-iters 10 "
                       "--no-load-optim --no-load-rng"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the learning-rate schedule"), std::string::npos) << r.out;
}

// The schedule has no effect on timing, but the functional plane's rate is constant: there its
// losses would silently differ from Megatron's, so it is refused naming meta mode.
TEST(MegatronArgs, TheLearningRateScheduleIsAcceptedInMetaModeAndRefusedInFunctional) {
  const std::string tiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";
  const std::string schedule =
      " --lr-decay-style cosine --lr-warmup-iters 500 --lr-decay-iters 320000 --min-lr 1e-5";
  const CliResult functional = run_cli("validate " + tiny + schedule);
  EXPECT_EQ(functional.code, 2);
  for (const char* f : {"--lr-decay-style", "--lr-warmup-iters", "--lr-decay-iters", "--min-lr"})
    EXPECT_NE(functional.err.find(std::string("error: ") + f +
                                  ": the functional plane steps at the constant optimizer.lr"),
              std::string::npos)
        << f << "\n"
        << functional.err;
  const CliResult meta = run_cli("validate " + tiny + schedule +
                                 " emulator.mode=meta model.moe_router_force_load_balancing=true");
  EXPECT_EQ(meta.code, 0) << meta.err;
}

TEST(MegatronArgs, ModelFlagsAreAcceptedWhenTrueAndRefusedNamingWhatIsModelled) {
  const std::string tiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";
  const CliResult ok = run_cli("validate " + tiny +
                               " --swiglu --normalization RMSNorm --disable-bias-linear "
                               "--group-query-attention --num-query-groups 2 "
                               "--untie-embeddings-and-output-weights --position-embedding-type "
                               "rope --use-distributed-optimizer --clip-grad 0 --data-path 1.0 "
                               "/data/a 0.5 /data/b --log-interval 10");
  EXPECT_EQ(ok.code, 0) << ok.err;
  const CliResult bad = run_cli("validate " + tiny +
                                " --normalization LayerNorm --position-embedding-type "
                                "learned_absolute --attention-dropout 0.1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("error: --normalization: is LayerNorm; NodeEmu models RMSNorm: set "
                         "--normalization RMSNorm"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("error: --position-embedding-type: is learned_absolute"),
            std::string::npos);
  EXPECT_NE(bad.err.find("error: --attention-dropout: is 0.1; NodeEmu models no dropout"),
            std::string::npos);
}

TEST(MegatronArgs, BadFilesAndUnknownFlagsAreOneLine) {
  const std::string tiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";
  const CliResult unknown = run_cli("validate " + tiny + " --num-layerz 4");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("--num-layerz"), std::string::npos);
  const std::string command = write_temp_file("command.sh",
                                              "torchrun --nproc_per_node 8 \\\n"
                                              "  pretrain_gpt.py --num-layers 4\n");
  const CliResult cmd = run_cli("validate " + tiny + " --megatron-args " + command);
  EXPECT_EQ(cmd.code, 2);
  EXPECT_NE(cmd.err.find("command.sh:1: torchrun: the file holds launch flags"), std::string::npos)
      << cmd.err;
  const std::string shell = write_temp_file("shell.sh", "--num-layers $LAYERS\n");
  const CliResult var = run_cli("validate " + tiny + " --megatron-args " + shell);
  EXPECT_EQ(var.code, 2);
  EXPECT_NE(var.err.find("--num-layers: has the shell variable $LAYERS"), std::string::npos)
      << var.err;
  const CliResult missing = run_cli("validate " + tiny + " --megatron-args /nonexistent/args.sh");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("/nonexistent/args.sh"), std::string::npos);
}

// A pasted script's problems come out together (issue 54, item 1): unknown flags, values that do
// not read, flags without their value, refused flags and the rules, each one line, in one run;
// what follows a flag that failed is not read as a flag of its own.
TEST(MegatronArgs, EveryProblemOfAFileIsReportedInOneRun) {
  const std::string tiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";
  const std::string file = write_temp_file("many_problems.sh",
                                           "--num-layerz 4\n"
                                           "--moe-router-topk two\n"
                                           "--frobnicate a b\n"
                                           "--fp8-format hybrid\n"
                                           "--num-moe-experts 6\n"
                                           "--seq-length $SEQ\n");
  const CliResult r = run_cli("validate " + tiny + " --megatron-args " + file);
  EXPECT_EQ(r.code, 2);
  for (const char* line :
       {"error: command line: --num-layerz: not a Megatron flag NodeEmu knows",
        "error: command line: --moe-router-topk (model.moe_router_topk): wants an integer, got "
        "'two'",
        "error: command line: --frobnicate: not a Megatron flag NodeEmu knows",
        "error: --fp8-format: FP8 training is not modelled",
        "error: model.num_moe_experts: 6 experts do not divide over EP = 4",
        "error: command line: --seq-length: has the shell variable $SEQ"})
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\n" << r.err;
  EXPECT_EQ(r.err.find("--a"), std::string::npos) << r.err;
  // Overrides on the command line are collected the same way, in order.
  const CliResult two =
      run_cli("validate " + tiny + " model.moe_router_top_k=4 train.seq_lenght=8");
  EXPECT_EQ(two.code, 2);
  const auto first = two.err.find("model.moe_router_top_k: unknown key");
  const auto second = two.err.find("train.seq_lenght: unknown key");
  EXPECT_NE(first, std::string::npos) << two.err;
  EXPECT_NE(second, std::string::npos) << two.err;
  EXPECT_LT(first, second);
}

// issue 54, item 5: a key set twice warns naming both places (the later wins, as Megatron's
// argparse has it), and the optimizer's numbers are checked.
TEST(MegatronArgs, AKeySetTwiceWarnsAndBadOptimizerNumbersAreRefused) {
  const std::string tiny = std::string(NODEEMU_SOURCE_DIR) + "/configs/recipes/tiny_moe.yaml";
  const std::string file = write_temp_file("iters.sh", "--train-iters 500000\n--clip-grad 0\n");
  const CliResult twice =
      run_cli("validate " + tiny + " train.train_iters=3 --megatron-args " + file);
  EXPECT_EQ(twice.code, 0) << twice.err;
  EXPECT_NE(twice.err.find("warning: --train-iters: sets train.train_iters again, after "
                           "train.train_iters=3; the later one wins"),
            std::string::npos)
      << twice.err;
  const CliResult bad = run_cli("validate " + tiny +
                                " optimizer.lr=-1 optimizer.adam_beta2=1 optimizer.adam_eps=0 "
                                "optimizer.clip_grad=.nan optimizer.weight_decay=.inf");
  EXPECT_EQ(bad.code, 2);
  for (const char* line : {"error: optimizer.lr: must be a finite rate of 0 or more",
                           "error: optimizer.adam_beta2: must be in [0, 1)",
                           "error: optimizer.adam_eps: must be finite and above 0",
                           "error: optimizer.clip_grad: must be a finite norm of 0 or more",
                           "error: optimizer.weight_decay: must be finite and 0 or more"})
    EXPECT_NE(bad.err.find(line), std::string::npos) << line << "\n" << bad.err;
}

// issue 54, item 3: a pasted script gets Megatron-LM's command-line defaults for what it leaves
// out (the fusions on, --clip-grad 1.0), named as such where a rule refuses one; what it says
// wins; a recipe without a script keeps the schema's.
TEST(MegatronArgs, APastedScriptGetsMegatronLmsDefaults) {
  const std::string script = write_temp_file("plain.sh",
                                             "--num-layers 2\n--hidden-size 256\n"
                                             "--num-attention-heads 8\n--seq-length 256\n"
                                             "--micro-batch-size 1\n--global-batch-size 8\n");
  const std::string vocab = " model.vocab_size=32000";
  const CliResult plain = run_cli("validate " + kBase + " --megatron-args " + script + vocab);
  EXPECT_EQ(plain.code, 2);
  EXPECT_NE(plain.err.find("error: optimizer.clip_grad: gradient clipping without the distributed "
                           "optimizer"),
            std::string::npos)
      << plain.err;
  EXPECT_NE(plain.err.find("(Megatron-LM's default, as the launch flags are Megatron-LM's)"),
            std::string::npos)
      << plain.err;
  auto config = [&](const std::string& extra) {
    const std::string summary = ::testing::TempDir() + "/megatron_defaults.json";
    const CliResult r =
        run_cli("run " + kBase + extra + vocab + " --iterations 1 --summary " + summary);
    EXPECT_EQ(r.code, 0) << r.err;
    const auto json = nlohmann::json::parse(read_file(summary))["config"];
    std::remove(summary.c_str());
    return json;
  };
  const auto pasted = config(" --megatron-args " + script + " --use-distributed-optimizer");
  for (const char* k : {"model.gradient_accumulation_fusion", "model.bias_activation_fusion",
                        "model.apply_rope_fusion"})
    EXPECT_EQ(pasted[k], "true") << k;
  EXPECT_EQ(pasted["optimizer.clip_grad"], "1");
  const auto said = config(" --megatron-args " + script +
                           " --use-distributed-optimizer --no-rope-fusion --clip-grad 0");
  EXPECT_EQ(said["model.apply_rope_fusion"], "false");
  EXPECT_EQ(said["optimizer.clip_grad"], "0");
  // --num-query-groups alone is multi-head attention in Megatron-LM.
  const CliResult mha = run_cli("validate " + kBase + " --megatron-args " + script +
                                " --use-distributed-optimizer --num-query-groups 2" + vocab);
  EXPECT_EQ(mha.code, 0) << mha.err;
  EXPECT_NE(mha.err.find("warning: --num-query-groups: ignored without --group-query-attention"),
            std::string::npos)
      << mha.err;
  EXPECT_EQ(config(" --megatron-args " + script +
                   " --use-distributed-optimizer --num-query-groups 2")["model.num_query_groups"],
            "null");
  EXPECT_EQ(config(" --megatron-args " + script +
                   " --use-distributed-optimizer --group-query-attention --num-query-groups 2")
                ["model.num_query_groups"],
            "2");
  const auto own = config(
      " model.num_layers=2 model.hidden_size=256 model.num_attention_heads=8 "
      "train.seq_length=256 train.global_batch_size=8");
  EXPECT_EQ(own["model.gradient_accumulation_fusion"], "false");
  EXPECT_EQ(own["optimizer.clip_grad"], "0");
}

}  // namespace
}  // namespace nodeemu::testing
