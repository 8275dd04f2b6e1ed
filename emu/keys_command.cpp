// `nodeemu keys [SECTION]`: every recipe key with its type, default, allowed values and meaning,
// from the schema itself (emu/recipe_schema.cpp), so that a user without the source can find a
// key, and so that the list is never out of date.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <memory>
#include <ostream>
#include <set>

#include "devices/errors.hpp"
#include "emu/detail/commands.hpp"
#include "emu/recipe.hpp"
#include "schema/nearest_key.hpp"

namespace nodeemu::emu {

namespace {

std::string section_of(const std::string& key) {
  const auto dot = key.find('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

int keys(const std::string& section, std::ostream& out) {
  // One key ("model.moe_router_topk"): its line alone, or the nearest key's name.
  const bool one_key = section.find('.') != std::string::npos;
  if (one_key && !find_key(section)) {
    const std::string near = nearest_key(section);
    throw ConfigError("nodeemu keys", section,
                      "unknown key" + (near.empty() ? std::string("; `nodeemu keys` lists them")
                                                    : "; did you mean '" + near + "'?"));
  }
  std::vector<std::string> sections;
  for (const auto& k : recipe_schema())
    if (const std::string s = section_of(k.key);
        !s.empty() && std::find(sections.begin(), sections.end(), s) == sections.end())
      sections.push_back(s);
  if (!one_key && !section.empty() &&
      std::find(sections.begin(), sections.end(), section) == sections.end()) {
    const std::string near = schema::nearest_key(sections, "", section).key;
    std::string all;
    for (const auto& s : sections) all += (all.empty() ? "" : ", ") + s;
    throw ConfigError("nodeemu keys", section,
                      "no such section" +
                          (near.empty() ? std::string() : "; did you mean '" + near + "'?") +
                          " The sections are " + all);
  }
  // Columns: the key, its type, its default (long defaults push their line's text along).
  std::size_t width = 0, default_width = 0;
  for (const auto& k : recipe_schema()) {
    width = std::max(width, k.key.size());
    default_width = std::max(default_width, std::min<std::size_t>(12, k.default_yaml.size()));
  }
  const auto pad = [](std::string s, std::size_t w) {
    return s.size() < w ? s + std::string(w - s.size(), ' ') : s;
  };
  for (const auto& k : recipe_schema()) {
    if (one_key ? k.key != section : !section.empty() && section_of(k.key) != section) continue;
    const std::string line = pad(k.key, width + 2) + pad(names_of(k.type).column, 10) +
                             pad(k.default_yaml.empty() ? "unset" : k.default_yaml, default_width);
    out << line << "  " << k.help;
    if (!k.choices.empty()) {
      out << " {";
      for (std::size_t i = 0; i < k.choices.size(); ++i) out << (i ? ", " : "") << k.choices[i];
      out << "}";
    }
    out << "\n";
  }
  return 0;
}

}  // namespace

detail::CommandBody detail::add_keys(CLI::App& app, Streams io) {
  auto section = std::make_shared<std::string>();
  app.add_option("section", *section,
                 "only this section's keys (model, train, comm_overlap, ...), or one key "
                 "(model.moe_router_topk)")
      ->type_name("SECTION|KEY");
  return [section, &out = io.out] { return keys(*section, out); };
}

}  // namespace nodeemu::emu
