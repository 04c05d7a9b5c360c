// Sizes as operators write them: "4096", "64K", "2M", "8G", "1T", "0x4000..".
#pragma once

#include <cstdint>
#include <string>

namespace membroker::broker {

// Parses a number (decimal or 0x hex) with an optional K/M/G/T suffix (powers
// of 1024). False on anything else or on overflow.
bool ParseSize(const std::string& text, uint64_t* out);

// Parses a plain decimal number: milliseconds, counts, fd numbers, uids and
// gids, where "1K" would be a mistake rather than 1024. False on anything
// else or on overflow.
bool ParseCount(const std::string& text, uint64_t* out);

}  // namespace membroker::broker
