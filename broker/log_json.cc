#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include "log.h"

namespace membroker::broker {
namespace {

bool IsKeyChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

int HexValue(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                                                     : (std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
}

// An EscapeText'ed string (printable ASCII with \\ \" \n \r \t \xNN) as the
// inside of a JSON string. Only \xNN differs: a run of them that is UTF-8
// (a client's name in another script) goes in as those characters, anything
// else as \u00NN each.
void AppendEscapedAsJson(std::string_view s, std::string& out) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x') {
      std::string bytes;
      for (; i + 3 < s.size() && s[i] == '\\' && s[i + 1] == 'x'; i += 4)
        bytes += static_cast<char>(HexValue(s[i + 2]) * 16 + HexValue(s[i + 3]));
      --i;
      const bool all_high = std::all_of(bytes.begin(), bytes.end(), [](char b) { return (b & 0x80) != 0; });
      if (all_high && ipc::IsValidUtf8(bytes)) {  // no control byte can be in such a run
        out += bytes;
      } else {
        static const char kHex[] = "0123456789abcdef";
        for (unsigned char b : bytes) {
          out += "\\u00";
          out += kHex[b >> 4];
          out += kHex[b & 15];
        }
      }
    } else if (s[i] == '\\' && i + 1 < s.size()) {
      out += s.substr(i, 2);
      ++i;
    } else if (s[i] == '\\') {
      out += "\\\\";  // a lone backslash at the end
    } else {
      out += s[i];
    }
  }
}

// Unquoted text: quotes and backslashes escaped, \xNN (the logger's guard
// against control bytes) as \u00NN.
void AppendPlainAsJson(std::string_view s, std::string& out) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x' && std::isxdigit(static_cast<unsigned char>(s[i + 2])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 3]))) {
      out += "\\u00";
      out += s.substr(i + 2, 2);
      i += 3;
    } else if (s[i] == '"' || s[i] == '\\') {
      out += '\\';
      out += s[i];
    } else {
      out += s[i];
    }
  }
}

bool IsNumber(std::string_view v) {
  size_t i = v.starts_with('-') ? 1 : 0;
  if (i == v.size() || v.size() - i > 18 || (v[i] == '0' && v.size() - i > 1)) return false;
  for (; i < v.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(v[i]))) return false;
  return true;
}

}  // namespace

std::string LogBodyAsJsonFields(std::string_view body) {
  std::string fields, text;
  size_t i = 0;
  while (i < body.size()) {
    while (i < body.size() && body[i] == ' ') ++i;
    if (i == body.size()) break;
    size_t k = i;
    while (k < body.size() && IsKeyChar(body[k])) ++k;
    if (k > i && k < body.size() && body[k] == '=') {
      const std::string_view key = body.substr(i, k - i);
      size_t v = k + 1;
      fields += ",\"";
      fields += key;
      fields += "\":";
      if (v < body.size() && body[v] == '"') {  // a quoted, escaped value: up to the unescaped quote
        size_t e = v + 1;
        while (e < body.size() && body[e] != '"') e += body[e] == '\\' ? 2 : 1;
        fields += '"';
        AppendEscapedAsJson(body.substr(v + 1, std::min(e, body.size()) - v - 1), fields);
        fields += '"';
        i = std::min(e + 1, body.size());
      } else {
        size_t e = v;
        while (e < body.size() && body[e] != ' ') ++e;
        const std::string_view value = body.substr(v, e - v);
        if (IsNumber(value)) {
          fields += value;
        } else {
          fields += '"';
          AppendPlainAsJson(value, fields);
          fields += '"';
        }
        i = e;
      }
      continue;
    }
    // Words that are not key=value (a sentence after the fields) form "text".
    size_t e = i;
    while (e < body.size() && body[e] != ' ') ++e;
    text += (text.empty() ? "" : " ") + std::string(body.substr(i, e - i));
    i = e;
  }
  if (!text.empty()) {
    fields += ",\"text\":\"";
    AppendPlainAsJson(text, fields);
    fields += '"';
  }
  return fields;
}

}  // namespace membroker::broker
