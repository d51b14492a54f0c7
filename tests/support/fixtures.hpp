#pragma once
// Reads the reference traces in tests/fixtures/ (format: tests/fixtures/README.md): records of
// a header line "<keyword> <key> <value> ... lines <L>" followed by L data lines.
//
//   for (const auto& r : test_support::read_fixture("lr_schedules.txt"))
//     if (r.keyword == "schedule") use(r.text("name"), r.number("base_lr"), r.row(0));
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef TRIDENT_FIXTURES
#error "define TRIDENT_FIXTURES to the tests/fixtures directory"
#endif

namespace test_support {

struct fixture_record {
  std::string keyword;
  std::map<std::string, std::string> fields;
  std::vector<std::string> lines;

  bool has(const std::string& key) const { return fields.count(key) != 0; }
  const std::string& text(const std::string& key) const {
    auto it = fields.find(key);
    if (it == fields.end()) throw std::runtime_error("fixture record '" + keyword + "' has no field '" + key + "'");
    return it->second;
  }
  //! strtod, which (unlike istream >> double) reads "inf" too.
  double number(const std::string& key) const { return std::strtod(text(key).c_str(), nullptr); }
  long long integer(const std::string& key) const { return std::atoll(text(key).c_str()); }
  //! The numbers of data line i.
  std::vector<double> row(std::size_t i) const {
    std::vector<double> out;
    std::istringstream in(lines.at(i));
    std::string token;
    while (in >> token) out.push_back(std::strtod(token.c_str(), nullptr));
    return out;
  }
};

inline std::vector<fixture_record> read_fixture(const std::string& file) {
  const std::string path = std::string(TRIDENT_FIXTURES) + "/" + file;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open fixture " + path);
  std::vector<fixture_record> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream header(line);
    fixture_record r;
    header >> r.keyword;
    std::string key, value;
    while (header >> key >> value) r.fields[key] = value;
    const long long count = r.integer("lines");
    for (long long i = 0; i < count; ++i) {
      if (!std::getline(in, line)) throw std::runtime_error(path + ": record '" + r.keyword + "' is truncated");
      r.lines.push_back(line);
    }
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace test_support
