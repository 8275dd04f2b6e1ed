#include "devices/detail/csv_table.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "devices/errors.hpp"

namespace nodeemu::detail {

namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    std::size_t comma = line.find(',', start);
    std::string cell = line.substr(start, comma == std::string::npos ? comma : comma - start);
    // Spaces around a value are layout, not data.
    const auto first = cell.find_first_not_of(" \t");
    const auto last = cell.find_last_not_of(" \t");
    out.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string shown(const std::string& s) {
  return s.size() > 40 ? "'" + s.substr(0, 37) + "...'" : "'" + s + "'";
}

}  // namespace

CsvTable CsvTable::parse(const std::string& text, const std::string& file) {
  CsvTable t;
  t.file_ = file;
  std::size_t pos = 0;
  int line_no = 0;
  while (pos <= text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? nl : nl - pos);
    pos = nl == std::string::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    if (t.header_.empty()) {
      t.header_ = split(line);
      for (std::size_t i = 0; i < t.header_.size(); ++i) {
        if (t.header_[i].empty())
          throw ConfigError(file, "header (line " + std::to_string(line_no) + ")",
                            "column " + std::to_string(i + 1) + " has no name");
        for (std::size_t j = 0; j < i; ++j)
          if (t.header_[j] == t.header_[i])
            throw ConfigError(file, "header (line " + std::to_string(line_no) + ")",
                              "column '" + t.header_[i] + "' appears twice; keep one");
      }
      continue;
    }
    auto cells = split(line);
    if (cells.size() != t.header_.size())
      throw ConfigError(
          file,
          "row " + std::to_string(t.cells_.size() + 1) + " (line " + std::to_string(line_no) + ")",
          "has " + std::to_string(cells.size()) + " fields but the header has " +
              std::to_string(t.header_.size()) + "; give one value per column");
    t.cells_.push_back(std::move(cells));
    t.lines_.push_back(line_no);
  }
  if (t.header_.empty())
    throw ConfigError(file, "header", "the file is empty; a table starts with a header line");
  if (t.cells_.empty()) throw ConfigError(file, "rows", "the table has a header but no rows");
  return t;
}

int CsvTable::index(const std::string& column) const {
  for (std::size_t i = 0; i < header_.size(); ++i)
    if (header_[i] == column) return static_cast<int>(i);
  return -1;
}

void CsvTable::require(const std::vector<std::string>& columns) const {
  for (const auto& c : columns) {
    if (has(c)) continue;
    std::string have;
    for (const auto& h : header_) have += (have.empty() ? "" : ",") + h;
    throw ConfigError(file_, "column '" + c + "'",
                      "missing; the header is '" + have + "', add a '" + c + "' column");
  }
}

std::string CsvTable::where(std::size_t row) const {
  return "row " + std::to_string(row + 1) + " (line " + std::to_string(lines_[row]) + ")";
}

void CsvTable::fail(std::size_t row, const std::string& column, const std::string& what) const {
  throw ConfigError(file_, where(row) + ", column '" + column + "'", what);
}

const std::string& CsvTable::text(std::size_t row, const std::string& column) const {
  const int i = index(column);
  if (i < 0) require({column});
  return cells_[row][static_cast<std::size_t>(i)];
}

void CsvTable::set_number(std::size_t row, const std::string& column, double v) {
  const int i = index(column);
  if (i < 0) require({column});
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6e", v);
  cells_[row][static_cast<std::size_t>(i)] = buf;
}

std::string CsvTable::to_csv() const {
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) out += (i ? "," : "") + cells[i];
    out += "\n";
  };
  line(header_);
  for (const auto& r : cells_) line(r);
  return out;
}

std::optional<double> CsvTable::optional_number(std::size_t row, const std::string& column,
                                                bool positive) const {
  const std::string& s = text(row, column);
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v))
    fail(row, column, "expected a number, got " + shown(s));
  if (positive ? v <= 0 : v < 0)
    fail(row, column, std::string("must be ") + (positive ? "> 0" : ">= 0") + ", got " + shown(s));
  return v;
}

double CsvTable::number(std::size_t row, const std::string& column, bool positive) const {
  auto v = optional_number(row, column, positive);
  if (!v) fail(row, column, "is empty; give a number");
  return *v;
}

long long CsvTable::count(std::size_t row, const std::string& column) const {
  const std::string& s = text(row, column);
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 1)
    fail(row, column, "expected a whole number >= 1, got " + shown(s));
  return v;
}

}  // namespace nodeemu::detail
