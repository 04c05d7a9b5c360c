// Strings that come from clients (names, tokens, commands) are data: before one
// goes into a log line or a text table it is escaped, so a newline or a
// terminal control sequence in a client's name cannot forge a log line or
// redraw an operator's terminal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "membroker/status.h"

namespace membroker::ipc {

// Printable ASCII stays as it is, except '\\' and '"' (escaped with a
// backslash); \n, \r and \t become those two-character escapes; every other
// byte becomes \xNN. The result is one line of printable ASCII.
std::string EscapeText(std::string_view s);

// Only the control bytes (below 0x20, and 0x7f) become \xNN; everything else
// stays, quotes included. The logger's last guard: a line stays one line.
std::string EscapeControlBytes(std::string_view s);

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF): flatbuffers strings must be, and JSON needs it.
bool IsValidUtf8(std::string_view s);

// An address or other number as messages show it: "0x7f0000001000".
std::string Hex(uint64_t v);

// The rule for names (client, engine, named object, notify names): 1 to
// max_bytes bytes of UTF-8 without control characters. PARAM_INVALID naming
// `what` otherwise. Checked by the client library before sending and by the
// broker on receipt.
Status CheckName(std::string_view name, size_t max_bytes, std::string_view what);

}  // namespace membroker::ipc
