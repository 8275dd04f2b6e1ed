#include "emu/detail/case_runs.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <streambuf>
#include <thread>

#include "emu/recipe_keys.hpp"
#include "layers/meta_routing.hpp"

namespace nodeemu::emu::detail {

namespace {

// A case's progress while others run too: whole lines, each prefixed with the case's name and
// written under one lock, so that lines from different cases never interleave mid-line.
class PrefixedLines final : public std::streambuf {
 public:
  PrefixedLines(std::ostream& to, std::mutex& mu, std::string prefix)
      : to_(to), mu_(mu), prefix_(std::move(prefix)) {}
  ~PrefixedLines() override {
    if (!line_.empty()) flush_line();
  }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    // A carriage return would rewrite another case's line in place: a line ends there too.
    if (ch == '\n' || ch == '\r') {
      flush_line();
    } else {
      line_.push_back(ch);
    }
    return c;
  }

 private:
  void flush_line() {
    std::lock_guard<std::mutex> lock(mu_);
    to_ << prefix_ << line_ << '\n';
    to_.flush();
    line_.clear();
  }
  std::ostream& to_;
  std::mutex& mu_;
  std::string prefix_, line_;
};

}  // namespace

int default_case_jobs(const std::vector<NamedRecipe>& cases) {
  const bool all_meta = std::all_of(cases.begin(), cases.end(), [](const NamedRecipe& c) {
    return c.recipe.text(key::emulator_mode) == "meta";
  });
  if (!all_meta) return 1;
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  return std::max(1, std::min(cores, int(cases.size())));
}

std::vector<RunReport> train_cases(const std::vector<NamedRecipe>& cases,
                                   const TrainOptions& options, int jobs) {
  // Cases with the same routing draw each group once, whether they run at once or one after
  // another (layers/meta_routing.hpp).
  const layers::MetaRouting::SharingScope share_routing;
  std::vector<RunReport> reports;
  if (jobs <= 1 || cases.size() <= 1) {
    for (const NamedRecipe& c : cases) {
      if (options.progress) *options.progress << "case " << c.name << ":\n";
      reports.push_back(train(c.recipe, options));
    }
    return reports;
  }
  std::vector<std::optional<RunReport>> done(cases.size());
  std::vector<std::exception_ptr> failed(cases.size());
  std::atomic<std::size_t> next{0};
  std::mutex progress_mu;
  const auto worker = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < cases.size();) {
      TrainOptions o = options;
      o.progress_terminal = false;
      std::optional<PrefixedLines> lines;
      std::optional<std::ostream> progress;
      if (options.progress) {
        lines.emplace(*options.progress, progress_mu, "case " + cases[i].name + ": ");
        progress.emplace(&*lines);
        o.progress = &*progress;
      }
      try {
        done[i] = train(cases[i].recipe, o);
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  const std::size_t n = std::min(cases.size(), std::size_t(jobs));
  for (std::size_t t = 0; t < n; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < cases.size(); ++i)
    if (failed[i]) std::rethrow_exception(failed[i]);
  for (auto& r : done) reports.push_back(std::move(*r));
  return reports;
}

}  // namespace nodeemu::emu::detail
