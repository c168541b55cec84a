// format.hpp: number formatting shared by reports and messages.
#pragma once

#include <string>

namespace numalign::detail {

// Readable: up to 4 significant digits, scientific outside [1e-3, 1e5); "nan", "inf".
std::string format_number(double v);
// Shortest text that reads back as the same double (JSON); "null" for NaN and inf.
std::string json_number(double v);
// Text for XML and HTML: & < > " ' as entities, control characters (but tab, newline, CR)
// as \xNN.
std::string markup_escape(const std::string& s);

}  // namespace numalign::detail
