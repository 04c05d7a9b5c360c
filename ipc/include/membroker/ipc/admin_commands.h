// The admin commands: one table that the broker's dispatch, its `help` text and
// membrokerctl (usage, per-command --help, argument checks) all read, so the
// CLI and the broker cannot drift apart. A command joins in one place here; the
// broker's switch over AdminCommandId (no default) then fails to compile until
// it handles it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "membroker/status.h"

namespace membroker::ipc {

enum class AdminCommandId {
  kStats,
  kMetrics,
  kListClients,
  kListAllocations,
  kListPools,
  kListQuotas,
  kListEngines,
  kListNames,
  kListChannels,
  kListStores,
  kListHosts,
  kListClusterNames,
  kShowClient,
  kShowAllocation,
  kKickClient,
  kFreeAllocation,
  kUnpublish,
  kConfig,
  kCheck,
  kHelp,
};

enum class AdminArg { kNone, kId, kName };

struct AdminCommand {
  AdminCommandId id;
  std::string_view words;    // what the user types before the argument
  AdminArg arg;
  bool has_json;             // answers --json
  std::string_view summary;  // one line, for the help lists
  std::string_view details;  // membrokerctl COMMAND --help
  // A list's columns, in order (its records' keys; docs/OPERATIONS.md shows
  // them, `help` prints them); empty for the other commands.
  std::string_view columns = {};
};

// Every command, in the order the help lists them.
std::span<const AdminCommand> AdminCommands();

// "ID", "NAME" or "".
std::string_view AdminArgName(AdminArg arg);
// "show client ID", "stats".
std::string AdminUsage(const AdminCommand& c);

// A parsed command line: which command, its argument, and --json.
struct AdminRequest {
  const AdminCommand* command = nullptr;
  std::string arg;    // the NAME or the ID as typed
  uint64_t id = 0;    // the ID, parsed
  bool json = false;
};

// Parses "list clients --json", "show client 7", "unpublish pipeline/ring1".
// PARAM_INVALID with a one-line reason for an unknown command, a missing,
// extra or malformed argument, or --json on a command without a JSON form.
Result<AdminRequest> ParseAdminLine(std::string_view line);

// The command a line starts with, arguments or not ("kick client" finds
// kick client ID); nullptr if none. For per-command help.
const AdminCommand* FindAdminCommand(std::string_view line);

// The command list the broker's `help` answers and membrokerctl --help prints.
std::string AdminHelpText();

}  // namespace membroker::ipc
