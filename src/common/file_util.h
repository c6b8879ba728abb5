// Whole-file reads and writes with Status errors.
#pragma once

#include <string>
#include <string_view>

#include "distca/status.h"

namespace distca {

Status ReadTextFile(const std::string& path, std::string* contents);
Status WriteTextFile(const std::string& path, std::string_view contents);

}  // namespace distca
