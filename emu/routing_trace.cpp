#include "emu/routing_trace.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "devices/errors.hpp"
#include "emu/recipe_keys.hpp"

namespace nodeemu::emu {

namespace fs = std::filesystem;

namespace {

void read_file(const fs::path& file, int experts, layers::RecordedLoads& out) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string(), "file", "cannot be read; check the path");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "line " + std::to_string(n);
    nlohmann::json rec;
    try {
      rec = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(file.string(), where, std::string("is not JSON (") + e.what() + ")");
    }
    if (!rec.is_object()) throw ConfigError(file.string(), where, "is not a JSON object");
    if (rec.contains("mtp_idx") || rec.value("block", "decoder") != "decoder") continue;
    for (const char* key : {"layer", "rank", "top_indices"})
      if (!rec.contains(key))
        throw ConfigError(file.string(), where + ", key '" + key + "'",
                          "missing; is this a Megatron router trace (router_trace.py)?");
    const auto& idx = rec.at("top_indices");
    if (!idx.is_array() || !rec.at("layer").is_number_integer() ||
        !rec.at("rank").is_number_integer())
      throw ConfigError(file.string(), where,
                        "layer and rank must be integers and top_indices a list of lists");
    std::vector<std::int64_t> counts(std::size_t(experts), 0);
    for (const auto& token : idx) {
      if (!token.is_array())
        throw ConfigError(file.string(), where + ", key 'top_indices'", "must be a list of lists");
      for (const auto& e : token) {
        const std::int64_t x = e.is_number_integer() ? e.get<std::int64_t>() : -1;
        if (x < 0 || x >= experts)
          throw ConfigError(file.string(), where + ", key 'top_indices'",
                            "expert " + e.dump() + " is not one of the recipe's " +
                                std::to_string(experts) + " (num_moe_experts)");
        ++counts[std::size_t(x)];
      }
    }
    out.by_layer[rec.at("layer").get<int>()][rec.at("rank").get<int>()].push_back(
        std::move(counts));
  }
}

}  // namespace

layers::RecordedLoads load_routing_trace(const std::string& path, int experts) {
  layers::RecordedLoads out;
  out.source = path;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().filename().string().rfind("router_trace_rank", 0) == 0 &&
          e.path().extension() == ".jsonl")
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw ConfigError(path, key::emulator_routing_trace,
                        "has no router_trace_rank*.jsonl files (Megatron's "
                        "--moe-routing-trace-path writes them)");
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    throw ConfigError(path, key::emulator_routing_trace, "no such file or folder");
  }
  for (const auto& f : files) read_file(f, experts, out);
  if (out.by_layer.empty())
    throw ConfigError(path, key::emulator_routing_trace, "holds no decoder router records");
  return out;
}

}  // namespace nodeemu::emu
