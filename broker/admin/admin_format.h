// How admin replies look: a Record is an ordered list of fields, rendered as
// "key: value" lines, as one row of an aligned table, or as JSON. Strings are
// escaped in every form (ipc::EscapeText, JsonString): a client's name cannot
// add a row or a line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace membroker::broker {

std::string JsonString(const std::string& s);

class Record {
 public:
  Record& Num(const char* key, uint64_t v) { return Add(key, std::to_string(v), false); }
  Record& Str(const char* key, const std::string& v) { return Add(key, v, true); }
  Record& Bool(const char* key, bool v) { return Add(key, v ? "true" : "false", false); }
  // A moment, in seconds since the epoch: that number in JSON, ISO 8601 UTC
  // ("2026-12-02T19:40:00Z") in text.
  Record& Time(const char* key, int64_t seconds) {
    fields_.push_back({key, std::to_string(seconds), false, true});
    return *this;
  }

  std::string Json() const;
  std::string Lines() const;  // "key: value\n" per field

  struct Field {
    std::string key, value;
    bool quoted;  // a string, perhaps from a client: escaped in text output
    bool time = false;  // seconds since the epoch, ISO 8601 in text output
    std::string Text() const;
  };
  const std::vector<Field>& fields() const { return fields_; }

 private:
  Record& Add(const char* key, std::string v, bool quoted) {
    fields_.push_back({key, std::move(v), quoted});
    return *this;
  }
  std::vector<Field> fields_;
};

// A JSON array, or an aligned table with a header row ("empty" when no rows).
std::string RenderTable(const std::vector<Record>& rows, bool json, const char* empty);
// One record: JSON object or "key: value" lines.
std::string RenderRecord(const Record& r, bool json);
// A one-line error: {"error": "..."} or "error: ...".
std::string RenderError(const std::string& message, bool json);

}  // namespace membroker::broker
