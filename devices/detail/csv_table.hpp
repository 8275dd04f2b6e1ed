// Internal: a measured table as read from a profile's CSV file. Reading is strict, as the
// topology's is: every problem is a ConfigError naming the file, the row and the column, with what
// to do ("gemm_bf16.csv: row 17 (line 18), column 'seconds': must be > 0, got '-1e-6'").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace nodeemu::detail {

class CsvTable {
 public:
  // `file` names the table in messages. Throws ConfigError for a missing header, a duplicated
  // column or a row with the wrong number of fields.
  static CsvTable parse(const std::string& text, const std::string& file);

  const std::string& file() const { return file_; }
  std::size_t rows() const { return cells_.size(); }
  const std::vector<std::string>& header() const { return header_; }
  bool has(const std::string& column) const { return index(column) >= 0; }
  // Throws ConfigError naming the first missing column and the columns the table has.
  void require(const std::vector<std::string>& columns) const;

  const std::string& text(std::size_t row, const std::string& column) const;
  bool empty(std::size_t row, const std::string& column) const { return text(row, column).empty(); }
  // A finite number, > 0 (`positive`) or >= 0; throws ConfigError naming row and column.
  double number(std::size_t row, const std::string& column, bool positive = true) const;
  std::optional<double> optional_number(std::size_t row, const std::string& column,
                                        bool positive = true) const;
  // A whole number >= 1.
  long long count(std::size_t row, const std::string& column) const;
  // Replaces a cell with a number (a derived profile scales the measured times).
  void set_number(std::size_t row, const std::string& column, double v);
  // The table as CSV text again.
  std::string to_csv() const;
  // "row 17 (line 18)": how messages name a data row.
  std::string where(std::size_t row) const;
  [[noreturn]] void fail(std::size_t row, const std::string& column, const std::string& what) const;

 private:
  int index(const std::string& column) const;
  std::string file_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> cells_;
  std::vector<int> lines_;  // the file line of each row
};

}  // namespace nodeemu::detail
