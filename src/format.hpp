// format.hpp: number formatting shared by reports and messages.
#pragma once

#include <string>

namespace numalign::detail {

// Readable: up to 4 significant digits, scientific outside [1e-3, 1e5); "nan", "inf".
std::string format_number(double v);
// Shortest text that reads back as the same double (JSON); "null" for NaN and inf.
std::string json_number(double v);

}  // namespace numalign::detail
