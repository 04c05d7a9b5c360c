// Structured log lines on stderr, one event per line:
//   membrokerd 2026-11-29T22:10:32.123Z info disconnect client=3 reason=crash released=4
// Levels: 0 error, 1 warn, 2 info, 3 debug (--log-level).
// Strings from clients go in as LogText(s) inside quotes (key="%s"), so a quote
// or a newline in a client's name cannot forge a field or a line; as a second
// guard, LogLine turns any control byte left in the line into \xNN.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>

#include "membroker/ipc/escape.h"

namespace membroker::broker {

inline int g_log_level = 2;
// The levels' names, by number (--log-level, the log lines, admin `config`).
inline constexpr const char* kLogLevelNames[] = {"error", "warn", "info", "debug"};
// The first word of each line: "membrokerd", or "membrokerd-keeper" for --supervise's keeper.
inline const char* g_log_program = "membrokerd";
// --log-format json: one JSON object per line, for log shippers:
//   {"ts":"2026-11-29T22:10:32.123Z","program":"membrokerd","level":"info","event":"disconnect","client":3,...}
// key=value fields become members (numbers stay numbers), a quoted value a
// string with its escapes (\xNN as \u00NN), other words "text".
inline bool g_log_json = false;
// The body "client=3 name=\"a\" done" as ',"client":3,"name":"a","text":"done"'.
std::string LogBodyAsJsonFields(std::string_view body);

inline void LogLine(int level, const char* event, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

inline void LogLine(int level, const char* event, const char* fmt, ...) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &utc);
  char body[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  const std::string line = ipc::EscapeControlBytes(body);
  if (g_log_json) {
    std::fprintf(stderr, "{\"ts\":\"%s.%03ldZ\",\"program\":\"%s\",\"level\":\"%s\",\"event\":\"%s\"%s}\n", when,
                 ts.tv_nsec / 1000000L, g_log_program, kLogLevelNames[level], event, LogBodyAsJsonFields(line).c_str());
    return;
  }
  std::fprintf(stderr, "%s %s.%03ldZ %s %s %s\n", g_log_program, when, ts.tv_nsec / 1000000L, kLogLevelNames[level],
               event, line.c_str());
}

// A client's string, escaped for a quoted log field.
inline std::string LogText(std::string_view s) { return ipc::EscapeText(s); }

}  // namespace membroker::broker

#define MB_LOG_AT(level, event, ...)                                              \
  do {                                                                            \
    if ((level) <= ::membroker::broker::g_log_level)                              \
      ::membroker::broker::LogLine((level), (event), __VA_ARGS__);               \
  } while (0)
#define MB_ERROR(event, ...) MB_LOG_AT(0, event, __VA_ARGS__)
#define MB_WARN(event, ...) MB_LOG_AT(1, event, __VA_ARGS__)
#define MB_INFO(event, ...) MB_LOG_AT(2, event, __VA_ARGS__)
#define MB_DEBUG(event, ...) MB_LOG_AT(3, event, __VA_ARGS__)
