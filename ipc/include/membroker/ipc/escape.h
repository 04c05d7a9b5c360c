// Strings that come from clients (names, tokens, commands) are data: before one
// goes into a log line or a text table it is escaped, so a newline or a
// terminal control sequence in a client's name cannot forge a log line or
// redraw an operator's terminal.
#pragma once

#include <string>
#include <string_view>

namespace membroker::ipc {

// Printable ASCII stays as it is, except '\\' and '"' (escaped with a
// backslash); \n, \r and \t become those two-character escapes; every other
// byte becomes \xNN. The result is one line of printable ASCII.
std::string EscapeText(std::string_view s);

}  // namespace membroker::ipc
