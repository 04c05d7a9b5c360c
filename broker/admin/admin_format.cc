#include "admin/admin_format.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "membroker/ipc/escape.h"

namespace membroker::broker {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string Record::Json() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += JsonString(fields_[i].key) + ": " +
           (fields_[i].quoted ? JsonString(fields_[i].value) : fields_[i].value);
  }
  return out + "}";
}

std::string Record::Lines() const {
  std::string out;
  for (const auto& f : fields_) out += f.key + ": " + f.Text() + "\n";
  return out;
}

std::string RenderTable(const std::vector<Record>& rows, bool json, const char* empty) {
  if (json) {
    std::string out = "[";
    for (size_t i = 0; i < rows.size(); ++i) out += (i ? ",\n " : "") + rows[i].Json();
    return out + "]\n";
  }
  if (rows.empty()) return std::string(empty) + "\n";
  const auto& head = rows[0].fields();
  std::vector<size_t> width(head.size());
  for (size_t c = 0; c < head.size(); ++c) width[c] = head[c].key.size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.fields().size() && c < width.size(); ++c)
      width[c] = std::max(width[c], r.fields()[c].Text().size());
  auto line = [&](auto cell) {
    std::string out;
    for (size_t c = 0; c < width.size(); ++c) {
      std::string v = cell(c);
      out += v;
      if (c + 1 < width.size()) out += std::string(width[c] - v.size() + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line([&](size_t c) {
    std::string k = head[c].key;
    std::transform(k.begin(), k.end(), k.begin(), ::toupper);
    return k;
  });
  for (const auto& r : rows)
    out += line([&](size_t c) { return c < r.fields().size() ? r.fields()[c].Text() : ""; });
  return out;
}

std::string RenderRecord(const Record& r, bool json) { return json ? r.Json() + "\n" : r.Lines(); }

std::string RenderError(const std::string& message, bool json) {
  return json ? "{\"error\": " + JsonString(message) + "}\n" : "error: " + ipc::EscapeText(message) + "\n";
}

}  // namespace membroker::broker

namespace membroker::broker {

std::string Record::Field::Text() const {
  if (time) {
    const time_t t = static_cast<time_t>(std::strtoll(value.c_str(), nullptr, 10));
    tm utc{};
    char out[32];
    if (gmtime_r(&t, &utc) != nullptr && std::strftime(out, sizeof(out), "%Y-%m-%dT%H:%M:%SZ", &utc) > 0) return out;
    return value;
  }
  return quoted ? ipc::EscapeText(value) : value;
}

}  // namespace membroker::broker
