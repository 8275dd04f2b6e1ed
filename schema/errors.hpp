// The root of the typed exceptions that NodeEmu throws at its API boundaries, and ConfigError.
// They live in this bottom target because the schema walker throws ConfigError; the rest of the
// hierarchy (devices/errors.hpp) derives from Error. Every message is one line that names the
// file, key, device or operation involved and says what to do about it.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace nodeemu {

// Base of everything NodeEmu throws on purpose; catch this to report any NodeEmu failure.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration file or key: "<file>: <key>: <what is wrong and what to set>".
class ConfigError : public Error {
 public:
  ConfigError(std::string file, std::string key, const std::string& what)
      : Error(file + ": " + key + ": " + what),
        file_(std::move(file)),
        key_(std::move(key)),
        detail_(what) {}
  const std::string& file() const { return file_; }
  const std::string& key() const { return key_; }
  const std::string& detail() const { return detail_; }  // what is wrong, without file and key

 private:
  std::string file_;
  std::string key_;
  std::string detail_;
};

}  // namespace nodeemu
