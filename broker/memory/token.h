// Export tokens: 128 random bits in printable form, made only by the broker.
#pragma once

#include <string>

#include "membroker/status.h"

namespace membroker::broker {

// 32 lowercase hex digits; getrandom failing is an error, never a spin.
Result<std::string> RandomToken();

}  // namespace membroker::broker
